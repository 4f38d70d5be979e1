"""Splitting a graphed decoder's `generate` calls into phases, with a device sync at each
boundary: the call's checks and state reset, the workload memory's start decision, the prefill,
the first round's set-up, the rounds (the replay loop) and the finish (what is read back); and
timing several decoders' calls interleaved. Used by bench/startoff_gap.py and
bench/round_cost_truth.py."""
from __future__ import annotations

import statistics
import time
from typing import Dict, List, Optional

import torch

import specpilot.runtime.graphed_chain as graphed_chain
from specpilot.runtime.graphed_refill import GraphedRefillDecoder


def sync():
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
            sync()
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
        sync()
        t0 = time.perf_counter()
        decoder.generate(prompts, new)
        sync()
        t1 = time.perf_counter()
    finally:
        if restore:
            restore()
    return t1 - t0, (clock.phases(t0, t1) if clock else None)


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
