"""Where a refill call's time goes on the GPU's timeline: its replays, its admissions, and the
gaps where the GPU waited for the host.

The round breakdown (bench/round_breakdown.py) times a round alone, every row active; a whole
refill call ran 5-10 % more per round than that. Here whole calls of the graphed refill decoder
(runtime/graphed_refill.py, chain(k) or adaptive lengths up to k, the drafter in fused kernels
unless --drafter-kernels model) are timed with CUDA events on the batch's stream around every
replay and every admission:

  wall_ms          the call by the host clock
  before_ms        call start to the first replay (checks, the first wave's prefill, set-up)
  replay_ms        the replays' device time, summed (and per replay: median, by length)
  admit_ms         the admissions' time on the batch's stream (their prefill runs beside)
  idle_ms          first replay to last, minus replays and admissions: the GPU waiting
                   between them (a wait inside an admission's interval, for the host or for
                   the newcomer's prefill on its own stream, counts as admission time)
  after_ms         the last replay to the call's end (results read back)
  host_admit_ms    the host's own time in the admissions, summed (and the median one): where
                   an admission's host work outlasts the replay queued before it, the GPU waits
  host_prefetch_ms the host's time prefilling newcomers ahead (placement `ahead`), summed
  crowded_gaps     gaps between two replays with more than one admission in them
  replays, refills, replays_by_length (by chain length; "0x4": the drain's plain blocks of
  four rounds), new tokens and tokens/s

per batch size, decoder (--decoders: chain, adaptive, adaptive_depth: adaptive lengths by the
per-depth estimate), round end (--accept-kernels: torch ops, or generated kernels: the commit,
and with adaptive lengths the length's update and a newcomer's start, the length_policy and
length_admit families), rounds a replay (--rounds-per-replay: a finished request's slot
waits for its replay's end and one replay more, so fewer rounds a replay refill sooner, at more
host work a round) and newcomer prefill placement (--prefill-placements: `ahead` of the
admission, `beside` the round at it, or `after` the round; runtime/row_prefill.py; with
`ahead`, --ahead-depths: how many newcomers are held prefilled) and read-back lag
(--readback-lags: replays the host reads finished rows back behind, so that more are queued
while it admits; runtime/graphed_refill.py) and when the newcomers held ahead are topped up
(--topups: right after a read-back's admissions, or once the next replay is queued).

  python3 bench/refill_timeline.py --pair /tmp/specpilot-pair --batch-sizes 16 --out FILE.json

Random weights without --pair (every request then runs to its limit). Off a GPU it runs
uncaptured in float32 with Triton's interpreter and host clocks only (to check the script).
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import Dict, List, Optional

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.bench.decode_models import (add_model_arguments, decode_models,  # noqa: E402
                                           decoder_capacity)
from specpilot.bench.gc_pause import gc_paused  # noqa: E402
from specpilot.bench.script_rows import measure_rows  # noqa: E402
from specpilot.cli_common import comma_choices, positive_counts, positive_int  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fused_forward import FusedForward  # noqa: E402
from specpilot.runtime.graphed_refill import (LAG_ENV, MAX_READBACK_LAG,  # noqa: E402
                                              TOPUP_ENV, TOPUPS, GraphedRefillDecoder,
                                              refill_readback_lag, refill_rounds_per_replay,
                                              refill_topup)
from specpilot.runtime.row_prefill import (AHEAD_DEPTH, AHEAD_ENV,  # noqa: E402
                                           MAX_AHEAD_DEPTH, PLACEMENT_ENV, PLACEMENTS,
                                           ahead_depth, prefill_placement)


class Timeline:
    """Wraps a refill decoder's replays and admissions with CUDA events on the current stream
    (host clocks off a GPU), for the calls run while installed."""

    def __init__(self, decoder: GraphedRefillDecoder):
        self.decoder, self.cuda = decoder, decoder.device.type == "cuda"
        self.marks: List[tuple] = []         # (kind, length key or None, start, end)
        self.host_admit: List[float] = []     # host ms of each admission
        self.host_prefetch: List[float] = []  # host ms of each prefill ahead
        prefill = decoder._row_prefill
        self._inner_runner, self._inner_admit = decoder._runner, decoder._admit
        self._inner_prefetch = prefill.prefetch
        decoder._runner, decoder._admit = self._runner, self._admit
        prefill.prefetch = self._prefetch

    def remove(self) -> None:
        """The decoder's own methods back (and no cycle through this timeline)."""
        del self.decoder._runner, self.decoder._admit, self.decoder._row_prefill.prefetch

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _runner(self, forced, k, rounds=None):
        replay = self._inner_runner(forced, k, rounds)
        # A replay of other than the decoder's rounds (the drain's plain blocks) is timed
        # under its own key, "<length>x<rounds>".
        key = k if rounds in (None, self.decoder.rounds_per_replay) else f"{k}x{rounds}"

        def timed():
            start = self.mark()
            replay()
            self.marks.append(("replay", key, start, self.mark()))
        return timed

    def _admit(self, *args, **kwargs):
        start, t0 = self.mark(), time.perf_counter()
        self._inner_admit(*args, **kwargs)
        self.host_admit.append((time.perf_counter() - t0) * 1e3)
        self.marks.append(("admit", None, start, self.mark()))

    def _prefetch(self, upcoming):
        t0 = time.perf_counter()
        count = self._inner_prefetch(upcoming)
        if count:                                   # it prefilled newcomers now
            ms = (time.perf_counter() - t0) * 1e3
            self.host_prefetch.extend([ms / count] * count)
        return count

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def call(self, prompts, max_new: int) -> dict:
        self.marks, self.host_admit, self.host_prefetch = [], [], []
        begin = self.mark()
        t0 = time.perf_counter()
        result = self.decoder.generate(prompts, max_new)
        end = self.mark()
        if self.cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        replays = [m for m in self.marks if m[0] == "replay"]
        admits = [m for m in self.marks if m[0] == "admit"]
        replay_ms = [self.ms(s, e) for _, _, s, e in replays]
        admit_ms = [self.ms(s, e) for _, _, s, e in admits]
        span = self.ms(replays[0][2], replays[-1][3])
        by_length: Dict[str, List[float]] = {}
        for (_, k, _, _), ms in zip(replays, replay_ms):
            by_length.setdefault(str(k), []).append(ms)
        tokens = sum(len(t) for t in result.tokens)
        crowded, run = 0, 0          # admissions since the last replay
        for kind, *_ in self.marks:
            run = run + 1 if kind == "admit" else 0
            crowded += run == 2
        return {"wall_ms": wall, "before_ms": self.ms(begin, replays[0][2]),
                "replay_ms": sum(replay_ms), "admit_ms": sum(admit_ms),
                "idle_ms": span - sum(replay_ms) - sum(admit_ms),
                "after_ms": self.ms(replays[-1][3], end),
                "replays": len(replays), "refills": len(admits),
                "replays_by_length": {k: len(v) for k, v in sorted(by_length.items())},
                "median_replay_ms_by_length": {k: statistics.median(v)
                                               for k, v in sorted(by_length.items())},
                "new_tokens": tokens, "tokens_per_s": tokens / wall * 1e3,
                "host_admit_ms": sum(self.host_admit),
                "host_admit_median_ms": statistics.median(self.host_admit or [0.0]),
                "host_prefetch_ms": sum(self.host_prefetch),
                "prefetches": len(self.host_prefetch), "crowded_gaps": crowded}


