"""The drafter's half of a mechanism step: catch up, then propose a tree per request as data.

A proposer turns the drafter's logits at each request's root into a `RowTree` per request.
`StaticProposer` fills one fixed shape (chain, tree or sparse tree) for every request;
runtime/dynamic_tree.py and runtime/adaptive_draft.py propose trees that differ per request.
All drafter forwards go through `run_feeds`, so they follow the batch layout too.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from specpilot.ir.topology import TreeShape

from .batch_layout import FeedLogits, feed, run_feeds
from .row_tree import RowTree
from .tree_plan import as_tree_shape

# (cache row, committed tokens) of each request that takes part in a step
Active = Sequence[Tuple[int, List[int]]]


def catch_up(model, cache, active: Active, cached_lengths: Sequence[int],
             layout: str) -> FeedLogits:
    """Feed each request's committed tokens that `model`'s cache lacks (at least the root, so
    cached_lengths[i] < len(committed)); returns the logits at each root (feed i = active i)."""
    feeds = [feed(row, committed[n:], n) for (row, committed), n in zip(active, cached_lengths)]
    return run_feeds(model, cache, feeds, layout)


def expand_static(drafter, cache, active: Active, shapes: Sequence[TreeShape],
                  root_logits: FeedLogits, layout: str) -> Tuple[List[RowTree], int]:
    """Fill request i's static `shapes[i]` with drafter tokens, level by level.

    Node j's token is the ranks[j]-th most probable drafter token after its parent. The nodes
    of depth d that have children run through the drafter in one forward (at their tree slots,
    under the tree mask) to propose depth d+1. Returns the trees and the forwards run.
    """
    tokens = [[0] * s.num_nodes for s in shapes]
    # logits of each request's nodes whose children are still to be drafted; -1 is the root
    parent_logits: List[Dict[int, torch.Tensor]] = [{-1: root_logits[i][-1]}
                                                    for i in range(len(shapes))]
    forwards = 0
    depth = 1
    while True:
        feeds, fed = [], []
        for i, ((row, committed), shape) in enumerate(zip(active, shapes)):
            level = [j for j in range(shape.num_nodes) if shape.depths[j] == depth]
            if not level:
                continue
            _fill_level(tokens[i], shape, level, parent_logits[i])
            has_children = sorted({shape.parents[j] for j in range(shape.num_nodes)
                                   if shape.depths[j] == depth + 1})
            if has_children:
                partial = RowTree.from_shape(shape, tokens[i])
                feeds.append(feed(row, [], len(committed), partial, has_children, logits_from=0))
                fed.append((i, has_children))
        if not feeds:
            break
        logits = run_feeds(drafter, cache, feeds, layout)
        forwards += 1
        for f, (i, nodes) in enumerate(fed):
            parent_logits[i] = dict(zip(nodes, logits[f]))
        depth += 1
    return [RowTree.from_shape(s, t) for s, t in zip(shapes, tokens)], forwards


def _fill_level(tokens: List[int], shape: TreeShape, level: Sequence[int],
                parent_logits: Dict[int, torch.Tensor]) -> None:
    needed: Dict[int, int] = {}
    for j in level:
        p = shape.parents[j]
        needed[p] = max(needed.get(p, 0), shape.ranks[j] + 1)
    top = {p: torch.topk(parent_logits[p], k).indices.tolist() for p, k in needed.items()}
    for j in level:
        tokens[j] = top[shape.parents[j]][shape.ranks[j]]


class StaticProposer:
    """Every request drafts the same static shape (Chain, Tree, SparseTree or a TreeShape)."""

    def __init__(self, topology):
        self.shape = as_tree_shape(topology)
        self.max_nodes = self.shape.num_nodes
        self.scratch_nodes = self.shape.num_nodes

    def propose(self, drafter, cache, active: Active, requests, root_logits: FeedLogits,
                layout: str) -> Tuple[List[RowTree], int]:
        return expand_static(drafter, cache, active, [self.shape] * len(active), root_logits,
                             layout)

    def observe(self, request, tree: RowTree, accepted: int) -> None:
        """Static shapes do not adapt."""
