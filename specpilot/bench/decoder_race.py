"""Decoders raced in whole calls, interleaved (so drift in the machine falls on all alike):
their warm-up calls, the timed calls (whole, or split into phases by
specpilot/bench/phase_clock.py), rows of each as x the first decoder, and the whole race with
what each adaptive decoder learnt (`race`). Used by
bench/startoff_gap.py, bench/round_cost_truth.py and bench/fused_drafter_race.py."""
from __future__ import annotations

import argparse
import statistics
from typing import Dict, List, Optional

from specpilot.cli_common import positive_counts, positive_int
from specpilot.runtime.graphed_loop import rounds_run

from .phase_clock import PhaseClock, one_call


def add_race_arguments(ap: argparse.ArgumentParser, calls: Optional[int]) -> None:
    """The options every race script takes, each checked as it is parsed: --batch-sizes, --k,
    --new-tokens and --calls (`calls` timed calls of each decoder by default; None: a script
    that times no whole calls, without --calls)."""
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16, 64])
    ap.add_argument("--k", type=positive_int, default=4)
    ap.add_argument("--new-tokens", type=positive_int, default=256)
    if calls is not None:
        ap.add_argument("--calls", type=positive_int, default=calls,
                        help="timed calls of each decoder")


# Untimed calls of each decoder before timing: its captures, and (adaptive) its round costs
# and workload memory.
WARM_CALLS = 3


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


def phase_race(decoders, prompts, new: int, calls: int, warm_calls: int = WARM_CALLS):
    """`warm_calls` warm-up calls of each decoder, then `calls` whole calls of each in turn split
    into phases (specpilot/bench/phase_clock.py). Per decoder: (its warm-up results, each timed
    call's phases, the rounds of a call (its last warm-up's), ms per round (the median rounds
    phase over them))."""
    warm = warm_up(decoders, prompts, new, warm_calls)
    phases = interleaved_calls(decoders, prompts, new, calls, PhaseClock())
    rounds = {name: rounds_run(results[-1].stats) for name, results in warm.items()}
    per_round = {name: statistics.median(p["rounds"] for p in runs) * 1e3 / rounds[name]
                 for name, runs in phases.items()}
    return warm, phases, rounds, per_round


def race(decoders, prompts, new: int, calls: int, warm_calls: int,
         warmed: Optional[Dict[str, list]] = None) -> List[dict]:
    """Whole calls of every decoder in turn; rows x the first decoder (plain AR). Decoders not
    in `warmed` (name -> its warm-up results) get `warm_calls` warm-up calls first. Each row
    also keeps its warm-up calls' rounds per length and, for an adaptive decoder, its round
    costs, how its length update runs, which calls started off, and what its workload memory
    holds at the end (each remembered request's accepted drafts and rejections, the acceptance
    its batch's first turn-off decision judged it by): whether, and where, its speculating
    batches turned off."""
    warmed = warmed or {}
    warm = {**warmed, **warm_up({n: d for n, d in decoders.items() if n not in warmed},
                                prompts, new, warm_calls)}
    started_off: Dict[str, List[bool]] = {}
    rows = call_rows(interleaved_calls(decoders, prompts, new, calls, started_off=started_off))
    for row in rows:
        name = row["system"]
        row["warm_up_stats"] = [dict(r.stats) for r in warm[name]]
        if name in started_off:
            policy = decoders[name].policy
            memory = policy.memory
            row["round_costs"] = policy.round_cost_host.tolist()
            row["length_update"] = {"compiled": policy.compiled, "smoothing": policy.smoothing}
            row["calls_started_off"] = started_off[name]
            row["memory"] = {"counts": [list(c) for c in memory.counts],
                             "first_judged": memory.first_judged,
                             "explore_after": memory.explore_after}
    return rows
