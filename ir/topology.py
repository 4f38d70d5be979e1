"""Verification topologies: how the drafted tokens of one step are laid out for the target.

`Chain(k)`: k drafted tokens in a line. `Tree(branching)`: at depth d every node has
`branching[d]` children, the drafter's top-`branching[d]` tokens after that node. A chain is the
tree with branching (1,)*k, and both flatten to a `TreeShape` that the runtime consumes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

from .errors import IRError

MAX_DRAFT_LENGTH = 64
MAX_TREE_NODES = 512


@dataclass(frozen=True)
class TreeShape:
    """A static draft tree in breadth-first order, the root (last committed token) excluded.

    parents[i]: index of node i's parent, -1 for a child of the root; parents come first.
    ranks[i]:   node i is its parent's ranks[i]-th most probable drafter token (0 = top-1).
    depths[i]:  1 for children of the root.
    """
    parents: Tuple[int, ...]
    ranks: Tuple[int, ...]
    depths: Tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> Tuple[int, ...]:
        """Children of `node` (-1 = root) in rank order."""
        return tuple(i for i, p in enumerate(self.parents) if p == node)

    def ancestors_or_self(self, node: int) -> Tuple[int, ...]:
        out = []
        while node != -1:
            out.append(node)
            node = self.parents[node]
        return tuple(reversed(out))


@dataclass(frozen=True)
class Chain:
    k: int

    def __post_init__(self):
        if not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= MAX_DRAFT_LENGTH:
            raise IRError(f"chain length must be an integer in 1..{MAX_DRAFT_LENGTH}, got {self.k!r}")

    @property
    def depth(self) -> int:
        return self.k

    def shape(self) -> TreeShape:
        return TreeShape(parents=tuple(range(-1, self.k - 1)), ranks=(0,) * self.k,
                         depths=tuple(range(1, self.k + 1)))

    def to_json(self) -> dict:
        return {"kind": "chain", "k": self.k}

    def __str__(self) -> str:
        return f"chain({self.k})"


@dataclass(frozen=True)
class Tree:
    branching: Tuple[int, ...]

    def __post_init__(self):
        b = self.branching
        if not isinstance(b, tuple) or not b:
            raise IRError(f"tree branching must be a non-empty tuple of integers, got {b!r}")
        if len(b) > MAX_DRAFT_LENGTH:
            raise IRError(f"tree depth {len(b)} exceeds {MAX_DRAFT_LENGTH}")
        for x in b:
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise IRError(f"tree branching factors must be integers >= 1, got {b!r}")
        if self.num_nodes > MAX_TREE_NODES:
            raise IRError(f"tree {list(b)} has {self.num_nodes} nodes, more than {MAX_TREE_NODES}")

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def num_nodes(self) -> int:
        total, width = 0, 1
        for b in self.branching:
            width *= b
            total += width
        return total

    def shape(self) -> TreeShape:
        parents, ranks, depths = [], [], []
        frontier = [-1]
        for d, b in enumerate(self.branching, start=1):
            nxt = []
            for p in frontier:
                for r in range(b):
                    parents.append(p)
                    ranks.append(r)
                    depths.append(d)
                    nxt.append(len(parents) - 1)
            frontier = nxt
        return TreeShape(tuple(parents), tuple(ranks), tuple(depths))

    def to_json(self) -> dict:
        return {"kind": "tree", "branching": list(self.branching)}

    def __str__(self) -> str:
        return f"tree({list(self.branching)})"


Topology = Union[Chain, Tree]


def topology_from_json(obj) -> Topology:
    if not isinstance(obj, dict) or "kind" not in obj:
        raise IRError(f"topology must be an object with a 'kind', got {obj!r}")
    kind = obj["kind"]
    if kind == "chain":
        if set(obj) != {"kind", "k"}:
            raise IRError(f"chain topology takes exactly 'k', got keys {sorted(obj)}")
        return Chain(obj["k"])
    if kind == "tree":
        if set(obj) != {"kind", "branching"} or not isinstance(obj["branching"], list):
            raise IRError(f"tree topology takes exactly 'branching' (a list), got {obj!r}")
        return Tree(tuple(obj["branching"]))
    raise IRError(f"unknown topology kind {kind!r} (known: chain, tree)")
