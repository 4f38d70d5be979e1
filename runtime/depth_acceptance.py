"""Per-depth acceptance: the batch-length rule's second estimate of what a chain of L drafts
commits (runtime/batch_length.py, `estimator="per_depth"`).

The default estimate (runtime/adaptive_draft.py) has one acceptance probability alpha per
request and prices a chain of L as E(L) = 1 + alpha + ... + alpha^L: every draft an independent
trial with the same odds. On the H200 pairs' HumanEval profiles they are not. In run 38's
chain(4) profile at batch 64, the three slowest requests accepted the first draft of a round in
59, 48 and 66 % of rounds, the second (after an accepted first) in 41, 97 and 57 %, the third in
3, 0 and 6 %: two drafts pay and the third never does. One alpha (0.46-0.52 for them) cannot
say that. On that batch the rule ran 164 of its 192 rounds at one draft and lost to plain
steps (0.94x strong AR; BENCHMARKS.md, nineteenth set). Replayed at the prices that reproduce
that loss, this estimate does not turn it into a gain (0.95x either way); the replays gained
at batch 1-16 (BENCHMARKS.md, twentieth set), but on the H200 (runs 43 and 44, batch 16 and
64, twenty-first set) it ran even with the one-alpha estimate or up to 6 % slower, so it is an
option, not the default.

So each request keeps, per depth d = 1..cap, the rate at which the d-th draft was accepted when
it was tried (drafted, and every draft before it accepted): p_d. A chain of L then commits

    E(L) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_L

tokens a round, the target's own token included. The rates are moving averages with weight
`DEPTH_SMOOTHING` on the newest trial (1 at first: optimistic, as the default estimate starts),
updated at the depths a round tried. A depth a round did not try keeps its rate, with one
exception: a round that accepted every draft it drafted moves the depths past its length
toward 1. Left alone, a depth the rule stopped drafting would keep whatever rejections it met
last, and the rule would never try it again: replayed on run 38's profile at batch 4 with
refill, chains settled at three drafts and ran 0.84x the one-alpha rule. A fully accepted
chain is what raises the one-alpha estimate too. Whole-history counts of tries and acceptances
per depth give the upper bound a turn-off is judged by, as the default's do. Tensor operations
only: the update runs inside a captured round.
"""
from __future__ import annotations

from typing import Tuple

import torch

# The newest trial's weight in a depth's moving average. Lower than the one-alpha estimate's
# (adaptive_draft.SMOOTHING, 0.5): each depth sees one 0/1 trial a round, where alpha sums a
# round's accepted drafts and rejection. Replayed on the H200 pairs' chain(4) profiles, 0.5
# swung the lengths with every rejection and lost to the one-alpha rule at batch 1; 0.2 did
# not (bench/turn_off_sweep.py --estimator).
DEPTH_SMOOTHING = 0.2


def depth_trials(accepted: torch.Tensor, drafted: torch.Tensor, ran: torch.Tensor,
                 cap: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tried, took, past_full) [batch, cap] bool, for the rows in `ran`: whether a round that
    accepted `accepted` of `drafted` drafts tried depth d (d <= drafted and every draft before
    it accepted: d <= accepted + 1), accepted it (d <= accepted), or did not draft it after
    accepting every draft it did (d > drafted = accepted)."""
    depth = torch.arange(1, cap + 1, device=accepted.device)[None, :]
    tried = ran[:, None] & (depth <= drafted[:, None]) & (depth <= accepted[:, None] + 1)
    past_full = (ran & (accepted == drafted))[:, None] & (depth > drafted[:, None])
    return tried, tried & (depth <= accepted[:, None]), past_full


def update_depth_rates(rates: torch.Tensor, tried: torch.Tensor, took: torch.Tensor,
                       past_full: torch.Tensor,
                       smoothing: float = DEPTH_SMOOTHING) -> torch.Tensor:
    """The per-depth moving averages after one round's trials: a tried depth toward whether it
    was accepted, a depth past a fully accepted chain toward 1, any other kept."""
    target = torch.where(tried, took.to(rates.dtype), torch.ones_like(rates))
    return torch.where(tried | past_full, (1.0 - smoothing) * rates + smoothing * target, rates)


def depth_expected_tokens(rates: torch.Tensor) -> torch.Tensor:
    """[..., cap + 1]: E(L) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_L for L = 0..cap, from the
    per-depth acceptance rates [..., cap]."""
    reach = torch.cumsum(torch.cumprod(rates, dim=-1), dim=-1)
    return torch.cat([torch.ones_like(rates[..., :1]), 1.0 + reach], dim=-1)
