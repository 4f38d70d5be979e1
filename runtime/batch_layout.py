"""One forward over several requests' new tokens, laid out `padded` or `ragged`.

Every forward of the mechanism loop (catch-up, drafting levels, pruning, verification) is a list
of `Feed`s, one per request that has tokens this forward: the tokens, their positions and cache
slots, and what each may see. The layout decides how they reach the model:

  padded: a [B, W] batch over the cache's B rows, W the longest feed; every other token is a
          pad written to the cache's reserved last slot (`pad_slot`) and seeing only that slot,
          so pads stay finite and never touch a request's K/V.
  ragged: the feeds packed into [1, sum T] over the flattened cache, no pads (runtime/ragged.py).

Slot layout of a request whose committed sequence has C tokens (as in runtime/tree_plan.py):
committed token j at slot j; tree node i at slot C+i, position C-1+depth(i), seeing the slots
before C (the prefix, the root at C-1 included) and its own ancestors' slots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError

from .ragged import flat_cache_view, with_varlen_attention
from .row_tree import RowTree

LAYOUTS = ("padded", "ragged")


@dataclass(frozen=True)
class Feed:
    """New tokens of one request (cache row `row`) for one forward.

    Token t sits at `positions[t]`, writes its K/V at `slots[t]`, and sees the slots before
    `limits[t]` plus `extra[t]`. Logits are returned for tokens `logits_from` onwards.
    """
    row: int
    tokens: Tuple[int, ...]
    positions: Tuple[int, ...]
    slots: Tuple[int, ...]
    limits: Tuple[int, ...]
    extra: Tuple[Tuple[int, ...], ...]
    logits_from: int

    def __len__(self) -> int:
        return len(self.tokens)


def feed(row: int, pending: Sequence[int], start: int, tree: Optional[RowTree] = None,
         nodes: Optional[Sequence[int]] = None, logits_from: Optional[int] = None) -> Feed:
    """`pending` committed tokens at slots start.. (causal), then tree `nodes` (default: all).

    The committed length C is start + len(pending): tree nodes sit at C+i. Without
    `logits_from`, logits come from the last pending token (the root) onwards."""
    c = start + len(pending)
    tokens, positions, slots, limits, extra = [], [], [], [], []
    for j, tok in enumerate(pending):
        tokens.append(int(tok))
        positions.append(start + j)
        slots.append(start + j)
        limits.append(start + j + 1)
        extra.append(())
    if tree is not None:
        for i in (range(tree.num_nodes) if nodes is None else nodes):
            tokens.append(tree.tokens[i])
            positions.append(c - 1 + tree.depths[i])
            slots.append(c + i)
            limits.append(c)
            extra.append(tuple(c + a for a in tree.ancestors_or_self(i)))
    if not tokens:
        raise SpecPilotError(f"feed for row {row} has no tokens")
    if logits_from is None:
        logits_from = max(len(pending) - 1, 0)
    return Feed(row, tuple(tokens), tuple(positions), tuple(slots), tuple(limits), tuple(extra),
                logits_from)


class FeedLogits:
    """Float32 logits of every feed, packed: feed f's rows are offsets[f]:offsets[f+1]."""

    def __init__(self, packed: torch.Tensor, offsets: List[int]):
        self.packed = packed
        self.offsets = offsets

    def __getitem__(self, f: int) -> torch.Tensor:
        return self.packed[self.offsets[f]:self.offsets[f + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1


def pad_slot(cache) -> int:
    """The slot pads write to; cache capacities reserve it (`with_pad_slot`)."""
    return cache.capacity - 1


def with_pad_slot(capacity: int) -> int:
    return capacity + 1


def run_feeds(model, cache, feeds: Sequence[Feed], layout: str) -> FeedLogits:
    """Run `feeds` (distinct rows) through `model` in one forward; see the module docstring."""
    if layout not in LAYOUTS:
        raise SpecPilotError(f"unknown batch layout {layout!r} (known: {', '.join(LAYOUTS)})")
    rows = [f.row for f in feeds]
    if len(set(rows)) != len(rows) or not feeds:
        raise SpecPilotError(f"a forward takes at most one feed per cache row, got rows {rows}")
    for f in feeds:
        if max(f.slots) >= pad_slot(cache):
            raise SpecPilotError(f"row {f.row} writes slot {max(f.slots)}, past the cache's "
                                 f"{pad_slot(cache)} usable slots")
    return (_run_padded if layout == "padded" else _run_ragged)(model, cache, feeds)


def logit_reads(f: Feed, width: int) -> List[int]:
    """Indices, within its padded row of `width`, of the tokens whose logits `f` wants: its
    own tokens from `logits_from` on (a row's pads follow its tokens, whatever the width)."""
    return list(range(f.logits_from, len(f)))


def _run_padded(model, cache, feeds: Sequence[Feed]) -> FeedLogits:
    b, s, device = cache.batch, cache.capacity, model.device
    width = max(len(f) for f in feeds)
    pad = pad_slot(cache)
    # Built on the host as lists, the per-token integers reach the device in three small
    # transfers; the [B, W, S] mask is then built there, never copied.
    tokens, positions, slots, limits = [], [], [], []
    seen_b, seen_t, seen_s = [], [], []     # slots seen beyond the limit: ancestors, pads' slot
    reads = []
    n_reads = max(len(f) - f.logits_from for f in feeds)
    by_row = {f.row: f for f in feeds}
    for row in range(b):
        f = by_row.get(row)
        n = 0 if f is None else len(f)
        fill = width - n
        if f is None:
            tokens.append([0] * width)
            positions.append([0] * width)
            limits.append([0] * width)
            slots.append([pad] * width)
            reads.append([0] * n_reads)
        else:
            tokens.append(list(f.tokens) + [0] * fill)
            positions.append(list(f.positions) + [0] * fill)
            limits.append(list(f.limits) + [0] * fill)
            slots.append(list(f.slots) + [pad] * fill)
            for t, ex in enumerate(f.extra):
                seen_b += [row] * len(ex)
                seen_t += [t] * len(ex)
                seen_s += list(ex)
            wanted = logit_reads(f, width)
            reads.append(wanted + [n - 1] * (n_reads - len(wanted)))
        seen_b += [row] * fill                               # a pad sees only the pad slot
        seen_t += list(range(n, width))
        seen_s += [pad] * fill
    tokens, positions, slots, limits = torch.tensor([tokens, positions, slots, limits],
                                                    dtype=torch.int64, device=device)
    seen = torch.tensor([seen_b, seen_t, seen_s], dtype=torch.int64, device=device)
    mask = torch.arange(s, device=device)[None, None, :] < limits[:, :, None]
    mask[seen[0], seen[1], seen[2]] = True
    logits = model.forward(tokens, positions, slots, mask, cache,
                           logits_at=torch.tensor(reads, dtype=torch.int64, device=device))
    parts, offsets = [], [0]
    for f in feeds:
        k = len(f) - f.logits_from
        parts.append(logits[f.row, :k])
        offsets.append(offsets[-1] + k)
    return FeedLogits(torch.cat(parts, dim=0), offsets)


def _run_ragged(model, cache, feeds: Sequence[Feed]) -> FeedLogits:
    s, device = cache.capacity, model.device
    flat = flat_cache_view(cache)
    total = sum(len(f) for f in feeds)
    tokens, positions, slots, limits, base = [], [], [], [], []
    extra_t, extra_s, reads, cu, offsets = [], [], [], [0], [0]
    for f in feeds:
        start = cu[-1]
        tokens += f.tokens
        positions += f.positions
        slots += [f.row * s + x for x in f.slots]
        limits += f.limits
        base += [f.row * s] * len(f)
        for t, ex in enumerate(f.extra):
            extra_t += [start + t] * len(ex)
            extra_s += [f.row * s + x for x in ex]
        reads += list(range(start + f.logits_from, start + len(f)))
        cu.append(start + len(f))
        offsets.append(offsets[-1] + len(f) - f.logits_from)
    # The lists reach the device in three small transfers; the [N, B*S] mask is built there (a
    # host-built one would be a copy of up to hundreds of MiB per forward).
    ints = torch.tensor([tokens, positions, slots, limits, base], dtype=torch.int64,
                        device=device)
    extra = torch.tensor([extra_t, extra_s], dtype=torch.int64, device=device)
    flat_range = torch.arange(cache.batch * s, device=device)[None, :]
    # token t sees its own row's slots before its limit, plus its extra slots
    lo, hi = ints[4, :, None], (ints[4] + ints[3])[:, None]
    mask = (flat_range >= lo) & (flat_range < hi)
    mask[extra[0], extra[1]] = True
    # The feeds' own visibility (request-local) spares a varlen kernel reading it off the mask.
    visibility = ([x for f in feeds for x in f.limits], [ex for f in feeds for ex in f.extra])
    packed_model = with_varlen_attention(model, cu, [f.row for f in feeds], s, visibility)
    logits = packed_model.forward(ints[0:1], ints[1:2], ints[2:3], mask[None], flat,
                                  logits_at=torch.tensor([reads], dtype=torch.int64, device=device))
    assert logits.shape[1] == offsets[-1] and total == cu[-1]
    return FeedLogits(logits[0], offsets)
