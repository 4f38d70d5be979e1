"""Acceptance rules: which drafted tree path the target agrees with, and the bonus token.

A rule is a function `(plan, node_tokens, target_logits) -> AcceptedPath` for ONE request:
`node_tokens[i]` is the drafter's token at tree node i, `target_logits` [N+1, V] the target's
logits at the root (row 0) and at every node (row i+1). The decode loop emits the tokens of
`path` followed by `bonus`, so a rule decides everything the request commits in one step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import torch

from .tree_plan import TreePlan


@dataclass(frozen=True)
class AcceptedPath:
    nodes: Tuple[int, ...]   # accepted tree nodes, root's child first (each the previous' child)
    bonus: int               # the target's token after the last accepted node

    @property
    def length(self) -> int:
        return len(self.nodes)


def greedy_accept(plan: TreePlan, node_tokens: Sequence[int],
                  target_logits: torch.Tensor) -> AcceptedPath:
    """Greedy longest match: from the root, step to the child whose token is the target's argmax
    at the current node, until no child matches; the bonus is the argmax at the last node.

    Every emitted token is the target's own greedy choice given the tokens before it, so the
    output equals plain greedy decoding (up to how the target's kernels round)."""
    predictions = torch.argmax(target_logits, dim=-1).tolist()
    nodes, current = [], -1
    while True:
        want = predictions[current + 1]
        nxt = next((c for c in plan.children(current) if node_tokens[c] == want), None)
        if nxt is None:
            return AcceptedPath(tuple(nodes), want)
        nodes.append(nxt)
        current = nxt
