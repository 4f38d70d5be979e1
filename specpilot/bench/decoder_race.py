"""Decoders raced in whole calls, interleaved (so drift in the machine falls on all alike):
their warm-up calls, the timed calls (whole, or split into phases by
specpilot/bench/phase_clock.py) and rows of each as x the first decoder. Used by
bench/startoff_gap.py, bench/round_cost_truth.py and bench/fused_drafter_race.py."""
from __future__ import annotations

import argparse
import statistics
from typing import Dict, List, Optional

from specpilot.cli_common import positive_counts

from .phase_clock import PhaseClock, one_call


def add_race_arguments(ap: argparse.ArgumentParser, calls: int) -> None:
    """The options every race script takes: --batch-sizes, --k, --new-tokens and --calls
    (`calls` timed calls of each decoder by default); `race_arguments_error` checks them."""
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16, 64])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--calls", type=int, default=calls, help="timed calls of each decoder")


def race_arguments_error(args) -> Optional[str]:
    """What is wrong with `add_race_arguments`' options, or None."""
    if min(args.k, args.new_tokens, args.calls) < 1:
        return "--k, --new-tokens and --calls must be at least 1"
    return None


def warm_up(decoders, prompts, new: int, calls: int) -> Dict[str, list]:
    """`calls` untimed calls of each decoder (captures; an adaptive one's workload memory
    learns): per decoder, each call's result."""
    return {name: [dec.generate(prompts, new) for _ in range(calls)]
            for name, dec in decoders.items()}


def interleaved_calls(decoders, prompts, new: int, calls: int, clock: Optional[PhaseClock] = None,
                      started_off: Optional[Dict[str, List[bool]]] = None) -> Dict[str, list]:
    """`calls` rounds of one call of every decoder in turn (so drift in the machine falls on
    all alike): per decoder, each call's seconds, or with `clock` its phases. `started_off`
    (name -> list) gets, for each decoder with a length policy, whether each call started off."""
    out = {name: [] for name in decoders}
    for _ in range(calls):
        for name, dec in decoders.items():
            seconds, phases = one_call(dec, prompts, new, clock)
            out[name].append(seconds if clock is None else phases)
            if started_off is not None and dec.policy is not None:
                started_off.setdefault(name, []).append(dec.first_length == 0)
    return out


def call_rows(seconds: Dict[str, List[float]]) -> List[dict]:
    """Per decoder (in order): its calls in ms, their median and mean, and both as x the first
    decoder's. These are tokens/s ratios where every decoder makes the same tokens: always
    with random weights; on a trained pair in bf16 a near-tie may flip a token."""
    rows = [{"system": name, "call_ms": [t * 1e3 for t in times],
             "call_ms_median": statistics.median(times) * 1e3,
             "call_ms_mean": statistics.fmean(times) * 1e3} for name, times in seconds.items()]
    for row in rows:
        row["x_plain_ar"] = rows[0]["call_ms_median"] / row["call_ms_median"]
        row["x_plain_ar_mean"] = rows[0]["call_ms_mean"] / row["call_ms_mean"]
    return rows
