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
import time
from pathlib import Path

import torch

import specpilot.runtime.graphed_chain as graphed_chain
from specpilot.bench.environment import environment
from specpilot.bench.shapes import random_pair
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.search.run_folder import write_json_atomic


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# Where a call is split: (what is wrapped, the mark set once it has returned and the device
# has caught up). The phases run from one mark to the next, in this order.
SPLITS = (("_reset", "reset"), ("policy.start", "decided"), ("_prefill", "prefilled"),
          ("_start", "started"), ("replay_until_done", "looped"))
PHASES = ("check and reset", "start decision", "prefill", "first round set up", "rounds",
          "finish")


class PhaseClock:
    """Splits `generate` calls at SPLITS by wrapping those methods (the replay loop is the
    module's function, or the refill decoder's `_run`, which starts its batch and loops) with a
    sync after each, installed only while splitting. A decoder
    without a length policy has no start decision: that phase is 0 there."""

    def __init__(self):
        self.marks = {}

    def install(self, decoder):
        self.marks = {}             # a wrapped call that did not fire must not read old marks
        undo = []
        for name, mark in SPLITS:
            owner, attr = decoder, name
            if name == "policy.start":
                owner, attr = decoder.policy, "start"
            elif name == "replay_until_done":    # the refill decoder loops in its `_run`
                owner, attr = ((decoder, "_run") if isinstance(decoder, GraphedRefillDecoder)
                               else (graphed_chain, name))
            if owner is None:
                continue
            undo.append(self._wrap(owner, attr, mark))
        return lambda: [u() for u in reversed(undo)]

    def _wrap(self, owner, attr, mark):
        inner, had_own = getattr(owner, attr), attr in vars(owner)

        def timed(*a, **k):
            out = inner(*a, **k)
            _sync()
            self.marks[mark] = time.perf_counter()
            return out

        setattr(owner, attr, timed)
        return lambda: setattr(owner, attr, inner) if had_own else delattr(owner, attr)

    def phases(self, t0: float, t1: float):
        """Seconds of each of PHASES in a call from t0 to t1."""
        m = dict(self.marks)
        m.setdefault("decided", m["reset"])
        edges = [t0] + [m[mark] for _, mark in SPLITS] + [t1]
        return {p: b - a for p, a, b in zip(PHASES, edges, edges[1:])}


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
    return t1 - t0, (clock.phases(t0, t1) if clock else None)


def _models(args):
    """(target, drafter, prompts, eos ids, graphs): the trained pair with the first `--batch`
    prompts of its workload, or the random-weight shapes with random prompts and a useless
    drafter."""
    if args.pair:
        from specpilot.bench.pair_bench import pair_dirs
        from specpilot.bench.workload import encode_prompts
        from specpilot.runtime.decoder import load_pair

        graphs = torch.cuda.is_available()
        pair = load_pair(*pair_dirs(args.pair), "bfloat16" if graphs else "float32",
                         "cuda" if graphs else "cpu")
        prompts = encode_prompts(pair, args.workload, args.batch)
        return pair.target, pair.drafter, prompts, list(pair.eos_ids), graphs
    target, useless, graphs = random_pair(args.shapes, args.scale)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, target.config.vocab_size, (args.batch, args.prompt_len),
                            generator=gen).tolist()
    return target, useless, prompts, [], graphs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter")
    ap.add_argument("--pair", metavar="DIR",
                    help="a trained pair (target/ and drafter/) instead of random weights: its "
                         "own drafter and the first --batch prompts of --workload")
    ap.add_argument("--workload", default="humaneval", help="with --pair: humaneval or a file")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64, help="random prompts' length")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=10, help="interleaved whole-call rounds")
    ap.add_argument("--split-pairs", type=int, default=5, help="interleaved split rounds")
    ap.add_argument("--extra-slots", type=int, default=8,
                    help="cache slots the last decoder (plain AR) has more (0: no such decoder)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if min(args.pairs, args.split_pairs, args.batch, args.new_tokens) < 1:
        ap.error("--pairs, --split-pairs, --batch and --new-tokens must be at least 1")
    if args.extra_slots < 0:
        ap.error("--extra-slots must be at least 0")

    target, drafter, prompts, eos, graphs = _models(args)
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
    for row in rows:        # tokens/s ratios: every decoder makes the same tokens
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
