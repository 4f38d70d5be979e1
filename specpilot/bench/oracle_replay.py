"""How much a per-round length choice could gain at all: a replay whose rule knows every draft's
fate before the round.

The batch-length rule (runtime/batch_length.py) estimates acceptance from the rounds before.
This oracle instead reads the agreement map (specpilot/bench/adaptive_replay.py, pessimistic:
drafts no chain(k) round showed count wrong) and, each round, runs the length L in 0..k with the
most progress per cost: with continuous refill, the tokens the round commits over every active
slot; padded, how much it shortens the batch's longest remaining request (its makespan). It is
greedy round by round, not an optimum over whole runs, but it removes all estimation error, so
where the rule already matches it, no better length choice can close a gap: that would need a
drafter that agrees more, or cheaper rounds. Costs, queue order and the AR baselines are those of
the other replays; prefills are excluded.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Sequence

from specpilot.cost.refill_schedule import refill_steps

from .adaptive_replay import agreement_maps, round_costs_for, streak
from .replay import AcceptanceProfile, ReplayFigure, cycled_queue

ORACLE_MODEL = ("graphed rounds at the length with the most progress per cost this round, "
                "chosen knowing every draft's fate (plain AR step for 0)")


def _advance(agree: Sequence[bool], position: int, remaining: int, length: int) -> int:
    """Tokens a round of `length` drafts commits for a request at `position` with `remaining`."""
    return min(streak(agree, position, length) + 1, remaining)


def _progress(gains: Dict[int, int], remaining: List[int], refill: bool) -> int:
    """What a round whose live slots commit `gains` (slot: tokens) gets done: with refill the
    tokens it commits, padded how much it shortens the longest remaining request."""
    if refill:
        return sum(gains.values())
    return max(remaining[s] for s in gains) - max(remaining[s] - g for s, g in gains.items())


def replay_oracle(profile: AcceptanceProfile, costs, batch: int,
                  refill: bool = False) -> ReplayFigure:
    """The oracle's tokens/s on `profile` at `batch` (see the module), padded or with refill;
    its AR baseline is AR padded, or AR with refill."""
    order, decode = cycled_queue(profile, batch)
    maps = agreement_maps(profile)
    seconds = round_costs_for(costs, batch, profile.topology.k)
    groups = ([list(range(len(order)))] if refill
              else [list(range(s, s + batch)) for s in range(0, len(order), batch)])
    steps = committed = accepted = 0
    spent = 0.0
    for group in groups:
        queue = deque(group)
        held = [-1] * batch                 # per slot, its request's place in `order`
        position = [0] * batch
        remaining = [0] * batch
        while True:
            for s in range(batch):
                while remaining[s] == 0 and queue:
                    held[s] = queue.popleft()
                    position[s], remaining[s] = 0, decode[held[s]]
            live = [s for s in range(batch) if remaining[s] > 0]
            if not live:
                break
            # per length 0..k, the tokens each live slot would commit
            gains = [{s: _advance(maps[order[held[s]]], position[s], remaining[s], length)
                      for s in live} for length in range(len(seconds))]
            length = max(range(len(seconds)),
                         key=lambda n: (_progress(gains[n], remaining, refill) / seconds[n], -n))
            spent += seconds[length]
            steps += 1
            for s, got in gains[length].items():
                position[s] += got
                remaining[s] -= got
                committed += 1
                accepted += got - 1
    ar_steps = (refill_steps(decode, batch) if refill
                else sum(max(decode[i] for i in g) for g in groups))
    return ReplayFigure(batch, len(order), sum(decode), steps, spent, ar_steps,
                        ar_steps * seconds[0], 1 + accepted / committed,
                        step_model=ORACLE_MODEL)
