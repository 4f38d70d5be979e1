"""Dynamic draft trees: each step the drafter grows the most probable branches of each request.

For `DynamicTree(budget, depth, width)`, per request:

  1. level 1 keeps the root's top-`width` drafter tokens, scored by their log-probability;
  2. level d (2..depth) runs the `width` kept nodes of level d-1 through the drafter in one
     forward; each offers its top-`width` tokens, scored by cumulative log-probability (parent's
     score + own), and the `width` best of those width*width candidates are kept;
  3. of all depth*width kept nodes, the `budget` best by score form the tree. A node's score
     never exceeds its parent's (log-probabilities are <= 0), and ties rank the shallower node
     first, so every chosen node's ancestors are chosen too.

While drafting, kept node j of level d sits at drafter slot C + (d-1)*width + j (a level-major
scratch layout); the chosen tree is then re-indexed breadth-first for the target. Whatever shape
the drafter picks, the target verifies root + `budget` nodes, the tree arriving as data.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import DynamicTree

from .batch_layout import FeedLogits, feed, run_feeds
from .row_tree import RowTree
from .tree_drafting import Active


class _Scratch:
    """The kept candidates of one request, level-major; a RowTree once drafting is done."""

    def __init__(self):
        self.tokens: List[int] = []
        self.parents: List[int] = []
        self.depths: List[int] = []
        self.ranks: List[int] = []
        self.scores: List[float] = []

    def add(self, token: int, parent: int, depth: int, rank: int, score: float) -> None:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(depth)
        self.ranks.append(rank)
        self.scores.append(score)

    def tree(self) -> RowTree:
        return RowTree(tuple(self.tokens), tuple(self.parents), tuple(self.depths),
                       tuple(self.ranks))


def choose_nodes(scores: Sequence[float], parents: Sequence[int], depths: Sequence[int],
                 budget: int) -> List[int]:
    """The `budget` best nodes by (score high, depth low, index low) whose parents are chosen
    too, in index order."""
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], depths[j], j))
    chosen: set = set()
    for j in order:
        if len(chosen) == budget:
            break
        if parents[j] == -1 or parents[j] in chosen:
            chosen.add(j)
    return sorted(chosen)


def _keep_best(parent_scores: Sequence[float], logp: torch.Tensor, width: int):
    """(parent position, rank, token, score) of the `width` best children of a level."""
    top = torch.topk(logp, width, dim=-1)
    values, indices = top.values.tolist(), top.indices.tolist()   # two reads, not two a parent
    cand = []
    for p, score in enumerate(parent_scores):
        for k, (v, tok) in enumerate(zip(values[p], indices[p])):
            cand.append((score + v, p, k, tok))
    # Stable: ties keep the candidate that comes first (lower parent position, then rank).
    best = sorted(range(len(cand)), key=lambda c: -cand[c][0])[:width]
    return [(cand[c][1], cand[c][2], cand[c][3], cand[c][0]) for c in sorted(best)]


def expand_dynamic(drafter, cache, active: Active, root_logits: FeedLogits, topology: DynamicTree,
                   layout: str) -> Tuple[List[RowTree], int]:
    """Grow each request's dynamic tree (see the module docstring); returns (trees, forwards)."""
    width, vocab = topology.width, drafter.config.vocab_size
    if width > vocab:
        raise SpecPilotError(f"dynamic tree width {width} exceeds the vocabulary ({vocab})")
    scratch = [_Scratch() for _ in active]
    for i, s in enumerate(scratch):
        logp = torch.log_softmax(root_logits[i][-1].double(), dim=-1)
        top = torch.topk(logp, width)
        for k, (v, tok) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            s.add(tok, -1, 1, k, v)
    forwards = 0
    for depth in range(2, topology.depth + 1):
        level = list(range((depth - 2) * width, (depth - 1) * width))
        feeds = [feed(row, [], len(committed), s.tree(), level, logits_from=0)
                 for (row, committed), s in zip(active, scratch)]
        logits = run_feeds(drafter, cache, feeds, layout)
        forwards += 1
        for i, s in enumerate(scratch):
            logp = torch.log_softmax(logits[i].double(), dim=-1)
            kept = _keep_best([s.scores[j] for j in level], logp, width)
            for p, rank, tok, score in kept:
                s.add(tok, level[p], depth, rank, score)
    trees = []
    for s in scratch:
        keep = choose_nodes(s.scores, s.parents, s.depths, topology.budget)
        trees.append(s.tree().subtree(keep))
    return trees, forwards


class DynamicProposer:
    """Proposes `DynamicTree` trees; the target always verifies `budget` nodes per request."""

    def __init__(self, topology: DynamicTree):
        self.topology = topology
        self.max_nodes = topology.budget
        self.scratch_nodes = topology.depth * topology.width

    def propose(self, drafter, cache, active: Active, requests, root_logits: FeedLogits,
                layout: str) -> Tuple[List[RowTree], int]:
        return expand_dynamic(drafter, cache, active, root_logits, self.topology, layout)

    def observe(self, request, tree: RowTree, accepted: int) -> None:
        """The tree follows the drafter's confidence, not past acceptance."""
