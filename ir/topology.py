"""Verification topologies: how the drafted tokens of one step are laid out for the target.

`Chain(k)`: k drafted tokens in a line. `Tree(branching)`: at depth d every node has
`branching[d]` children, the drafter's top-`branching[d]` tokens after that node. A chain is the
tree with branching (1,)*k, and both flatten to a `TreeShape` that the runtime consumes.
`SparseTree(paths)`: a static tree of any shape (e.g. shaped from measured acceptance), also a
`TreeShape`. `DynamicTree(budget, depth, width)`: no static shape; the drafter picks the tree
every step, and the runtime receives it as data (parent indices), never as a compiled-in shape.
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

    @property
    def num_nodes(self) -> int:
        return self.k

    def level_widths(self) -> Tuple[int, ...]:
        """Nodes per depth, depth 1 first."""
        return (1,) * self.k

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

    def level_widths(self) -> Tuple[int, ...]:
        """Nodes per depth, depth 1 first."""
        widths, width = [], 1
        for b in self.branching:
            width *= b
            widths.append(width)
        return tuple(widths)

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


@dataclass(frozen=True)
class SparseTree:
    """A static tree of any shape, e.g. one shaped from measured acceptance.

    Each node is named by its rank path from the root: (0,) is the root's top-1 child, (0, 1)
    that child's second most probable child. The paths are kept sorted by (depth, path), which
    is breadth-first order with siblings by rank, so equal trees have one spelling. The set must
    be prefix-closed (a node's parent is present) and rank-closed (rank r>0 only beside r-1).
    """
    paths: Tuple[Tuple[int, ...], ...]

    def __post_init__(self):
        p = self.paths
        if not isinstance(p, tuple) or not p:
            raise IRError(f"sparse tree paths must be a non-empty tuple of rank paths, got {p!r}")
        for path in p:
            if (not isinstance(path, tuple) or not path
                    or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in path)):
                raise IRError(f"each sparse tree path must be a non-empty tuple of ranks >= 0, "
                              f"got {path!r}")
        if len(set(p)) != len(p):
            raise IRError("sparse tree paths list a node twice")
        if len(p) > MAX_TREE_NODES:
            raise IRError(f"sparse tree has {len(p)} nodes, more than {MAX_TREE_NODES}")
        present = set(p)
        for path in p:
            if len(path) > MAX_DRAFT_LENGTH:
                raise IRError(f"sparse tree depth {len(path)} exceeds {MAX_DRAFT_LENGTH}")
            if len(path) > 1 and path[:-1] not in present:
                raise IRError(f"sparse tree node {list(path)} has no parent {list(path[:-1])}")
            if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in present:
                raise IRError(f"sparse tree node {list(path)} has no elder sibling "
                              f"{list(path[:-1] + (path[-1] - 1,))}: a parent's children are "
                              "its top-1, top-2, ... drafter tokens")
        object.__setattr__(self, "paths", tuple(sorted(p, key=lambda q: (len(q), q))))

    @property
    def depth(self) -> int:
        return max(len(q) for q in self.paths)

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    def level_widths(self) -> Tuple[int, ...]:
        """Nodes per depth, depth 1 first."""
        return tuple(sum(1 for q in self.paths if len(q) == d) for d in range(1, self.depth + 1))

    def shape(self) -> TreeShape:
        index = {q: i for i, q in enumerate(self.paths)}
        return TreeShape(parents=tuple(index[q[:-1]] if len(q) > 1 else -1 for q in self.paths),
                         ranks=tuple(q[-1] for q in self.paths),
                         depths=tuple(len(q) for q in self.paths))

    @classmethod
    def from_shape(cls, shape: TreeShape) -> "SparseTree":
        """The SparseTree of a TreeShape whose sibling ranks are 0, 1, 2, ..."""
        paths = []
        for i in range(shape.num_nodes):
            paths.append(tuple(shape.ranks[a] for a in shape.ancestors_or_self(i)))
        return cls(tuple(paths))

    def regular(self) -> Union["Chain", "Tree", None]:
        """The Chain or Tree with exactly this shape, or None when the tree is irregular."""
        children: dict = {}
        for q in self.paths:
            children[q[:-1]] = children.get(q[:-1], 0) + 1
        branching = []
        for d in range(self.depth):
            level = [()] if d == 0 else [q for q in self.paths if len(q) == d]
            counts = {children.get(q, 0) for q in level}
            if len(counts) != 1:
                return None
            branching.append(counts.pop())
        if all(b == 1 for b in branching):
            return Chain(len(branching))
        return Tree(tuple(branching))

    def to_json(self) -> dict:
        return {"kind": "sparse_tree", "paths": [list(q) for q in self.paths]}

    def __str__(self) -> str:
        return f"sparse_tree({[list(q) for q in self.paths]})"


@dataclass(frozen=True)
class DynamicTree:
    """A tree chosen anew every step from the drafter's confidence, `budget` nodes at most.

    The drafter expands `depth` levels; at each level it keeps the `width` candidates (children
    of the kept nodes of the level above, each parent offering its top-`width` tokens) with the
    highest cumulative drafter log-probability. Of all kept nodes, the `budget` most probable
    (an ancestor always ranks before its descendants) form the tree the target verifies, so
    verification always has the shape root + `budget` nodes whatever the tree looks like.
    """
    budget: int
    depth: int
    width: int

    def __post_init__(self):
        for name in ("budget", "depth", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise IRError(f"dynamic tree {name} must be an integer >= 1, got {value!r}")
        if self.depth > MAX_DRAFT_LENGTH:
            raise IRError(f"dynamic tree depth {self.depth} exceeds {MAX_DRAFT_LENGTH}")
        if self.depth * self.width > MAX_TREE_NODES:
            raise IRError(f"dynamic tree drafts depth x width = {self.depth * self.width} "
                          f"candidates, more than {MAX_TREE_NODES}")
        if not self.width <= self.budget <= self.depth * self.width:
            raise IRError(f"dynamic tree budget must be in width..depth*width "
                          f"({self.width}..{self.depth * self.width}), got {self.budget}")

    @property
    def num_nodes(self) -> int:
        return self.budget

    def level_widths(self) -> Tuple[int, ...]:
        """Candidates kept per depth (what each drafter level forward runs on)."""
        return (self.width,) * self.depth

    def to_json(self) -> dict:
        return {"kind": "dynamic_tree", "budget": self.budget, "depth": self.depth,
                "width": self.width}

    def __str__(self) -> str:
        return f"dynamic_tree(budget={self.budget}, depth={self.depth}, width={self.width})"


Topology = Union[Chain, Tree, SparseTree, DynamicTree]
STATIC_TOPOLOGIES = (Chain, Tree, SparseTree)
TOPOLOGIES = (Chain, Tree, SparseTree, DynamicTree)
TOPOLOGY_KINDS = ("chain", "tree", "sparse_tree", "dynamic_tree")
TOPOLOGY_NAMES = "Chain, Tree, SparseTree or DynamicTree"


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
    if kind == "sparse_tree":
        paths = obj.get("paths")
        if set(obj) != {"kind", "paths"} or not isinstance(paths, list) \
                or not all(isinstance(q, list) for q in paths):
            raise IRError(f"sparse_tree topology takes exactly 'paths' (a list of lists), "
                          f"got {obj!r}")
        return SparseTree(tuple(tuple(q) for q in paths))
    if kind == "dynamic_tree":
        if set(obj) != {"kind", "budget", "depth", "width"}:
            raise IRError(f"dynamic_tree topology takes exactly 'budget', 'depth' and 'width', "
                          f"got keys {sorted(obj)}")
        return DynamicTree(obj["budget"], obj["depth"], obj["width"])
    raise IRError(f"unknown topology kind {kind!r} (known: {', '.join(TOPOLOGY_KINDS)})")