DECODERS = ("chain", "adaptive", "adaptive_depth")
ACCEPT = ("ops", "fused")


def one_cell(target, drafter, prompts, eos, batch: int, kind: str, per: int,
             placement: str, depth: Optional[int], lag: int, accept: str, topup: str,
             args) -> dict:
    capacity = decoder_capacity(prompts, args.max_new_tokens, args.k)
    adaptive = kind != "chain"
    decoder = GraphedRefillDecoder(target, drafter, batch, capacity, args.k, eos,
                                   capture=target.device.type == "cuda", adaptive=adaptive,
                                   rounds_per_replay=per, prefill_placement=placement,
                                   ahead_depth=depth, readback_lag=lag, accept_kernels=accept,
                                   topup=topup,
                                   length_estimator=("per_depth" if kind == "adaptive_depth"
                                                     else "geometric"))
    decoder.prepare_prefill(prompts)
    timeline = Timeline(decoder)
    timeline.call(prompts, args.max_new_tokens)                     # warm: captures, prices
    # No collection inside a timed call: it could free an earlier cell's decoder there.
    with gc_paused():
        calls = [timeline.call(prompts, args.max_new_tokens) for _ in range(args.calls)]
    timeline.remove()
    keys = ("wall_ms", "before_ms", "replay_ms", "admit_ms", "idle_ms", "after_ms",
            "tokens_per_s", "host_admit_ms", "host_admit_median_ms", "host_prefetch_ms")
    return {"batch": batch, "decoder": kind if adaptive else f"chain({args.k})",
            "accept_kernels": accept, "rounds_per_replay": decoder.rounds_per_replay,
            "prefill_placement": placement,
            "ahead_depth": decoder._row_prefill.depth, "readback_lag": decoder.lag,
            "topup": decoder.topup,
            "median": {key: statistics.median(c[key] for c in calls) for key in keys},
            "calls": calls}


