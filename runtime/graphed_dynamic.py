"""Dynamic draft trees with every round on the device (one CUDA graph per round).

`DynamicTree(budget, depth, width)` as runtime/dynamic_tree.py defines it: level 1 keeps the
root's top-`width` drafter tokens; each further level runs the `width` kept nodes of the level
above through the drafter and keeps the `width` best of their width x width children by
cumulative log-probability; of all depth x width kept nodes the `budget` best (score high, then
shallower, then earlier) form the tree, which is ancestor-closed because a child never scores
above its parent.

Everything here is tensors of fixed shape, so the tree is data: the drafter's kept nodes sit at
scratch slots (level-major) after the root; the chosen nodes are re-indexed breadth-first for
the target, whose tree mask is laid from a per-row ancestor pattern (graphed_tree.placed_mask).
The commit and the compaction are the static tree's, with per-row parents; the walk goes depth
by depth (`walk_per_row`: the rows' trees differ, so there is no one table of root paths), and
the drafter compacts from its scratch slots. One captured graph serves every tree of the budget.

Forced mode grows the tree as a round does, from the drafter, and puts the reference on the path
from the root to the row's first deepest chosen node (the other nodes keep their drafts): so
forcing checks the target's tree-masked forward under the trees the drafter chooses, with their
per-row parents, positions and depths, and the compaction of paths of each row's depth. Each row
commits its own depth + 1 reference tokens, and the drafter then runs once over them (forced
rounds only), so that its cache holds the reference's K/V and each forced round grows the tree
the drafter would grow on the reference.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import TreeShape

from .graphed_tree import GraphedTreeDecoder, placed_mask


def comb_shape(budget: int, depth: int) -> TreeShape:
    """A tree of `budget` nodes and exactly `depth` levels: budget - depth + 1 children of the
    root, and a path of top-1 children under the first of them."""
    first = budget - depth + 1
    parents = [-1] * first + [0] + list(range(first, first + depth - 2))
    ranks = list(range(first)) + [0] * (depth - 1)
    depths = [1] * first + list(range(2, depth + 1))
    return TreeShape(tuple(parents[:budget]), tuple(ranks[:budget]), tuple(depths[:budget]))


def dynamic_span(topology) -> int:
    """Cache slots a round of the DynamicTree `topology` writes past the root: the drafter's
    depth x width scratch nodes reach past the target's tree of `budget` nodes."""
    return max(topology.depth * topology.width, topology.budget)


def walk_per_row(nodes: torch.Tensor, parent_row: torch.Tensor, g: torch.Tensor, depth: int):
    """graphed_tree.walk_tree for trees that differ by row (`parent_row` [B, n]), depth by
    depth from the root, `depth` steps: at each the child of the current node whose token is
    the target's argmax there. (accepted node per depth or -1 [B, depth], count [B]).
    A row that found no child stays at its node, so it finds none at any later depth."""
    current = torch.zeros(nodes.shape[0], dtype=torch.int64, device=nodes.device)
    path = []
    for _ in range(depth):
        want = g.gather(1, current[:, None])
        match = (parent_row == current[:, None]) & (nodes == want)
        found = match.any(dim=1)
        pick = match.to(torch.int64).argmax(dim=1)
        current = torch.where(found, 1 + pick, current)
        path.append(torch.where(found, pick, torch.full_like(pick, -1)))
    path = torch.stack(path, dim=1)
    return path, (path >= 0).sum(dim=1)


