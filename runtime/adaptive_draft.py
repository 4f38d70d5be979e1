"""Per-request adaptive draft length under a batch token budget.

The length rule. Each request keeps two moving averages (weight `SMOOTHING` on the newest
round): of the drafts it had accepted per round, `a`, and of rejections per round, `r` (a round
had a rejection iff it accepted fewer drafts than it drafted). Greedy acceptance of a chain is a
run of per-draft trials that stops at the first failure, so a / (a + r) estimates the per-draft
acceptance probability alpha (accepted drafts over drafts actually tried). A new request starts
as if it had accepted a full chain and been rejected never (alpha = 1): optimistic, so a good
drafter is never held back while its estimate builds up. The next length L in 1..max_length
maximises the expected tokens per unit of round cost,

    E(L) / (1 + c L),   E(L) = 1 + alpha + ... + alpha^L = (1 - alpha^(L+1)) / (1 - alpha),

where E(L) counts the target's own token and c is one drafter step's cost relative to one
target verification (`DRAFT_STEP_COST` by default). With alpha = 1 the ratio (L + 1) / (1 + c L)
grows with L whenever c < 1, so a request whose drafts are all accepted drafts the full chain
at once, and after a bad spell it is back there within a few rounds (r halves every round
without a rejection). A drafter that is always wrong drives alpha to 0 and L to 1.

Why not "one more than the mean accepted drafts" (the rule this replaces): accepted drafts
never exceed the length drafted, so that mean approaches L only from below and floor(mean) + 1
almost never grows past L. Any rejection shrank L, and recovery took dozens of rounds or never
came (a perfect drafter stuck at L = 1 sees a mean of 1 - 2^-n, so it keeps drafting one). On
a real pair that cut the mean accepted length of chain(4) from 4.0 to 2.2.

The budget. The batch verifies at most `token_budget` tokens per step (each request's root plus
its drafts): while the sum is over budget, the longest chain is shortened (the later request
first on a tie), down to no drafts at all (a plain decoding step for that request). The budget
is where verification stops being memory-bound: below it a verification forward costs about as
much as a single token's (weights are read once whatever the token count); past it, each extra
token costs compute. `ridge_token_budget` computes that point for the cost model.

The estimate is written once, on tensors (`update_acceptance`, `acceptance_rate`,
`expected_tokens`), so the graphed decoder's batch-length policy (runtime/batch_length.py)
runs the same arithmetic inside its captured round without a host sync.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain

from .batch_layout import FeedLogits
from .row_tree import RowTree
from .tree_drafting import Active, expand_static

# Weight of the newest round in the moving averages: half, so a request adapts within a few
# rounds.
SMOOTHING = 0.5

# One drafter step's time relative to one target verification forward (c in E(L) / (1 + c L)).
# In memory-bound decoding a forward costs about its weight bytes plus fixed per-forward work
# (kernel launches, norms, attention over the KV cache) that does not shrink with the model, so
# a drafter costs more than its parameter ratio (about 1/8 for a 1B drafter of an 8B target).
# 0.25 sits above that ratio for typical pairs; pass a measured ratio where one is known. With
# it a request drafts the full chain of 4 from alpha of about 0.81 up (where chain(4) accepts
# about 3.4 tokens per round) and a single draft below about 0.56.
DRAFT_STEP_COST = 0.25


def update_acceptance(accepted_avg, rejected_avg, accepted, drafted,
                      smoothing: float = SMOOTHING):
    """The moving averages (accepted drafts, rejections) after a round that accepted
    `accepted` of `drafted` drafts (drafted >= 1). Works on floats or on tensors alike (no
    host sync). accepted + rejected is at least 1 every round, so a + r stays >= 1 when it
    starts there, and `acceptance_rate` never divides by zero."""
    rejected = accepted < drafted
    return (smoothing * accepted + (1.0 - smoothing) * accepted_avg,
            smoothing * rejected + (1.0 - smoothing) * rejected_avg)


def acceptance_rate(accepted_avg, rejected_avg):
    """The per-draft acceptance probability a / (a + r) (floats or tensors)."""
    return accepted_avg / (accepted_avg + rejected_avg)


# Standard deviations above the mean acceptance at which the length rule judges a turn-off
# (runtime/batch_length.py, runtime/workload_memory.py).
OFF_CONFIDENCE = 2.0


def upper_acceptance(accepted: torch.Tensor, rejected: torch.Tensor,
                     z: float = OFF_CONFIDENCE) -> torch.Tensor:
    """An upper confidence bound on the per-draft acceptance of requests that accepted
    `accepted` drafts and met `rejected` rejections: the mean of Beta(accepted + 1,
    rejected + 1) plus `z` standard deviations, at most 1. Tensor operations only."""
    a, r = accepted + 1.0, rejected + 1.0
    mean = a / (a + r)
    spread = torch.sqrt(mean * (1.0 - mean) / (a + r + 1.0))
    return (mean + z * spread).clamp(max=1.0)


def check_draft_cost(draft_cost: float) -> float:
    """`draft_cost` as a float, or a SpecPilotError unless it is finite and >= 0."""
    if not 0.0 <= draft_cost < float("inf"):
        raise SpecPilotError(f"a drafter step's relative cost must be finite and >= 0, "
                             f"got {draft_cost}")
    return float(draft_cost)


def expected_tokens(alpha: torch.Tensor, max_length: int) -> torch.Tensor:
    """[..., max_length + 1]: E(L) = 1 + alpha + ... + alpha^L, the tokens a chain of L drafts
    commits per round (its target's own token included), for L = 0..max_length and each
    acceptance probability in `alpha` (any shape). Summed, so exact at alpha = 1; pure tensor
    operations, safe inside a captured CUDA graph."""
    powers = torch.arange(max_length + 1, device=alpha.device, dtype=alpha.dtype)
    return torch.cumsum(alpha[..., None] ** powers, dim=-1)


def best_lengths(alpha: torch.Tensor, max_length: int,
                 draft_cost: float = DRAFT_STEP_COST) -> torch.Tensor:
    """For each acceptance probability in `alpha` (any shape, values in 0..1), the length L in
    1..max_length maximising E(L) / (1 + draft_cost * L) (int64, alpha's shape and device; the
    shortest on a tie)."""
    lengths = torch.arange(1, max_length + 1, device=alpha.device, dtype=alpha.dtype)
    value = expected_tokens(alpha, max_length)[..., 1:] / (1.0 + draft_cost * lengths)
    return value.argmax(dim=-1) + 1


@dataclass(frozen=True)
class AcceptanceEstimate:
    """One request's moving averages of accepted drafts and of rejections per round."""
    accepted: float
    rejected: float

    @classmethod
    def fresh(cls, max_length: int) -> "AcceptanceEstimate":
        """The prior: as if a full chain of `max_length` had just been accepted (alpha = 1)."""
        return cls(float(max_length), 0.0)

    @property
    def alpha(self) -> float:
        return acceptance_rate(self.accepted, self.rejected)

    def after(self, accepted: int, drafted: int,
              smoothing: float = SMOOTHING) -> "AcceptanceEstimate":
        """The estimate once a round accepted `accepted` of `drafted` (>= 1) drafts."""
        return AcceptanceEstimate(*update_acceptance(self.accepted, self.rejected, accepted,
                                                     drafted, smoothing))


def fit_budget(lengths: Sequence[int], token_budget: int) -> List[int]:
    """Shorten the longest chains until sum(1 + length) <= token_budget (lengths may reach 0;
    the roots alone always fit, the IR requires token_budget >= max batch size)."""
    out = list(lengths)
    total = sum(1 + n for n in out)
    while total > token_budget:
        longest = max(range(len(out)), key=lambda i: (out[i], i))
        if out[longest] == 0:
            break
        out[longest] -= 1
        total -= 1
    return out


def ridge_token_budget(peak_flops: float, bandwidth: float, weight_bytes: float,
                       flops_per_token: float, kv_bytes: float = 0.0,
                       batch_size: int = 1) -> int:
    """Tokens per verification forward at which it turns compute-bound.

    A forward over T tokens moves `weight_bytes` + `kv_bytes` (the batch's KV cache reads) and
    does T * `flops_per_token`; it is memory-bound while T * flops_per_token / peak_flops <
    bytes / bandwidth. Returns that T (at least `batch_size`, so every request verifies its root).
    """
    if min(peak_flops, bandwidth, flops_per_token) <= 0 or weight_bytes < 0 or kv_bytes < 0:
        raise SpecPilotError("ridge_token_budget needs positive peak FLOP/s, bandwidth and FLOPs "
                             "per token, and non-negative byte counts")
    ridge = peak_flops * (weight_bytes + kv_bytes) / (bandwidth * flops_per_token)
    return max(batch_size, int(ridge))


class AdaptiveChainProposer:
    """Chains whose length follows each request's estimated acceptance (`best_lengths`), the
    batch within `token_budget`. A request's `AcceptanceEstimate` lives in its `ema` field."""

    def __init__(self, topology: Chain, token_budget: int,
                 draft_cost: float = DRAFT_STEP_COST):
        if not isinstance(topology, Chain):
            raise SpecPilotError(f"per-request adaptive draft length adapts a chain; "
                                 f"got {topology}")
        if token_budget < 1:
            raise SpecPilotError(f"token budget must be at least 1, got {token_budget}")
        self.max_length = topology.k
        self.token_budget = token_budget
        self.draft_cost = check_draft_cost(draft_cost)
        self.max_nodes = topology.k
        self.scratch_nodes = topology.k

    def estimate(self, request) -> AcceptanceEstimate:
        """The request's estimate (the optimistic prior before its first drafted round)."""
        return AcceptanceEstimate.fresh(self.max_length) if request.ema is None else request.ema

    def lengths(self, requests) -> List[int]:
        """This step's draft length of each request (a new request starts at the chain length)."""
        alpha = torch.tensor([self.estimate(r).alpha for r in requests], dtype=torch.float64)
        wanted = best_lengths(alpha, self.max_length, self.draft_cost).tolist()
        return fit_budget(wanted, self.token_budget)

    def propose(self, drafter, cache, active: Active, requests, root_logits: FeedLogits,
                layout: str) -> Tuple[List[RowTree], int]:
        shapes = [Chain(n).shape() if n else RowTree.empty().shape for n in self.lengths(requests)]
        return expand_static(drafter, cache, active, shapes, root_logits, layout)

    def observe(self, request, tree: RowTree, accepted: int) -> None:
        if tree.num_nodes == 0:
            return  # the budget gave it no drafts: nothing learnt about its acceptance
        request.ema = self.estimate(request).after(accepted, tree.num_nodes)
