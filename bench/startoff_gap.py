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
  python3 bench/startoff_gap.py --pair /tmp/specpilot-pair --out bench/results/startoff-gap-pair.json
Off a GPU it runs uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specpilot.bench.decode_models import add_model_arguments, decode_models
from specpilot.bench.environment import environment
from specpilot.bench.phase_clock import PHASES, PhaseClock, one_call
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
    ap.add_argument("--pairs", type=int, default=10, help="interleaved whole-call rounds")
    ap.add_argument("--split-pairs", type=int, default=5, help="interleaved split rounds")
    ap.add_argument("--extra-slots", type=int, default=8,
                    help="cache slots the last decoder (plain AR) has more (0: no such decoder)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if min(args.pairs, args.split_pairs, args.batch, args.new_tokens) < 1:
        ap.error("--pairs, --split-pairs, --batch and --new-tokens must be at least 1")
    if args.extra_slots < 0:
        ap.error("--extra-slots must be at least 0")

    try:
        target, drafter, prompts, eos, graphs = decode_models(args, args.batch)
    except SpecPilotError as exc:
        ap.error(str(exc))
    capacity = max(len(p) for p in prompts) + args.new_tokens + 2 * args.k + 2
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
    adaptive = [name for name, dec in decoders.items() if dec.policy is not None]
    for name, dec in decoders.items():     # the adaptive ones learn the workload
        for _ in range(3):
            r = dec.generate(prompts, args.new_tokens)
        print(f"{name}: last warm-up rounds {dict(r.stats)}", flush=True)
    whole = {name: [] for name in decoders}
    split = {name: [] for name in decoders}
    started_off = {name: [] for name in adaptive}      # per timed call, in order
    for calls, clock in ((whole, None), (split, PhaseClock())):
        for _ in range(args.pairs if clock is None else args.split_pairs):
            for name, dec in decoders.items():
                seconds, phases = one_call(dec, prompts, args.new_tokens, clock)
                calls[name].append(seconds if clock is None else phases)
                if name in started_off:
                    started_off[name].append(dec.first_length == 0)
    rows = []
    for name in decoders:
        med, mean = statistics.median(whole[name]), statistics.fmean(whole[name])
        phases = {p: statistics.median(s[p] for s in split[name]) * 1e3 for p in PHASES}
        rows.append({"system": name, "call_ms_median": med * 1e3, "call_ms_mean": mean * 1e3,
                     "call_ms": [t * 1e3 for t in whole[name]], "phase_ms_median": phases,
                     **({"calls_started_off": started_off[name]} if name in started_off
                        else {})})
        print(f"{name:20s} call {med * 1e3:8.2f} ms (mean {mean * 1e3:8.2f})  " +
              "  ".join(f"{p} {v:7.2f} ms" for p, v in phases.items()), flush=True)
    plain = rows[0]
    # tokens/s ratios where every decoder makes the same tokens: always with random weights;
    # on a trained pair in bf16 a near-tie may flip a token between decoders
    for row in rows:
        row["x_plain_ar"] = plain["call_ms_median"] / row["call_ms_median"]
        row["x_plain_ar_mean"] = plain["call_ms_mean"] / row["call_ms_mean"]
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
