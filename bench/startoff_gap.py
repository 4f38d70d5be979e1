"""Where a started-off adaptive batch loses to plain AR, if it does: the decoders timed
interleaved (A, B, C, A, B, C, ...) on random-weight shape presets, whole calls, then split
into three phases with a device sync between them: the start (the call's checks, then reset,
the workload memory's decision and the prefill), the rounds (the replay loop) and the finish
(what is read back).

The adaptive decoder is given a useless drafter (random weights), so its workload memory
starts every batch after the first off: each of its steps then runs the plain step's
operators exactly (tests/runtime/test_graphed_off_step.py), and what is left of a gap is per
call or per cache slot. Both get the same capacity. A third decoder, plain AR with
`--extra-slots` more cache slots, prices the other candidate: in `specpilot bench` a
speculating Program's cache holds a round's span more than strong AR's (8 slots after
rounding), and every step's attention reads the whole cache.

  python3 bench/startoff_gap.py --out bench/results/startoff-gap.json
Off a GPU it runs uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import specpilot.runtime.graphed_chain as graphed_chain
from specpilot.bench.environment import environment
from specpilot.bench.shapes import random_pair
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.search.run_folder import write_json_atomic


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PhaseClock:
    """Splits `generate` calls into start / rounds / finish by wrapping the decoder's `_start`
    and the module's replay loop, with a sync after each (installed only while splitting)."""

    def __init__(self):
        self.marks = {}

    def install(self, decoder):
        self.marks = {}             # a wrapped call that did not fire must not read old marks
        start, loop = decoder._start, graphed_chain.replay_until_done

        def timed_start(*a, **k):
            out = start(*a, **k)
            _sync()
            self.marks["started"] = time.perf_counter()
            return out

        def timed_loop(*a, **k):
            out = loop(*a, **k)
            _sync()
            self.marks["looped"] = time.perf_counter()
            return out

        decoder._start = timed_start
        graphed_chain.replay_until_done = timed_loop
        return lambda: (delattr(decoder, "_start"),
                        setattr(graphed_chain, "replay_until_done", loop))


def one_call(decoder, prompts, new: int, clock=None):
    """Seconds of one call, and its phases where `clock` splits it."""
    restore = clock.install(decoder) if clock else None
    try:
        _sync()
        t0 = time.perf_counter()
        decoder.generate(prompts, new)
        _sync()
        t1 = time.perf_counter()
    finally:
        if restore:
            restore()
    if not clock:
        return t1 - t0, None
    m = clock.marks
    return t1 - t0, {"start": m["started"] - t0, "rounds": m["looped"] - m["started"],
                     "finish": t1 - m["looped"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=10, help="interleaved whole-call pairs")
    ap.add_argument("--split-pairs", type=int, default=5, help="interleaved split pairs")
    ap.add_argument("--extra-slots", type=int, default=8,
                    help="cache slots the third decoder (plain AR) has more (0: no third)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if min(args.pairs, args.split_pairs, args.batch, args.new_tokens) < 1:
        ap.error("--pairs, --split-pairs, --batch and --new-tokens must be at least 1")
    if args.extra_slots < 0:
        ap.error("--extra-slots must be at least 0")

    target, useless, graphs = random_pair(args.shapes, args.scale)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, target.config.vocab_size, (args.batch, args.prompt_len),
                            generator=gen).tolist()
    capacity = args.prompt_len + args.new_tokens + 2 * args.k + 2
    decoders = {
        "plain AR": GraphedChainDecoder(target, None, args.batch, capacity, 0, capture=graphs),
        "adaptive": GraphedChainDecoder(target, useless, args.batch, capacity, args.k,
                                        capture=graphs, adaptive=True),
    }
    if args.extra_slots:
        decoders[f"plain AR, +{args.extra_slots} slots"] = GraphedChainDecoder(
            target, None, args.batch, capacity + args.extra_slots, 0, capture=graphs)
    for name, dec in decoders.items():     # the adaptive one learns the workload: then off
        for _ in range(3):
            r = dec.generate(prompts, args.new_tokens)
        print(f"{name}: last warm-up rounds {dict(r.stats)}", flush=True)
    started_off = decoders["adaptive"].first_length == 0
    whole = {name: [] for name in decoders}
    split = {name: [] for name in decoders}
    for _ in range(args.pairs):
        for name, dec in decoders.items():
            whole[name].append(one_call(dec, prompts, args.new_tokens)[0])
    clock = PhaseClock()
    for _ in range(args.split_pairs):
        for name, dec in decoders.items():
            split[name].append(one_call(dec, prompts, args.new_tokens, clock)[1])
    rows = []
    for name in decoders:
        med = statistics.median(whole[name])
        phases = {p: statistics.median(s[p] for s in split[name]) * 1e3
                  for p in ("start", "rounds", "finish")}
        rows.append({"system": name, "call_ms_median": med * 1e3,
                     "call_ms": [t * 1e3 for t in whole[name]], "phase_ms_median": phases})
        print(f"{name:20s} call {med * 1e3:8.2f} ms  " +
              "  ".join(f"{p} {v:7.2f} ms" for p, v in phases.items()), flush=True)
    plain = rows[0]["call_ms_median"]
    for row in rows:
        row["x_plain_ar"] = plain / row["call_ms_median"]       # tokens/s ratio: same tokens
    print("  ".join(f"{r['system']} {r['x_plain_ar']:.4f}x" for r in rows[1:])
          + f" (adaptive started off: {started_off})", flush=True)
    doc = {"environment": environment(target.device.type), "settings": vars(args),
           "adaptive_started_off": started_off, "rows": rows}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
