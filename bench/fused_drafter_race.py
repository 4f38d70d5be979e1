"""What running the drafter in fused layer kernels (runtime/fused_forward.py) saves: its step
alone, each fixed chain's round, and whole calls of fixed and adaptive decoders.

Per batch size:

- one drafter step (T = 1) and one catch-up step (T = 2, logits of the last row) captured in a
  CUDA graph and replayed: ms per step, the model's own forward against the fused one;
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
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.bench.decode_models import (add_model_arguments, decode_models,  # noqa: E402
                                           decoder_capacity)
from specpilot.bench.decoder_race import (add_race_arguments, call_rows,  # noqa: E402
                                          interleaved_calls, race_arguments_error, warm_up)
from specpilot.bench.environment import environment  # noqa: E402
from specpilot.bench.phase_clock import PhaseClock  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fused_forward import FusedForward  # noqa: E402
from specpilot.runtime.graphed_chain import GraphedChainDecoder  # noqa: E402
from specpilot.runtime.graphed_loop import rounds_run  # noqa: E402
from specpilot.search.run_folder import write_json_atomic  # noqa: E402

WARM_CALLS = 3      # before timing: capture, and (adaptive) the round costs and memory
STEP_REPLAYS = 200  # replays of one captured drafter step


def step_ms(drafter, batch: int, width: int, context: int, graphs: bool) -> float:
    """ms of one drafter forward of `width` tokens per row at `context` positions (logits of
    the last row only when width > 1, as a chain round's catch-up step), captured in a CUDA
    graph and replayed (eager off a GPU, a few calls)."""
    dev = drafter.device
    cache = drafter.new_cache(batch, context + width + 1)
    pos = (context + torch.arange(width, device=dev))[None, :].expand(batch, width).contiguous()
    tokens = torch.randint(0, drafter.config.vocab_size, (batch, width), device=dev)
    mask = torch.arange(cache.capacity, device=dev)[None, None, :] <= pos[:, :, None]
    last = torch.full((batch, 1), width - 1, dtype=torch.int64, device=dev) if width > 1 else None

    def step():
        drafter.forward(tokens, pos, pos, mask, cache, last)

    if not graphs:
        start = time.perf_counter()
        for _ in range(3):
            step()
        return (time.perf_counter() - start) / 3 * 1e3
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):              # compile, autotune, allocate outside the graph
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(STEP_REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / STEP_REPLAYS * 1e3)
    return statistics.median(times)


def fixed_race(args, target, drafters, prompts, eos, graphs, capacity) -> List[dict]:
    """Plain AR and chain(1..k) with each drafter, interleaved in whole calls split into
    phases: per decoder, ms per round (its rounds phase over its rounds) and × plain AR."""
    batch, new = len(prompts), args.new_tokens
    decoders = {"plain AR": GraphedChainDecoder(target, None, batch, capacity, 0, eos,
                                                capture=graphs)}
    for name, drafter in drafters.items():
        for n in range(1, args.k + 1):
            decoders[f"chain({n}), {name} drafter"] = GraphedChainDecoder(
                target, drafter, batch, capacity, n, eos, capture=graphs)
    warm = warm_up(decoders, prompts, new, WARM_CALLS)
    phases = interleaved_calls(decoders, prompts, new, args.calls, PhaseClock())
    rows = call_rows({name: [sum(p.values()) for p in runs] for name, runs in phases.items()})
    for row in rows:
        name = row["system"]
        rounds = rounds_run(warm[name][-1].stats)
        row["rounds"] = rounds
        row["ms_per_round"] = statistics.median(p["rounds"] for p in phases[name]) * 1e3 / rounds
        row["mean_accepted"] = warm[name][-1].mean_accepted
        print(f"batch {batch:3d} {name:28s} {row['x_plain_ar']:.4f}x  "
              f"{row['ms_per_round']:.3f} ms/round  {rounds} rounds", flush=True)
    return rows


def adaptive_race(args, target, drafters, prompts, eos, graphs, capacity) -> List[dict]:
    """Plain AR and the adaptive decoder with each drafter, new (each measures its own round
    costs at its first call), in whole calls: × plain AR and which calls started off."""
    batch, new = len(prompts), args.new_tokens
    decoders = {"plain AR": GraphedChainDecoder(target, None, batch, capacity, 0, eos,
                                                capture=graphs)}
    decoders.update({f"adaptive, {name} drafter": GraphedChainDecoder(
        target, drafter, batch, capacity, args.k, eos, capture=graphs, adaptive=True)
        for name, drafter in drafters.items()})
    warm = warm_up(decoders, prompts, new, WARM_CALLS)
    started_off: Dict[str, List[bool]] = {}
    rows = call_rows(interleaved_calls(decoders, prompts, new, args.calls,
                                       started_off=started_off))
    for row in rows:
        name = row["system"]
        row["warm_up_stats"] = [dict(r.stats) for r in warm[name]]
        if name in started_off:
            row["calls_started_off"] = started_off[name]
            row["round_costs"] = decoders[name].policy.round_cost_host.tolist()
        off = row.get("calls_started_off")
        print(f"batch {batch:3d} {name:28s} {row['x_plain_ar']:.4f}x"
              + (f"  started off {sum(off)} of {len(off)}" if off is not None else "")
              + (f"  costs {[round(c, 3) for c in row['round_costs']]}" if off is not None else ""),
              flush=True)
    return rows


def one_batch(args, target, drafters, prompts, eos, graphs) -> dict:
    batch = len(prompts)
    capacity = decoder_capacity(prompts, args.new_tokens, args.k)
    context = max(len(p) for p in prompts) + args.new_tokens // 2
    steps = {name: {"step_ms": step_ms(d, batch, 1, context, graphs),
                    "catch_up_ms": step_ms(d, batch, 2, context, graphs)}
             for name, d in drafters.items()}
    for name, s in steps.items():
        print(f"batch {batch:3d} {name} drafter: step {s['step_ms']:.4f} ms, catch-up "
              f"{s['catch_up_ms']:.4f} ms", flush=True)
    return {"batch": batch, "capacity": capacity, "context": context, "drafter_steps": steps,
            "fixed": fixed_race(args, target, drafters, prompts, eos, graphs, capacity),
            "adaptive": adaptive_race(args, target, drafters, prompts, eos, graphs, capacity)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_race_arguments(ap, calls=6)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if race_arguments_error(args):
        ap.error(race_arguments_error(args))
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
