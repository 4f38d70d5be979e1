"""Index tables of a static draft tree, computed once per decode, and the tree attention mask.

Slot layout shared by drafter and target during one speculative step of a request whose committed
sequence has C tokens: the root (the last committed token) sits at slot C-1 (== its position),
tree node i at slot C+i with position C-1+depth(i). Every node sees the committed prefix, the root
and its own ancestors; nothing else past the root.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import STATIC_TOPOLOGIES, Chain, SparseTree, Tree, TreeShape


def as_tree_shape(topology: Union[TreeShape, Chain, Tree, SparseTree]) -> TreeShape:
    """Accept a TreeShape or a static topology value (`Chain`, `Tree`, `SparseTree`) and return
    the TreeShape."""
    if isinstance(topology, TreeShape):
        return topology
    if isinstance(topology, STATIC_TOPOLOGIES):
        return topology.shape()
    raise SpecPilotError(f"expected a TreeShape, Chain, Tree or SparseTree as the draft "
                         f"topology, got {type(topology).__name__}")


@dataclass(frozen=True)
class TreePlan:
    """A TreeShape with the tables the decode loop needs, for trees in breadth-first order.

    levels[d-1]:    node indices of depth d (contiguous, increasing).
    parent_pos[i]:  index of node i's parent within the previous level (0 for the root).
    ancestors:      [N+1, N+1] bool; row/column 0 is the root, i+1 is node i; True where the
                    column is the row itself or one of its ancestors.
    """
    shape: TreeShape
    levels: Tuple[Tuple[int, ...], ...]
    parent_pos: Tuple[int, ...]
    child_lists: Tuple[Tuple[int, ...], ...]   # index 0: root's children, i+1: node i's
    ancestors: torch.Tensor
    depth_offsets: torch.Tensor                # [N+1] int64: 0 for the root, depths[i] for node i

    @classmethod
    def build(cls, topology: Union[TreeShape, Chain, Tree, SparseTree]) -> "TreePlan":
        shape = as_tree_shape(topology)
        n = shape.num_nodes
        if n == 0:
            raise SpecPilotError("the draft tree has no nodes: use at least chain(1)")
        for i, (p, d) in enumerate(zip(shape.parents, shape.depths)):
            parent_depth = 0 if p == -1 else shape.depths[p]
            if not -1 <= p < i or d != parent_depth + 1:
                raise SpecPilotError(f"tree node {i} (parent {p}, depth {d}) is not in "
                                     f"breadth-first order with depth = parent depth + 1")
        levels = tuple(tuple(i for i in range(n) if shape.depths[i] == d)
                       for d in range(1, shape.max_depth + 1))
        position_in_level = {i: j for level in levels for j, i in enumerate(level)}
        parent_pos = tuple(0 if p == -1 else position_in_level[p] for p in shape.parents)
        child_lists = tuple(tuple(sorted((i for i in range(n) if shape.parents[i] == node),
                                         key=lambda i: shape.ranks[i]))
                            for node in range(-1, n))
        ancestors = torch.zeros((n + 1, n + 1), dtype=torch.bool)
        ancestors[:, 0] = True
        for i in range(n):
            for a in shape.ancestors_or_self(i):
                ancestors[i + 1, a + 1] = True
        depth_offsets = torch.tensor((0,) + shape.depths, dtype=torch.int64)
        return cls(shape, levels, parent_pos, child_lists, ancestors, depth_offsets)

    @property
    def num_nodes(self) -> int:
        return self.shape.num_nodes

    def children(self, node: int) -> Tuple[int, ...]:
        """Children of `node` (-1 = root) in rank order."""
        return self.child_lists[node + 1]

    def branching(self, level: int) -> int:
        """How many drafter candidates the nodes of `levels[level]` need from their parents."""
        return 1 + max(self.shape.ranks[i] for i in self.levels[level])


def tree_mask(root_slots: torch.Tensor, ancestors: torch.Tensor, capacity: int) -> torch.Tensor:
    """[B, N+1, S] visibility of root + nodes over the cache, for roots at `root_slots` [B].

    Row 0 is the root, row i+1 node i; each sees every slot before its root, plus the root and
    its own ancestors at slots root+1+a."""
    device = root_slots.device
    b, width = root_slots.shape[0], ancestors.shape[0]
    s = torch.arange(capacity, device=device)[None, None, :]
    rel = s - root_slots[:, None, None]                        # slot relative to the root
    in_tree = (rel >= 0) & (rel < width)
    table = ancestors.to(device)[None].expand(b, width, width)
    tree_part = torch.gather(table, 2, rel.clamp(0, width - 1).expand(b, width, capacity))
    return (rel < 0) | (in_tree & tree_part)
