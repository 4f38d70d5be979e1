"""What running the drafter in fused layer kernels (runtime/fused_forward.py) saves: its step
alone, each fixed chain's round, and whole calls of fixed and adaptive decoders.

Per batch size:

- one drafter step (T = 1) and one catch-up step (T = 2) captured in a CUDA graph and replayed
  (specpilot/bench/step_costs.py's `measure_forwards`, median of device times): ms per step,
  the model's own forward against the fused one;
- fixed chains chain(1..k) with either drafter, and plain AR, interleaved in whole calls split
  into phases (specpilot/bench/phase_clock.py): ms per round, and each call × plain AR;
- the adaptive decoder with either drafter (each measures its own round costs at its first
  call, so the length rule sees the cheaper rounds), raced in whole calls against plain AR.

  python3 bench/fused_drafter_race.py --pair /tmp/specpilot-pair \\
      --out bench/results/fused-drafter-race.json
Off a GPU it runs uncaptured in float32 with Triton's interpreter (to check the script, with
--scale).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.bench.decode_models import (add_model_arguments, decode_models,  # noqa: E402
                                           decoder_capacity, mid_run_context)
from specpilot.bench.decoder_race import (WARM_CALLS, add_race_arguments,  # noqa: E402
                                          call_rows, phase_race, race)
from specpilot.bench.environment import environment  # noqa: E402
from specpilot.bench.step_costs import measure_forwards, timed_runs  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fused_forward import FusedForward  # noqa: E402
from specpilot.runtime.graphed_chain import GraphedChainDecoder  # noqa: E402
from specpilot.search.run_folder import write_json_atomic  # noqa: E402

STEP_WARMUP, STEP_REPEATS = 3, 100     # replays of one captured drafter step


def fixed_race(args, target, drafters, plain, prompts, eos, graphs, capacity):
    """Plain AR (`plain`) and chain(1..k) with each drafter, interleaved in whole calls split
    into phases: per decoder, ms per round (its rounds phase over its rounds) and × plain AR.
    Returns (the rows, plain AR's warm-up calls)."""
    batch, new = len(prompts), args.new_tokens
    decoders = {"plain AR": plain}
    for name, drafter in drafters.items():
        for n in range(1, args.k + 1):
            decoders[f"chain({n}), {name} drafter"] = GraphedChainDecoder(
                target, drafter, batch, capacity, n, eos, capture=graphs)
    warm, phases, rounds, per_round = phase_race(decoders, prompts, new, args.calls)
    rows = call_rows({name: [sum(p.values()) for p in runs] for name, runs in phases.items()})
    for row in rows:
        name = row["system"]
        row["rounds"], row["ms_per_round"] = rounds[name], per_round[name]
        row["mean_accepted"] = warm[name][-1].mean_accepted
        print(f"batch {batch:3d} {name:28s} {row['x_plain_ar']:.4f}x  "
              f"{row['ms_per_round']:.3f} ms/round  {rounds[name]} rounds", flush=True)
    return rows, warm["plain AR"]


def adaptive_race(args, target, drafters, plain, plain_warm, prompts, eos, graphs, capacity):
    """Plain AR (warmed up already) and the adaptive decoder with each drafter, new (each
    measures its own round costs at its first call), in whole calls (decoder_race's `race`)."""
    batch = len(prompts)
    decoders = {"plain AR": plain}
    decoders.update({f"adaptive, {name} drafter": GraphedChainDecoder(
        target, drafter, batch, capacity, args.k, eos, capture=graphs, adaptive=True)
        for name, drafter in drafters.items()})
    rows = race(decoders, prompts, args.new_tokens, args.calls, WARM_CALLS,
                {"plain AR": plain_warm})
    for row in rows:
        off = row.get("calls_started_off")
        print(f"batch {batch:3d} {row['system']:28s} {row['x_plain_ar']:.4f}x"
              + (f"  started off {sum(off)} of {len(off)}  costs "
                 f"{[round(c, 3) for c in row['round_costs']]}" if off is not None else ""),
              flush=True)
    return rows


def one_batch(args, target, drafters, prompts, eos, graphs) -> dict:
    batch = len(prompts)
    capacity = decoder_capacity(prompts, args.new_tokens, args.k)
    context = mid_run_context(prompts, args.new_tokens)
    steps = {}
    for name, d in drafters.items():
        seconds = measure_forwards(d, batch, (1, 2), context, graphs,
                                   *timed_runs(graphs, STEP_WARMUP, STEP_REPEATS))
        steps[name] = {"step_ms": seconds[1] * 1e3, "catch_up_ms": seconds[2] * 1e3}
    for name, s in steps.items():
        print(f"batch {batch:3d} {name} drafter: step {s['step_ms']:.4f} ms, catch-up "
              f"{s['catch_up_ms']:.4f} ms", flush=True)
    plain = GraphedChainDecoder(target, None, batch, capacity, 0, eos, capture=graphs)
    fixed, plain_warm = fixed_race(args, target, drafters, plain, prompts, eos, graphs, capacity)
    return {"batch": batch, "capacity": capacity, "context": context, "drafter_steps": steps,
            "fixed": fixed,
            "adaptive": adaptive_race(args, target, drafters, plain, plain_warm, prompts, eos,
                                      graphs, capacity)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_race_arguments(ap, calls=6)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        target, drafter, prompts, eos, graphs = decode_models(args, max(args.batch_sizes))
        drafters = {"model": drafter, "fused": FusedForward(drafter)}
    except SpecPilotError as exc:
        ap.error(str(exc))
    results = []
    for b in args.batch_sizes:
        results.append(one_batch(args, target, drafters, prompts[:b], eos, graphs))
        # Written after every batch size: a run cut short keeps what it finished.
        write_json_atomic(Path(args.out), {"environment": environment(target.device.type),
                                           "settings": vars(args), "batches": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
