"""Splitting a graphed decoder's `generate` calls into phases, with a device sync at each
boundary: the call's checks and state reset, the workload memory's start decision, the prefill,
the first round's set-up, the rounds (the replay loop) and the finish (what is read back).
Decoders raced call by call: specpilot/bench/decoder_race.py."""
from __future__ import annotations

import time

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
    sync after each, installed only while splitting. A call that makes no start decision (no
    length policy, no turn-off, or a refill call with a queue) has 0 for that phase."""

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
