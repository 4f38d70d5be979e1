"""Replayed acceptance of adaptive lengths with continuous refill (runtime/graphed_refill.py with
`adaptive`): the batch-length rule with its throughput objective runs on a chain(k) profile's
agreement, priced with graphed rounds of every length, while a finished request's slot takes the
next request at the next step.

The agreement is read as in specpilot/bench/adaptive_replay.py (pessimistic or optimistic about
the drafts a full chain never showed), the queue and the pricing of a step as in
specpilot/bench/refill_replay.py (prefills excluded, which favours refill by what they cost).
Each step every active slot commits its agreeing drafts up to the chosen length plus one token;
the rule (`BatchLengthPolicy`, objective "throughput", the decoder's own device-state code, here
on the CPU) picks the next length, and a newcomer starts from the averages of the requests
before it (`admit`). As in the runtime's host loop, a newcomer alone in the batch (no other slot
holds a request still running: with one slot, every newcomer) starts it anew at the longest
chain, and once the queue is empty the batch drains (`queue_empty`: the makespan rule, unless
the drain objective is "throughput"). The AR baseline is AR with refill, as in the refill
replay.
"""
from __future__ import annotations

from collections import deque

import torch

from specpilot.cost.refill_schedule import refill_steps
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS

from .adaptive_replay import agreement_maps, play_round, replay_policy, round_costs_for
from .replay import AcceptanceProfile, ReplayFigure, cycled_queue

ADAPTIVE_REFILL_MODEL = ("graphed rounds at the length the rule chose for the batch's tokens per "
                         "second (plain AR step for 0); a finished request's slot takes the next "
                         "one at the next step")


def replay_adaptive_refill(profile: AcceptanceProfile, costs, batch: int,
                           unknown_agrees: bool = False, turn_off: bool = True,
                           off_after: int = OFF_AFTER_ROUNDS,
                           estimator: str = "geometric",
                           drain: str = "makespan") -> ReplayFigure:
    """Replay adaptive lengths with continuous refill on `profile` at batch size `batch` (see
    the module): pessimistic, or with `unknown_agrees` optimistic; `off_after` rounds before a
    turn-off, the rule's `estimator` and what it optimises once the queue is empty, `drain`
    (runtime/batch_length.py, a Program's batch.length_drain)."""
    order, decode = cycled_queue(profile, batch)
    maps = agreement_maps(profile, unknown_agrees)
    k = profile.topology.k
    seconds = round_costs_for(costs, batch, k)
    policy = replay_policy(seconds, batch, k, turn_off=turn_off, objective="throughput",
                           off_after=off_after, estimator=estimator, drain=drain)
    policy.reset()
    queue = deque(range(len(order)))            # positions in `order` (first cycle counted)
    held = [-1] * batch
    position = [0] * batch
    remaining = torch.zeros(batch, dtype=torch.int64)

    def refill(length: int) -> int:
        """Newcomers into the free slots; the next round's length (the longest where the
        batch starts anew: a newcomer alone in it)."""
        for slot in range(batch):
            while int(remaining[slot]) == 0 and queue:
                alone = not bool((remaining > 0).any())
                held[slot] = queue.popleft()
                position[slot], remaining[slot] = 0, decode[held[slot]]
                policy.admit(slot, alone)
                length = k if alone else length
        if not queue:
            policy.queue_empty()
        return length

    length = refill(k)
    count = len(profile.accepted_lengths)
    spec_steps = committed_steps = accepted_total = 0
    spec_seconds = 0.0
    while bool((remaining > 0).any()):
        spec_seconds += seconds[length]
        spec_steps += 1
        remaining, length, rounds, accepted = play_round(
            policy, [maps[order[h]] for h in held],
            [h < count for h in held],       # the mean is over requests, not their repeats
            position, remaining, length)
        committed_steps += rounds
        accepted_total += accepted
        length = refill(length)
    ar_steps = refill_steps(decode, batch)
    return ReplayFigure(batch, len(order), sum(decode), spec_steps, spec_seconds, ar_steps,
                        ar_steps * seconds[0], 1 + accepted_total / committed_steps,
                        step_model=ADAPTIVE_REFILL_MODEL)