def report(cell: dict) -> str:
    m = cell["median"]
    last = cell["calls"][-1]
    ahead = f" ({cell['ahead_depth']} held)" if cell["ahead_depth"] else ""
    return (f"batch {cell['batch']} {cell['decoder']} ({cell['accept_kernels']} round end), "
            f"{cell['rounds_per_replay']} rounds a "
            f"replay, prefill {cell['prefill_placement']}{ahead}, read back "
            f"{cell['readback_lag']} "
            f"behind, topped up once {cell['topup']}: {m['wall_ms']:.1f} ms "
            f"({m['tokens_per_s']:.0f} tok/s): before {m['before_ms']:.1f}, replays "
            f"{m['replay_ms']:.1f} ({last['replays']}: {last['replays_by_length']}), admissions "
            f"{m['admit_ms']:.1f} ({last['refills']}), idle {m['idle_ms']:.1f}, after "
            f"{m['after_ms']:.1f}; host: admissions {m['host_admit_ms']:.1f} (median "
            f"{m['host_admit_median_ms']:.3f}), prefills ahead {m['host_prefetch_ms']:.1f} "
            f"({last['prefetches']}), gaps with several admissions {last['crowded_gaps']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--batch-sizes", type=positive_counts, default=[16])
    ap.add_argument("--prompts", type=positive_int, default=64,
                    help="requests a call (queued past the batch)")
    ap.add_argument("--max-new-tokens", type=positive_int, default=256)
    ap.add_argument("--k", type=positive_int, default=4,
                    help="the chain's drafts (the adaptive longest)")
    ap.add_argument("--decoders", type=comma_choices(DECODERS), default="chain,adaptive",
                    help=f"comma list of {', '.join(DECODERS)}")
    ap.add_argument("--accept-kernels", type=comma_choices(ACCEPT), default="ops",
                    help="comma list of round ends, one cell each: ops (torch operations) "
                         "and/or fused (generated kernels)")
    ap.add_argument("--calls", type=positive_int, default=3, help="timed calls after a warm one")
    ap.add_argument("--rounds-per-replay", type=positive_counts, default=None,
                    help="rounds each replay runs, one cell per value (default: the refill "
                         "decoder's, SPECPILOT_REFILL_ROUNDS included)")
    ap.add_argument("--drafter-kernels", choices=("fused", "model"), default="fused",
                    help="the drafter in fused layer kernels or as its model runs it")
    ap.add_argument("--prefill-placements", type=comma_choices(PLACEMENTS), default=None,
                    help=f"newcomer prefill placements, one cell each, of {', '.join(PLACEMENTS)} "
                         f"(default: the decoder's, {PLACEMENT_ENV} included)")
    ap.add_argument("--ahead-depths", type=positive_counts, default=None,
                    help="newcomers held prefilled with the placement ahead, one cell per "
                         f"value (1..{MAX_AHEAD_DEPTH}; default: {AHEAD_ENV}'s or "
                         f"{AHEAD_DEPTH})")
    ap.add_argument("--readback-lags", type=positive_counts, default=None,
                    help="replays the host reads finished rows back behind, one cell per value "
                         f"(1..{MAX_READBACK_LAG}; default: the decoder's, {LAG_ENV} included)")
    ap.add_argument("--topups", type=comma_choices(TOPUPS), default=None,
                    help="when the newcomers held ahead are topped up, one cell each, of "
                         f"{', '.join(TOPUPS)} (default: the decoder's, {TOPUP_ENV} included)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    placements = args.prefill_placements
    try:
        if args.rounds_per_replay is None:
            args.rounds_per_replay = [refill_rounds_per_replay()]
        if placements is None:
            placements = [prefill_placement()]
        if args.readback_lags is None:
            args.readback_lags = [refill_readback_lag()]
        for lag in args.readback_lags:
            refill_readback_lag(lag)
        if args.topups is None:
            args.topups = [refill_topup()]
        depths = [ahead_depth(d) for d in args.ahead_depths or [None]]
        target, drafter, prompts, eos, _ = decode_models(args, args.prompts)
        if args.drafter_kernels == "fused":
            drafter = FusedForward(drafter)
    except SpecPilotError as exc:
        ap.error(str(exc))

    def cell(case) -> dict:
        batch, per, kind, (placement, depth), lag, accept, topup = case
        return one_cell(target, drafter, prompts, eos, batch, kind, per, placement, depth, lag,
                        accept, topup, args)

    # Each depth is a cell of its own where the placement is ahead; it means nothing elsewhere.
    placed = [(p, d) for p in placements for d in (depths if p == "ahead" else [None])]
    cases = itertools.product(args.batch_sizes, args.rounds_per_replay, args.decoders, placed,
                              args.readback_lags, args.accept_kernels, args.topups)
    measure_rows(cases, cell, report, args.out, target.device.type, vars(args), "cells")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
