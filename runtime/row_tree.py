"""One request's draft tree for one step, as data.

Static topologies give every request the same shape; a dynamic tree, a pruned tree or a chain
of per-request length differs from request to request and from step to step. The kernels
therefore take the tree as data (parent indices, from which the attention mask and the accept
walk are derived), never as a compiled-in shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence, Tuple

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import TreeShape

from .tree_plan import TreePlan


@dataclass(frozen=True)
class RowTree:
    """Node i: `tokens[i]`, parent `parents[i]` (-1: the root, i.e. the last committed token),
    depth `depths[i]` (1 under the root), rank `ranks[i]` among its parent's drafter candidates.

    Breadth-first: a parent comes before its children and depths never decrease. Construction
    checks this, so a tree with a wrong parent index fails here rather than in a kernel.
    """
    tokens: Tuple[int, ...]
    parents: Tuple[int, ...]
    depths: Tuple[int, ...]
    ranks: Tuple[int, ...]

    def __post_init__(self):
        n = len(self.tokens)
        if not len(self.parents) == len(self.depths) == len(self.ranks) == n:
            raise SpecPilotError(f"row tree fields disagree in length: {len(self.tokens)} tokens, "
                                 f"{len(self.parents)} parents, {len(self.depths)} depths, "
                                 f"{len(self.ranks)} ranks")
        last_depth = 1
        for i, (p, d) in enumerate(zip(self.parents, self.depths)):
            parent_depth = 0 if p == -1 else self.depths[p] if 0 <= p < i else None
            if parent_depth is None or d != parent_depth + 1 or d < last_depth:
                raise SpecPilotError(f"row tree node {i} (parent {p}, depth {d}) is not in "
                                     "breadth-first order with depth = parent depth + 1")
            last_depth = d

    @classmethod
    def empty(cls) -> "RowTree":
        return cls((), (), (), ())

    @classmethod
    def from_shape(cls, shape: TreeShape, tokens: Sequence[int]) -> "RowTree":
        return cls(tuple(int(t) for t in tokens), shape.parents, shape.depths, shape.ranks)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return self.shape.max_depth

    @cached_property
    def shape(self) -> TreeShape:
        return TreeShape(self.parents, self.ranks, self.depths)

    @cached_property
    def plan(self) -> TreePlan:
        """The TreePlan acceptance rules walk (needs at least one node)."""
        return TreePlan.build(self.shape)

    def ancestors_or_self(self, node: int) -> Tuple[int, ...]:
        return self.shape.ancestors_or_self(node)

    def children(self, node: int) -> Tuple[int, ...]:
        """Children of `node` (-1 = root) in rank order."""
        return tuple(sorted(self.shape.children(node), key=lambda i: self.ranks[i]))

    def subtree(self, keep: Sequence[int]) -> "RowTree":
        """The tree of nodes `keep` (each kept node's parent kept too), re-indexed in order."""
        keep = sorted(set(keep))
        new_index = {old: new for new, old in enumerate(keep)}
        parents = []
        for old in keep:
            p = self.parents[old]
            if p != -1 and p not in new_index:
                raise SpecPilotError(f"subtree keeps node {old} but not its parent {p}")
            parents.append(-1 if p == -1 else new_index[p])
        return RowTree(tuple(self.tokens[i] for i in keep), tuple(parents),
                       tuple(self.depths[i] for i in keep), tuple(self.ranks[i] for i in keep))