class GraphedDynamicTreeDecoder(GraphedTreeDecoder):
    """Dynamic-tree greedy speculation (`topology` a DynamicTree) for up to `batch` requests."""

    def __init__(self, target, drafter, batch: int, capacity: int, topology,
                 eos_ids: Sequence[int] = (), capture: bool = True, rounds_per_replay=None,
                 record_margins: bool = False):
        if topology.budget > topology.depth * topology.width:
            raise SpecPilotError(f"{topology}: the budget exceeds depth * width kept nodes")
        self.topology = topology
        # A tree of `budget` nodes is at most that deep: the static tree's walk, path slots and
        # chain length are sized by a comb that deep (every round grows its own tree; the
        # comb's own pattern, levels, walk tables and forced path, built at start-up, go unused
        # here).
        comb = comb_shape(topology.budget, min(topology.depth, topology.budget))
        super().__init__(target, drafter, batch, capacity, comb, eos_ids, capture,
                         rounds_per_replay, record_margins)
        d, w, dev = topology.depth, topology.width, self.device
        self.scratch = d * w
        self.scratch_depth = torch.arange(self.scratch, device=dev) // w + 1
        self.eye_w = torch.eye(w, dtype=torch.bool, device=dev)
        self.tree_positions = torch.arange(topology.budget + 1, device=dev)

    def _span(self) -> int:
        return dynamic_span(self.topology)

    def _walk(self, nodes: torch.Tensor, g: torch.Tensor,
              parent_row: Optional[torch.Tensor] = None):
        """Greedy acceptance down each row's own tree (`walk_per_row`)."""
        return walk_per_row(nodes, parent_row, g, self.k)

    def _tree_mask(self, pattern: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """The verification's mask from each row's `pattern` [B, n + 1, n + 1], placed at
        `base`."""
        return placed_mask(pattern, base, self.slot_ids[0, 0])

    def _draft_dynamic(self, base: torch.Tensor):
        """Scratch tokens, scores, parents (-1: root) [B, D*W] and ancestors [B, D*W, D*W]."""
        t, b = self.topology, base.shape[0]
        w, dw, dev = t.width, self.scratch, self.device
        pos = base[:, None] + self.catch_up_offsets
        tokens = torch.stack([self.prev, self.last], dim=1)
        logits = self.drafter.forward(tokens, pos, pos, self._mask(pos), self.dcache,
                                      self.catch_up_logit)
        # Scores in float64, as the eager mechanism keeps them (sums of log-probabilities
        # decide between near-equal branches).
        top = torch.topk(F.log_softmax(logits[:, 0].double(), dim=-1), w, dim=-1)
        toks, scores = [top.indices], [top.values]
        parents = [torch.full((b, w), -1, dtype=torch.int64, device=dev)]
        anc = torch.zeros((b, dw, dw), dtype=torch.bool, device=dev)
        anc[:, :w, :w] = self.eye_w
        for d in range(1, t.depth):
            above = torch.arange((d - 1) * w, d * w, device=dev)
            slots = base[:, None] + 1 + above[None, :]
            pos = (base[:, None] + d).expand_as(slots)
            # Root and scratch slots as one pattern: column 0 the root, 1 + j scratch node j.
            pattern = torch.cat([torch.ones((b, w, 1), dtype=torch.bool, device=dev),
                                 anc[:, above]], dim=2)
            mask = self._tree_mask(pattern, base)
            logits = self.drafter.forward(toks[-1], pos, slots, mask, self.dcache)
            cand = torch.topk(F.log_softmax(logits.double(), dim=-1), w, dim=-1)  # [B, W, W]
            total = (scores[-1][:, :, None] + cand.values).flatten(1)
            # The w best candidates (ties: the earlier one), kept in candidate order (parent,
            # then rank), as runtime/dynamic_tree.py keeps them.
            keep = torch.sort(torch.sort(-total, dim=1, stable=True).indices[:, :w], dim=1).values
            toks.append(cand.indices.flatten(1).gather(1, keep))
            scores.append(total.gather(1, keep))
            parent = (d - 1) * w + keep // w                                      # scratch idx
            parents.append(parent)
            rows = anc.gather(1, parent[:, :, None].expand(b, w, dw))
            rows[:, :, d * w:(d + 1) * w] |= self.eye_w
            anc[:, d * w:(d + 1) * w] = rows
        return (torch.cat(toks, dim=1), torch.cat(scores, dim=1), torch.cat(parents, dim=1), anc)

    def _choose_tree(self, base: torch.Tensor):
        """This round's tree from the drafter: node tokens, parents as verification rows and
        scratch indices [B, N], the tree pattern [B, N + 1, N + 1], positions [B, N + 1] and
        depths [B, N]."""
        t = self.topology
        toks, scores, parents, anc = self._draft_dynamic(base)
        b, n = base.shape[0], t.budget
        # The budget best by score (stable: ties keep level-major order, shallower first),
        # then breadth-first (scratch order is level-major).
        order = torch.sort(-scores, dim=1, stable=True).indices[:, :n]
        chosen = torch.sort(order, dim=1).values                                   # [B, N]
        place = torch.full((b, self.scratch), -1, dtype=torch.int64, device=self.device)
        place.scatter_(1, chosen, self.tree_positions[1:][None, :].expand(b, n) - 1)
        parent_scratch = parents.gather(1, chosen)
        parent_row = torch.where(parent_scratch < 0, torch.zeros_like(parent_scratch),
                                 1 + place.gather(1, parent_scratch.clamp(min=0)))
        nodes = toks.gather(1, chosen)
        depths = self.scratch_depth[chosen]
        pattern = torch.zeros((b, n + 1, n + 1), dtype=torch.bool, device=self.device)
        pattern[:, :, 0] = True
        picked = anc.gather(1, chosen[:, :, None].expand(b, n, self.scratch))
        pattern[:, 1:, 1:] = picked.gather(2, chosen[:, None, :].expand(b, n, n))
        positions = torch.cat([torch.zeros_like(depths[:, :1]), depths], dim=1)
        return nodes, parent_row, chosen, pattern, positions, depths

    def _round(self, k: int) -> None:
        base = self._base()
        nodes, parent_row, chosen, pattern, positions, _ = self._choose_tree(base)
        logits = self._verify_tree(base, nodes, self._tree_mask(pattern, base), positions)
        self._accept(base, nodes, logits, parent_row, drafter_nodes=chosen)

    def _forced_round(self, k: int) -> None:
        base = self._base()
        nodes, _, chosen, pattern, positions, depths = self._choose_tree(base)
        depth = depths.max(dim=1).values                                   # [B]
        deepest = (depths == depth[:, None]).to(torch.int64).argmax(dim=1)
        on_path = pattern[self.batch_rows, 1 + deepest, 1:]                # [B, N]
        ref = self._reference_ahead(self.k)                                # [B, D]
        # The reference on the path; the path's siblings may draft the same token, which only
        # the walk (not run here) would mind.
        nodes = torch.where(on_path, ref.gather(1, depths - 1), nodes)
        logits = self._verify_tree(base, nodes, self._tree_mask(pattern, base), positions)
        at = on_path[:, None, :] & (depths[:, None, :] == self.depth_slots[None, :, None])
        path = torch.where(at.any(dim=2), at.to(torch.int64).argmax(dim=2),
                           torch.full_like(ref, -1))                       # [B, D] node or -1
        committed = torch.cat([self.last[:, None], ref], dim=1)            # root + the path
        self._move_path(base, path, ((self.tcache, path),))               # the target's K/V
        self._commit_forced_path(logits, path, depth)
        # The drafter's K/V of what was committed (it drafted other tokens where it disagreed),
        # so that the next forced round grows the tree it would grow on the reference: written
        # afresh, not moved.
        pos = base[:, None] + self.chain[:self.k + 1]
        self.drafter.forward(committed, pos, pos, self._mask(pos), self.dcache)
