"""Where a started-off adaptive batch loses to plain AR, if it does: the decoders timed
interleaved (A, B, C, A, B, C, ...), whole calls, then split into phases with a device sync
between them: the call's checks and the state reset, the workload memory's start decision, the
prefill, the first round's set-up, the rounds (the replay loop) and the finish (what is read
back). Medians say what a started-off call costs; means also count the calls where the memory
explores (speculates again to see whether the workload changed, runtime/workload_memory.py).

On random-weight shape presets the adaptive decoders (padded, and refill with no queue) get a
useless drafter, so their workload memory starts the batches off: each of their steps then runs
the plain step's operators exactly (tests/runtime/test_graphed_off_step.py), and what is left
of a gap is per call or per cache slot. With `--pair` they get the trained pair's drafter and
its workload's first `--batch` prompts, and start off only where the memory finds speculation
loses. Every decoder has the same capacity but the last, plain AR with `--extra-slots` more,
which prices the cache a speculating Program holds beyond strong AR's (a round's span, 8 slots
after rounding) that every step's attention reads.

  python3 bench/startoff_gap.py --out bench/results/startoff-gap.json
  python3 bench/startoff_gap.py --pair /tmp/specpilot-pair \\
      --out bench/results/startoff-gap-pair.json
Off a GPU it runs uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Dict, List

from specpilot.bench.decode_models import add_model_arguments, decode_models, decoder_capacity
from specpilot.bench.decoder_race import call_rows, interleaved_calls, warm_up
from specpilot.bench.environment import environment
from specpilot.bench.phase_clock import PHASES, PhaseClock
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.search.run_folder import write_json_atomic


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--calls", type=int, default=10,
                    help="interleaved rounds of whole calls (one call of every decoder each)")
    ap.add_argument("--split-calls", type=int, default=5,
                    help="interleaved rounds of calls split into phases")
    ap.add_argument("--extra-slots", type=int, default=8,
                    help="cache slots the last decoder (plain AR) has more (0: no such decoder)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if min(args.calls, args.split_calls, args.batch, args.new_tokens) < 1:
        ap.error("--calls, --split-calls, --batch and --new-tokens must be at least 1")
    if args.extra_slots < 0:
        ap.error("--extra-slots must be at least 0")

    try:
        target, drafter, prompts, eos, graphs = decode_models(args, args.batch)
    except SpecPilotError as exc:
        ap.error(str(exc))
    capacity = decoder_capacity(prompts, args.new_tokens, args.k)
    decoders = {
        "plain AR": GraphedChainDecoder(target, None, args.batch, capacity, 0, eos,
                                        capture=graphs),
        "adaptive": GraphedChainDecoder(target, drafter, args.batch, capacity, args.k, eos,
                                        capture=graphs, adaptive=True),
        "adaptive + refill": GraphedRefillDecoder(target, drafter, args.batch, capacity, args.k,
                                                  eos, capture=graphs, adaptive=True),
    }
    if args.extra_slots:
        decoders[f"plain AR, +{args.extra_slots} slots"] = GraphedChainDecoder(
            target, None, args.batch, capacity + args.extra_slots, 0, eos, capture=graphs)
    for name, results in warm_up(decoders, prompts, args.new_tokens, 3).items():
        print(f"{name}: last warm-up rounds {dict(results[-1].stats)}", flush=True)
    started_off: Dict[str, List[bool]] = {}       # per timed call, whole then split, in order
    whole = interleaved_calls(decoders, prompts, args.new_tokens, args.calls,
                              started_off=started_off)
    split = interleaved_calls(decoders, prompts, args.new_tokens, args.split_calls, PhaseClock(),
                              started_off)
    rows = call_rows(whole)
    for row in rows:
        name = row["system"]
        row["phase_ms_median"] = {p: statistics.median(s[p] for s in split[name]) * 1e3
                                  for p in PHASES}
        if name in started_off:
            row["calls_started_off"] = started_off[name]
        print(f"{name:20s} call {row['call_ms_median']:8.2f} ms (mean {row['call_ms_mean']:8.2f})"
              "  " + "  ".join(f"{p} {v:7.2f} ms" for p, v in row["phase_ms_median"].items()),
              flush=True)
    print("  ".join(f"{r['system']} {r['x_plain_ar']:.4f}x (mean {r['x_plain_ar_mean']:.4f}x)"
                    for r in rows[1:]), flush=True)
    for name, flags in started_off.items():
        print(f"{name}: {sum(flags)} of {len(flags)} timed calls started off", flush=True)
    doc = {"environment": environment(target.device.type), "settings": vars(args),
           "adaptive_started_off": {n: all(f) for n, f in started_off.items()}, "rows": rows}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
