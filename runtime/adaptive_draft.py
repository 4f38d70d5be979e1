"""Per-request adaptive draft length under a batch token budget.

Each request keeps an exponential moving average of the drafts it had accepted per step and
drafts one more than that (so a request that keeps accepting everything grows), between 1 and
the chain's length. The batch then verifies at most `token_budget` tokens per step (each request's
root plus its drafts): while the sum is over budget, the longest chain is shortened (the later
request first on a tie), down to no drafts at all (a plain decoding step for that request).

The budget is where verification stops being memory-bound: below it a verification forward costs
about as much as a single token's (weights are read once whatever the token count); past it, each
extra token costs compute. `ridge_token_budget` computes that point for the cost model.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain

from .batch_layout import FeedLogits
from .row_tree import RowTree
from .tree_drafting import Active, expand_static

# Weight of the newest step in the moving average: half, so a request adapts within a few steps.
SMOOTHING = 0.5


def desired_length(ema: float, max_length: int) -> int:
    """One draft more than the recent mean acceptance, within 1..max_length."""
    return min(max_length, max(1, math.floor(ema) + 1))


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


def update_ema(ema: float, accepted: int, smoothing: float = SMOOTHING) -> float:
    return smoothing * accepted + (1.0 - smoothing) * ema


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
    """Chains whose length follows each request's acceptance, the batch within `token_budget`."""

    def __init__(self, topology: Chain, token_budget: int):
        if not isinstance(topology, Chain):
            raise SpecPilotError(f"per-request adaptive draft length adapts a chain; "
                                 f"got {topology}")
        if token_budget < 1:
            raise SpecPilotError(f"token budget must be at least 1, got {token_budget}")
        self.max_length = topology.k
        self.token_budget = token_budget
        self.max_nodes = topology.k
        self.scratch_nodes = topology.k

    def lengths(self, requests) -> List[int]:
        """This step's draft length of each request (a new request starts at the chain length)."""
        wanted = [desired_length(self.max_length if r.ema is None else r.ema, self.max_length)
                  for r in requests]
        return fit_budget(wanted, self.token_budget)

    def propose(self, drafter, cache, active: Active, requests, root_logits: FeedLogits,
                layout: str) -> Tuple[List[RowTree], int]:
        shapes = [Chain(n).shape() if n else RowTree.empty().shape for n in self.lengths(requests)]
        return expand_static(drafter, cache, active, shapes, root_logits, layout)

    def observe(self, request, tree: RowTree, accepted: int) -> None:
        if tree.num_nodes == 0:
            return  # the budget gave it no drafts: nothing learnt about its acceptance
        start = self.max_length if request.ema is None else request.ema
        request.ema = update_ema(start, accepted)
