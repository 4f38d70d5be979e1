"""Per-request adaptive draft lengths replayed in lock-step batches from a chain(k) acceptance
profile, and the rounds priced padded (every forward over all B rows at the widest row's width)
and ragged (each forward packs only the active rows' real tokens), for bench/ragged_replay.py.

Each request's length follows its own recent acceptance within the batch's token budget, as the
eager runtime chooses it (runtime/adaptive_draft.py `AdaptiveChainProposer`); another length
than the profile's is replayed with adaptive_replay's `agreement_maps` and `streak`. A batch
lasts until its slowest request is done (no refill, prefills excluded).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import List, NamedTuple, Sequence, Tuple

from specpilot.ir.topology import Chain
from specpilot.runtime.adaptive_draft import AdaptiveChainProposer

from .adaptive_replay import READINGS, agreement_maps, streak
from .replay import NO_DECODE_STEPS, AcceptanceProfile, ProfileError, cycled_batches
from .stored_forwards import PackedCosts


class Round(NamedTuple):
    """One lock-step round of a batch of `batch` slots: for each row still decoding, its draft
    length and its catch-up tokens (what it committed the round before; 1 on the first)."""
    batch: int
    lengths: Tuple[int, ...]
    catch_up: Tuple[int, ...]


def padded_round_seconds(priced: PackedCosts, r: Round) -> float:
    """Every forward over all `r.batch` rows at the widest row's width."""
    longest = max(r.lengths)
    return (priced.drafter(r.batch, max(r.catch_up))
            + max(longest - 1, 0) * priced.drafter(r.batch, 1)
            + priced.target(r.batch, longest + 1))


def ragged_round_seconds(priced: PackedCosts, r: Round) -> float:
    """Each forward packs the active rows' real tokens (see the module)."""
    b, active, longest = r.batch, len(r.lengths), max(r.lengths)
    seconds = priced.packed("catch-up", "drafter", active, sum(r.catch_up), b, max(r.catch_up))
    for depth in range(1, longest):
        drafting = sum(1 for n in r.lengths if n > depth)
        seconds += priced.packed("drafting level", "drafter", drafting, drafting, b, 1)
    return seconds + priced.packed("verification", "target", active,
                                   sum(n + 1 for n in r.lengths), b, longest + 1)


def play_request_batch(agree: Sequence[List[bool]], decode: Sequence[int], k: int, budget: int,
                       draft_cost: float) -> Tuple[List[Round], List[List[int]], List[List[int]]]:
    """The rounds of one lock-step batch under the per-request rule (a fresh estimate for each
    request, as in the runtime); returns (rounds, each slot's lengths, each slot's accepted
    drafts per round it ran)."""
    proposer = AdaptiveChainProposer(Chain(k), budget, draft_cost)
    requests = [SimpleNamespace(ema=None) for _ in decode]
    position = [0] * len(decode)
    remaining = list(decode)
    committed_before = [1] * len(decode)
    rounds: List[Round] = []
    lengths_of: List[List[int]] = [[] for _ in decode]
    accepted_of: List[List[int]] = [[] for _ in decode]
    while any(n > 0 for n in remaining):
        active = [i for i, n in enumerate(remaining) if n > 0]
        lengths = proposer.lengths([requests[i] for i in active])
        rounds.append(Round(len(decode), tuple(lengths),
                            tuple(committed_before[i] for i in active)))
        for i, length in zip(active, lengths):
            n = streak(agree[i], position[i], length)
            proposer.observe(requests[i], SimpleNamespace(num_nodes=length), n)
            position[i] += n + 1
            remaining[i] = max(remaining[i] - n - 1, 0)
            committed_before[i] = n + 1
            lengths_of[i].append(length)
            accepted_of[i].append(n)
    return rounds, lengths_of, accepted_of


def adaptive_rows(profile: AcceptanceProfile, priced: PackedCosts, batch: int, budget: int,
                  draft_cost: float, bound: str, label: str) -> List[dict]:
    """The padded-adaptive and ragged-adaptive rows (labelled `label`) of one batch size and
    `bound` (pessimistic or optimistic about drafts the profile never showed)."""
    k = profile.topology.k
    maps = agreement_maps(profile, READINGS[bound])
    count = len(maps)
    plain = priced.target(batch, 1)
    figures = {"padded": [0.0, 0], "ragged": [0.0, 0]}    # seconds, verified tokens
    tokens = ar_steps = committed = accepted = drafted = rounds_run = 0
    ragged_ar = 0.0
    batches = cycled_batches(count, batch)
    for number, rows in enumerate(batches):
        decode = [profile.new_tokens[r] - 1 for r in rows]
        tokens += sum(decode)
        ar_steps += max(decode)
        rounds, lengths, got = play_request_batch([maps[r] for r in rows], decode, k, budget,
                                                  draft_cost)
        for slot in range(batch):
            if number * batch + slot < count:           # not the cycled repeats
                committed += len(got[slot])
                accepted += sum(got[slot])
                drafted += sum(lengths[slot])
        for r in rounds:
            figures["padded"][0] += padded_round_seconds(priced, r)
            figures["padded"][1] += batch * (max(r.lengths) + 1)
            figures["ragged"][0] += ragged_round_seconds(priced, r)
            figures["ragged"][1] += sum(n + 1 for n in r.lengths)
        rounds_run += len(rounds)
        for step in range(max(decode)):
            active = sum(1 for n in decode if n > step)
            ragged_ar += priced.packed("ragged AR step", "target", active, active, batch, 1)
    if tokens == 0 or committed == 0:
        raise ProfileError(NO_DECODE_STEPS)
    priced.accept(batch, profile.topology)          # counted for no system: logged
    log = priced.take_log()
    ar_seconds = ar_steps * plain
    out = []
    for layout, (seconds, verified) in figures.items():
        per_round = seconds / rounds_run
        row = {"system": f"{layout} adaptive", "batch_size": batch, "bound": bound,
               "token_budget": budget, "draft_cost": draft_cost,
               "tokens_per_round": 1 + accepted / committed,
               "mean_draft_length": drafted / committed,
               "verified_tokens_per_round": verified / rounds_run,
               "cost_per_round_steps": per_round / plain, "cost_per_round_ms": per_round * 1e3,
               "plain_step_ms": plain * 1e3, "speedup_vs_ar": ar_seconds / seconds,
               "rounds": rounds_run, "ar_steps": ar_steps, "tokens": tokens,
               "requests": len(batches) * batch, "label": label,
               "priced_from": {key: text for key, text in log.items()
                               if layout == "ragged" or "packed" not in key}}
        if layout == "ragged":
            row["speedup_vs_padded_adaptive"] = figures["padded"][0] / seconds
            row["ragged_ar_speedup_vs_padded_ar"] = ar_seconds / ragged_ar
            row["speedup_vs_ragged_ar"] = ragged_ar / seconds
        out.append(row)
    return out
