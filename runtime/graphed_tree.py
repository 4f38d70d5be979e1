"""Greedy static-tree speculation with every round on the device (one CUDA graph per round).

The tree decoder keeps the chain decoder's state, host loop and commit (runtime/graphed_chain.py)
and replaces the round. In cache slots, the root (the last committed token) sits at `length` and
tree node i at `length + 1 + i`; visibility is the tree's ancestor pattern placed at `length`, so
one mask construction serves every row whatever its length:

1. the drafter catches up on (prev, last) and ranks its top tokens after the root (level 1);
2. each further level: the drafter runs the level's nodes under the tree mask and each node's
   children are its top-ranked tokens (the tree is breadth-first, so levels are contiguous);
3. the target verifies root + all nodes in one forward under the tree mask;
4. greedy acceptance walks the tree on the device: at each depth the child whose token equals the
   target's argmax at the current node (siblings hold distinct tokens, so at most one matches);
5. the accepted nodes' K/V (target and drafter) are moved to the slots after the root, and the
   committed tokens are the target's argmaxes along the path, the last being the bonus token.

Forced mode puts the reference tokens on a root-to-deepest path (siblings get other tokens, so
the tree keeps its shape), commits that path whatever the target says and records the target's
argmax along it: the tree-masked verification and the compaction are both what is checked, as a
wrong compaction corrupts every later proposal.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

import torch

from specpilot.ir.errors import SpecPilotError

from .graphed_chain import GraphedChainDecoder
from .steps import top2_margin


def placed_mask(pattern: torch.Tensor, base: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
    """[B, Q, S] visibility: every slot before `base` (committed), plus per row the pattern
    [B, Q, W] laid over slots base .. base + W - 1 (the root first, then the tree's slots)."""
    b, q, w = pattern.shape
    rel = slot_ids[None, :] - base[:, None]                          # [B, S]
    inside = (rel >= 0) & (rel < w)
    seen = pattern.gather(2, rel.clamp(0, w - 1)[:, None, :].expand(b, q, rel.shape[1]))
    return (rel < 0)[:, None, :] | (seen & inside[:, None, :])


def top_tokens(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The `k` highest-scoring tokens of each row of `logits` [..., V], best first: [..., k].
    An argmax where k is 1: on the H200 a top-k over the vocabulary cost about 30 us a call at
    batch 1 (the 5-node tree's rounds in bench/results/tree-round-cost.json), while the chain's
    argmaxes are not among its costliest kernels; and a sparse tree's deeper levels mostly keep
    one child."""
    if k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.topk(logits, k, dim=-1).indices


class WalkTables(NamedTuple):
    """A static tree's shape as the walk reads it (n nodes, D levels)."""
    parent_row: torch.Tensor    # [n]: node i's parent as a verification row, 0 = the root
    ancestors: torch.Tensor     # [n, n] bool: node i's ancestors and itself
    depths: torch.Tensor        # [n] int64, 1 for the root's children
    path_table: torch.Tensor    # [n, D]: node i's root path at each depth, -1 below i
    depth_slots: torch.Tensor   # [D]: 1 .. D


def tree_walk_tables(shape, device) -> WalkTables:
    """`shape`'s (a TreeShape) tables for `walk_tree`."""
    n, depth = shape.num_nodes, shape.max_depth
    ancestors = torch.zeros((n, n), dtype=torch.bool)
    path_table = torch.full((n, depth), -1, dtype=torch.int64)
    for i in range(n):
        for a in shape.ancestors_or_self(i):
            ancestors[i, a] = True
            path_table[i, shape.depths[a] - 1] = a
    parent_row = [1 + p if p >= 0 else 0 for p in shape.parents]
    return WalkTables(torch.tensor(parent_row, device=device), ancestors.to(device),
                      torch.tensor(shape.depths, device=device), path_table.to(device),
                      torch.arange(1, depth + 1, device=device))


def walk_tree(tables: WalkTables, nodes: torch.Tensor, g: torch.Tensor):
    """Greedy acceptance down a static tree: (accepted node per depth or -1 [B, D], count [B]).
    From the root, at each depth the child of the current node whose token (`nodes` [B, n]) is
    the target's argmax there (`g` [B, n + 1], row 0 the root's, 1 + i node i's).

    All depths at once, in a fixed dozen operations whatever the depth (a round on the device
    is bound by its kernel count): a node is accepted when it and each of its ancestors match
    the argmax at their parents, and the deepest accepted node names the path. That is the
    depth-by-depth walk where siblings hold distinct tokens, as top-k drafts do: then at most
    one child matches and the accepted nodes form one root path. (Were two siblings equal, it
    would take the deeper of their matching branches, still a path of the target's argmaxes.)"""
    match = nodes == g.gather(1, tables.parent_row.expand_as(nodes))             # [B, n]
    rejected_above = ((~match)[:, None, :] & tables.ancestors[None]).any(dim=2)
    depth = torch.where(rejected_above, 0, tables.depths[None, :])               # [B, n]
    count, deepest = depth.max(dim=1)
    path = tables.path_table[deepest]                                            # [B, D]
    return torch.where(tables.depth_slots[None, :] <= count[:, None], path, -1), count


class GraphedTreeDecoder(GraphedChainDecoder):
    """Static-tree (`TreeShape`) greedy speculation for up to `batch` requests."""

    def __init__(self, target, drafter, batch: int, capacity: int, shape,
                 eos_ids: Sequence[int] = (), capture: bool = True,
                 rounds_per_replay=None, record_margins: bool = False):
        if drafter is None or shape.num_nodes < 1:
            raise SpecPilotError("a draft tree needs a drafter and at least one node")
        self.shape = shape
        super().__init__(target, drafter, batch, capacity, shape.max_depth, eos_ids, capture,
                         rounds_per_replay=rounds_per_replay, record_margins=record_margins)
        dev, n = self.device, shape.num_nodes
        i64 = dict(dtype=torch.int64, device=dev)
        depths = shape.depths
        # Breadth-first: each level is a contiguous run of node indices.
        self.levels: List[range] = []
        for d in range(1, shape.max_depth + 1):
            members = [i for i in range(n) if depths[i] == d]
            if members != list(range(members[0], members[-1] + 1)):
                raise SpecPilotError(f"tree nodes must be in breadth-first order: {shape}")
            self.levels.append(range(members[0], members[-1] + 1))
        self.walk_tables = tree_walk_tables(shape, dev)
        self.depth_slots = self.walk_tables.depth_slots    # the compaction's destinations
        pattern = torch.zeros((n + 1, n + 1), dtype=torch.bool, device=dev)
        pattern[:, 0] = True                       # everyone sees the root
        pattern[1:, 1:] = self.walk_tables.ancestors
        self.pattern = pattern
        self.offsets = torch.tensor([0] + list(depths), **i64)   # position after the root
        self.slots_after = torch.arange(n + 1, **i64)
        self.ranks = torch.tensor(shape.ranks, **i64)
        self.level_ranks = [self.ranks[lv.start:lv.stop] for lv in self.levels]
        # For each node of a level below the first: its parent's place within the level above.
        self.parent_place = [None] + [
            torch.tensor([shape.parents[c] - above.start for c in lv], **i64)
            for above, lv in zip(self.levels, self.levels[1:])]
        self.branching = [int(self.ranks[lv.start:lv.stop].max()) + 1 for lv in self.levels]
        forced_path = self._forced_path()
        self.forced_path = torch.tensor(forced_path, **i64)
        on_path = torch.zeros(n, dtype=torch.bool)
        on_path[forced_path] = True
        self.on_forced_path = on_path.to(dev)
        self.batch_rows = torch.arange(batch, **i64)

    def _span(self) -> int:
        return self.shape.num_nodes

    def _forced_path(self) -> List[int]:
        """Root to the first deepest node: forced runs put the reference on it."""
        deepest = self.shape.depths.index(self.shape.max_depth)
        return list(self.shape.ancestors_or_self(deepest))

    # ---- the round ------------------------------------------------------------------------------

    def _round_mask(self, base: torch.Tensor) -> torch.Tensor:
        """[B, n + 1, S]: committed slots, plus the static tree's pattern placed at base. Built
        once a round: each drafter level's mask is some of its rows, and the verification's
        all of it (one built a level cost that level's kernels again)."""
        b = base.shape[0]
        return placed_mask(self.pattern[None].expand(b, *self.pattern.shape), base,
                           self.slot_ids[0, 0])

    def _draft_tree(self, base: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The drafted tokens of every node, [B, num_nodes], level by level; `mask` is the
        round's (`_round_mask`)."""
        pos = base[:, None] + self.catch_up_offsets
        tokens = torch.stack([self.prev, self.last], dim=1)
        logits = self.drafter.forward(tokens, pos, pos, self._mask(pos), self.dcache,
                                      self.catch_up_logit)
        top = top_tokens(logits, self.branching[0])                        # [B, 1, b1]
        levels = [top[:, 0, self.level_ranks[0]]]
        for d in range(1, len(self.levels)):
            above = self.levels[d - 1]          # its nodes are the mask's rows 1 + above
            slots = base[:, None] + self.slots_after[above.start + 1:above.stop + 1][None, :]
            pos = base[:, None] + d
            logits = self.drafter.forward(levels[-1], pos.expand_as(slots), slots,
                                          mask[:, above.start + 1:above.stop + 1], self.dcache)
            top = top_tokens(logits, self.branching[d])                    # [B, |L_d|, b]
            levels.append(top[:, self.parent_place[d], self.level_ranks[d]])
        return torch.cat(levels, dim=1)

    def _verify_tree(self, base: torch.Tensor, nodes: torch.Tensor, mask: torch.Tensor,
                     positions: Optional[torch.Tensor] = None):
        """The target's logits [B, n + 1, V] over root + nodes under the tree's `mask` (the
        static tree's `_round_mask`, or a dynamic tree's, with node `positions` [B, n + 1])."""
        return self._tree_forward(self.target, self.tcache, base, nodes, mask, positions)

    def _tree_forward(self, model, cache, base: torch.Tensor, nodes: torch.Tensor,
                      mask: torch.Tensor,
                      positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`model`'s logits over root + nodes under the tree `mask`, K/V into `cache`."""
        tokens = torch.cat([self.last[:, None], nodes], dim=1)
        pos = base[:, None] + (self.offsets if positions is None else positions)
        slots = base[:, None] + self.slots_after
        return model.forward(tokens, pos, slots, mask, cache)

    def _walk(self, nodes: torch.Tensor, g: torch.Tensor,
              parent_row: Optional[torch.Tensor] = None):
        """Greedy acceptance down the tree (`walk_tree`, from the static tree's tables). The
        dynamic tree, whose rows have their own `parent_row`, walks otherwise
        (graphed_dynamic.walk_per_row)."""
        return walk_tree(self.walk_tables, nodes, g)

    def _compact(self, base: torch.Tensor, path: torch.Tensor,
                 drafter_path: Optional[torch.Tensor] = None) -> None:
        """Move accepted nodes' K/V from base+1+node to base+depth, in both models' caches
        (`drafter_path`: where the drafter holds them, when its slots differ)."""
        self._move_path(base, path, ((self.tcache, path),
                                     (self.dcache, path if drafter_path is None else drafter_path)))

    def _move_path(self, base: torch.Tensor, path: torch.Tensor, moves) -> None:
        """For each (cache, nodes [B, D]) of `moves` (where that cache holds `path`'s nodes):
        the K/V at base+1+node moved to base+depth, for each depth where `path` [B, D] has a
        node (not -1) on an active row."""
        dst = base[:, None] + self.depth_slots                             # [B, D]
        keep = (path >= 0) & self.active[:, None]
        rows = self.batch_rows[:, None]
        for cache, nodes in moves:
            src = torch.where(keep, base[:, None] + 1 + nodes.clamp(min=0), dst)
            cache.move_slots(rows, src, dst)
            cache.positions[rows, dst] = dst

    def _round(self, k: int) -> None:
        base = self._base()
        mask = self._round_mask(base)
        nodes = self._draft_tree(base, mask)
        logits = self._verify_tree(base, nodes, mask)
        self._accept(base, nodes, logits)

    def _accept(self, base: torch.Tensor, nodes: torch.Tensor, logits: torch.Tensor,
                parent_row: Optional[torch.Tensor] = None,
                drafter_nodes: Optional[torch.Tensor] = None) -> None:
        """Walk, compact and commit: the committed tokens are the target's argmaxes along the
        accepted path, the last one its bonus token. `parent_row` [B, n]: each row's own
        parents (a dynamic tree's; the static tree's are its walk tables'). `drafter_nodes`
        [B, n]: where the drafter holds each node, when its slots differ from the target's."""
        g = torch.argmax(logits, dim=-1)
        path, n = self._walk(nodes, g, parent_row)
        rows = torch.cat([torch.zeros_like(n)[:, None], 1 + path.clamp(min=0)], dim=1)
        if self.record_margins:
            self._round_margins = top2_margin(logits).gather(1, rows)
        drafter_path = None
        if drafter_nodes is not None:
            drafter_path = torch.where(path >= 0, drafter_nodes.gather(1, path.clamp(min=0)), path)
        self._compact(base, path, drafter_path)
        self._commit(g.gather(1, rows), n)

    def _forced_round(self, k: int) -> None:
        base = self._base()
        depth = self.shape.max_depth
        ref = self._reference_ahead(depth)                                 # [B, D]
        vocab = self.target.config.vocab_size
        depths = self.offsets[1:]
        at_depth = ref.gather(1, depths[None, :].expand(ref.shape[0], -1) - 1)
        # The reference on the forced path; its siblings get other, distinct tokens.
        nodes = torch.where(self.on_forced_path[None, :], at_depth,
                            (at_depth + 1 + self.ranks[None, :]) % vocab)
        logits = self._verify_tree(base, nodes, self._round_mask(base))
        path = self.forced_path[None, :].expand(ref.shape[0], -1)
        self._compact(base, path)
        self._commit_forced_path(logits, path, torch.full_like(self.count, depth))

    def _commit_forced_path(self, logits: torch.Tensor, path: torch.Tensor, depth: torch.Tensor):
        """Forced mode, after verifying a tree with the reference on `path` [B, D] (its node at
        each depth, -1 past a row's `depth` [B]) and compacting the caches along it (compact
        first: the move reads `active`, which the commit then clears for finished rows): the
        target's proposals along it written, and each row's next depth + 1 reference tokens
        committed."""
        rows = torch.cat([torch.zeros_like(depth)[:, None], 1 + path.clamp(min=0)], dim=1)
        if self.record_margins:
            self._round_margins = top2_margin(logits).gather(1, rows)
        self._write(torch.argmax(logits, dim=-1).gather(1, rows), depth)
        self._commit_forced(depth)
