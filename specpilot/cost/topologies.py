"""The static topologies the cost model and the topology agent consider: chains and trees whose
branching does not grow with depth (a wider level under a narrower one never pays: its extra
nodes hang under drafts that are less likely to be accepted)."""
from __future__ import annotations

from itertools import product
from typing import List, Tuple

from specpilot.ir.topology import Chain, Tree

MAX_CHAIN = 8
MAX_TREE_DEPTH = 6
MAX_BRANCHING = 4
MAX_TREE_NODES = 64


def candidate_chains(max_k: int = MAX_CHAIN) -> List[Chain]:
    return [Chain(k) for k in range(1, max_k + 1)]


def candidate_trees(max_depth: int = MAX_TREE_DEPTH, max_branching: int = MAX_BRANCHING,
                    max_nodes: int = MAX_TREE_NODES) -> List[Tree]:
    """Trees with non-increasing branching, at least one branch, at most `max_nodes` nodes."""
    out = []
    for depth in range(1, max_depth + 1):
        for branching in product(range(max_branching, 0, -1), repeat=depth):
            if list(branching) != sorted(branching, reverse=True) or branching[0] == 1:
                continue
            nodes, width = 0, 1
            for b in branching:
                width *= b
                nodes += width
            if nodes <= max_nodes:
                out.append(Tree(tuple(branching)))
    return out


def candidate_topologies() -> Tuple:
    """Every chain and tree the search considers, chains first."""
    return tuple(candidate_chains()) + tuple(candidate_trees())


# Tree sizes the Sequoia-style shaping is asked for (drafted nodes).
SHAPED_SIZES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


def shaped_topologies(acceptance, max_depth: int = MAX_TREE_DEPTH,
                      max_rank: int = MAX_BRANCHING) -> Tuple:
    """The best static tree of each size and depth limit for a measured rank profile
    (runtime/sequoia.py's dynamic programme), as Chain/Tree when regular, else SparseTree;
    nothing for an acceptance model without ranks."""
    ranks = getattr(acceptance, "ranks", None)
    if not ranks:
        return ()
    cached = _SHAPED.get(id(acceptance))
    if cached is not None and cached[0] is acceptance:
        return cached[1]
    from specpilot.ir.topology import SparseTree
    from specpilot.runtime.sequoia import RankTrace, optimal_trees, profile_from_trace

    profile = profile_from_trace(RankTrace(tuple(tuple(r) for r in ranks)), max_depth, max_rank)
    out, seen = [], set()
    for depth in range(1, max_depth + 1):
        best = optimal_trees(profile, max(SHAPED_SIZES), depth)
        for n in SHAPED_SIZES:
            _, paths = best[n]
            if not paths:
                continue
            tree = SparseTree(tuple(paths))
            topology = tree.regular() or tree
            if topology not in seen:
                seen.add(topology)
                out.append(topology)
    if len(_SHAPED) >= 8:
        _SHAPED.clear()
    _SHAPED[id(acceptance)] = (acceptance, tuple(out))
    return tuple(out)


# id(acceptance) -> (acceptance, shapes): the shaping takes about a second and a search asks for
# it every round; the acceptance is kept so a reused id cannot return another profile's shapes.
_SHAPED: dict = {}


def dynamic_variants(topologies) -> Tuple:
    """A dynamic tree with the budget, depth and width of each static tree (widths above one)."""
    from specpilot.ir.errors import IRError
    from specpilot.ir.topology import DynamicTree

    out, seen = [], set()
    for t in topologies:
        widths = t.level_widths()
        shape = t.shape()
        width = 1 + max(shape.ranks)
        if width < 2:
            continue
        try:
            dynamic = DynamicTree(t.num_nodes, len(widths), width)
        except IRError:
            continue
        if dynamic not in seen:
            seen.add(dynamic)
            out.append(dynamic)
    return tuple(out)
