"""Replayed acceptance of the graphed adaptive draft length (runtime/batch_length.py) at a scale
where acceptance cannot be measured: the batch-length rule itself runs on a chain(k) profile's
agreement, priced with graphed rounds of every length measured on the shape presets.

A greedy drafter's draft for a position depends only on the committed prefix before it, which is
the reference output whatever the rounds were: so whether the drafter agrees with the target is a
property of the position, and a chain(k) profile tells it for every position its rounds drafted.
A round that accepted a < k drafts from position s says s .. s+a-1 agree and s+a does not; one
that accepted all k says nothing of s+k (the target's bonus token there was never drafted). The
replay runs twice: with those unknown drafts counted wrong (pessimistic) and counted right
(optimistic). The truth is in between as long as more agreement never makes the rule choose
worse, which is its intent but not a theorem (it reacts to what it sees). The fixed chain(k)
never drafts there, so it replays exactly as `replay.replay` does either way. The two differ:
a shorter chain lands on the unknown positions often, and with HumanEval's chain(4) profiles (a
full chain accepted in about every other round) the pessimistic replay turns most batch-1
requests off after a few rounds.

Per batch (requests cycled to fill it, as there), each round costs the measured graphed round of
the length the rule chose (a plain AR step for 0), every active request commits its agreeing
drafts up to that length plus one token, and the rule (`BatchLengthPolicy`, the decoder's own
device-state code, here on the CPU) picks the next length from what was accepted. The runtime
applies a chosen length a few rounds later (the host reads it back between replays); the replay
applies it at the next round.

A batch may start with speculation off by what the requests before it showed
(runtime/workload_memory.py); with `warm`, the replay first plays the whole profile once,
unmeasured, so that even a workload of one batch is timed with that memory, as the bench does.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from specpilot.ir.topology import Chain
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS, BatchLengthPolicy

from .replay import NO_DECODE_STEPS, AcceptanceProfile, ProfileError, ReplayFigure, cycled_batches

ADAPTIVE_MODEL = "graphed rounds at the length the batch rule chose (plain AR step for 0)"
# The two readings of a chain(k) profile's unknown drafts (`agreement_maps`: those right after
# a fully accepted chain, which the profile never shows): counted wrong (pessimistic) or right
# (optimistic).
READINGS = {"pessimistic": False, "optimistic": True}
# How the graphed host loop applies a chosen length (runtime/graphed_loop.py): replays of four
# rounds, each running the length chosen at the end of the replay two back (`replay_adaptive`).
GRAPHED_HOST_LAG = (4, 2)


def agreement_maps(profile: AcceptanceProfile, unknown_agrees: bool = False) -> List[List[bool]]:
    """Per request, per decode position (after the prefill's token): whether the drafter's
    draft there equals the target's token, as far as the chain profile shows; a position after
    a fully accepted chain, which no round drafted, counts as `unknown_agrees`."""
    if not isinstance(profile.topology, Chain):
        raise ProfileError(f"adaptive lengths are replayed from a chain profile, not "
                           f"{profile.topology}")
    k = profile.topology.k
    maps = []
    for row in profile.accepted_lengths:
        agree = [False] * (sum(a + 1 for a in row) + k + 1)
        position = 0
        for accepted in row:
            for j in range(accepted):
                agree[position + j] = True
            if accepted == k:
                agree[position + k] = unknown_agrees
            position += accepted + 1
        maps.append(agree)
    return maps


def streak(agree: List[bool], start: int, cap: int) -> int:
    """Drafts a chain of at most `cap` from position `start` gets accepted: the agreeing
    positions in a row there."""
    n = 0
    while n < cap and start + n < len(agree) and agree[start + n]:
        n += 1
    return n


def play_round(policy: BatchLengthPolicy, agree: Sequence[List[bool]], counted: Sequence[bool],
               position: List[int], remaining: torch.Tensor, length: int) -> tuple:
    """One round of `length` drafts on every slot with tokens `remaining`: each commits the
    drafts its `agree` map shows agreeing from its `position` (advanced here), up to `length`,
    plus one token, and `policy` takes in what was accepted. Returns (the tokens remaining
    after it, the length the policy chose next, the rounds and accepted drafts of the
    `counted` slots)."""
    ran = remaining > 0
    n = torch.tensor([streak(agree[i], position[i], length) if ran[i] else 0
                      for i in range(len(position))], dtype=torch.int64)
    rounds = accepted = 0
    for i in range(len(position)):
        if ran[i]:
            position[i] += int(n[i]) + 1
            if counted[i]:
                rounds += 1
                accepted += int(n[i])
    remaining = torch.where(ran, (remaining - n - 1).clamp(min=0), remaining)
    drafted = torch.full_like(n, length)
    return (remaining, int(policy.next(n, drafted, ran, remaining, remaining > 0)), rounds,
            accepted)


def round_costs_for(costs, batch: int, k: int) -> List[float]:
    """Seconds of a plain graphed AR step and of a graphed chain(L) round, L = 1..k."""
    return [costs.target(batch, 1)] + [costs.round(batch, Chain(n)) for n in range(1, k + 1)]


def replay_policy(seconds: Sequence[float], batch: int, k: int, **options) -> BatchLengthPolicy:
    """The decoder's length policy, on the CPU, priced by `seconds` (`round_costs_for`) in plain
    steps; `options` as BatchLengthPolicy takes them."""
    return BatchLengthPolicy(batch, k, "cpu", 0.0, round_costs=[s / seconds[0] for s in seconds],
                             **options)


def play_batch(policy: BatchLengthPolicy, agree: Sequence[List[bool]], counted: Sequence[bool],
               decode: List[int], seconds: List[float], host_lag: Tuple[int, int]) -> tuple:
    """One padded batch under `policy` (reset here): its requests decode `decode` tokens each,
    and each round costs `seconds[length]`. A replay of host_lag[0] rounds runs the length
    chosen at the end of the replay host_lag[1] replays back (the batch's first length before
    that). Returns (seconds, rounds, rounds and accepted drafts of the `counted` slots); the
    policy remembers the batch, as the decoder's does."""
    per, behind = host_lag
    position = [0] * len(decode)
    remaining = torch.tensor(decode, dtype=torch.int64)
    policy.reset()
    length = policy.start(len(decode))
    chosen_at_replay_end: List[int] = []
    spent, rounds, committed, accepted = 0.0, 0, 0, 0
    while bool((remaining > 0).any()):
        if rounds % per == 0 and rounds // per >= behind:
            length = chosen_at_replay_end[rounds // per - behind]
        spent += seconds[length]
        remaining, chosen, ran, got = play_round(policy, agree, counted, position, remaining,
                                                 length)
        rounds += 1
        if rounds % per == 0:
            chosen_at_replay_end.append(chosen)
        committed += ran
        accepted += got
    policy.remember_batch()
    return spent, rounds, committed, accepted


def replay_adaptive(profile: AcceptanceProfile, costs, batch: int, turn_off: bool = True,
                    unknown_agrees: bool = False, warm: bool = False,
                    host_lag: Tuple[int, int] = (1, 1),
                    off_after: int = OFF_AFTER_ROUNDS,
                    estimator: str = "geometric") -> ReplayFigure:
    """Replay the batch-length rule on `profile` at batch size `batch` (see the module):
    pessimistic, or with `unknown_agrees` optimistic. As in the decoder, each batch may start
    with speculation off by what the batches before it taught (runtime/workload_memory.py);
    with `warm` the whole profile is played once first, unmeasured, as `specpilot bench` warms
    a system up on its whole workload before timing it.

    `host_lag` = (rounds per replay, replays behind): by default a chosen length applies from
    the next round; GRAPHED_HOST_LAG, (4, 2), applies it as the graphed host loop does
    (runtime/graphed_loop.py): each replay of four rounds runs the length chosen at the end of
    the replay two back.
    `off_after`: the rule's rounds before a turn-off; `estimator`: what it expects a chain of
    L to commit (runtime/batch_length.py)."""
    if host_lag[0] < 1 or host_lag[1] < 1:
        raise ProfileError(f"host lag needs at least one round per replay and one replay "
                           f"behind, got {host_lag}")
    batches = cycled_batches(len(profile.accepted_lengths), batch)
    maps = agreement_maps(profile, unknown_agrees)
    k = profile.topology.k
    seconds = round_costs_for(costs, batch, k)
    policy = replay_policy(seconds, batch, k, turn_off=turn_off, off_after=off_after,
                           estimator=estimator)
    count = len(maps)
    for _ in range(2 if warm else 1):            # what the last pass counts is reported
        tokens = spec_steps = ar_steps = committed_steps = accepted_total = 0
        spec_seconds = 0.0
        for number, rows in enumerate(batches):
            decode = [profile.new_tokens[r] - 1 for r in rows]
            tokens += sum(decode)
            ar_steps += max(decode)
            counted = [number * batch + i < count for i in range(batch)]  # not the repeats
            spent, rounds, committed, accepted = play_batch(
                policy, [maps[r] for r in rows], counted, decode, seconds, host_lag)
            spec_seconds += spent
            spec_steps += rounds
            committed_steps += committed
            accepted_total += accepted
    if tokens == 0:
        raise ProfileError(NO_DECODE_STEPS)
    return ReplayFigure(batch, len(batches) * batch, tokens, spec_steps, spec_seconds, ar_steps,
                        ar_steps * seconds[0], 1 + accepted_total / committed_steps,
                        step_model=ADAPTIVE_MODEL)
