"""The ragged (varlen) verification layout: requests' tokens packed without padding.

A packed batch is one sequence of sum(T_i) tokens; request i owns tokens cu[i]:cu[i+1] and cache
row rows[i]. The static cache [B, S, ...] is viewed, without a copy, as one row of B*S slots, so
the model's forward runs unchanged on [1, sum(T_i)] tokens: every linear sees exactly the real
tokens, and a token's slot is rows[i]*S + slot. Two kernels take the per-request offsets:

  * attention (`VarlenAttention`): request i's queries attend only to its own cache row, the
    S slots starting at rows[i]*S, never to the B*S of the flattened view;
  * greedy accept (`ragged_greedy_accept`): the whole batch's tree walks in one pass over the
    packed logits, each request reading its rows from its offset.

Both have a torch implementation here (the reference the generated kernels must match).
"""
from __future__ import annotations

import copy
from typing import List, Sequence

import torch

from .acceptance import AcceptedPath
from .kv_cache import KVCache


def flat_cache_view(cache: KVCache) -> KVCache:
    """The same storage seen as one row of batch*capacity slots (writes land in `cache`)."""
    b, s = cache.batch, cache.capacity
    return KVCache(k=[t.view(1, b * s, *t.shape[2:]) for t in cache.k],
                   v=[t.view(1, b * s, *t.shape[2:]) for t in cache.v],
                   positions=cache.positions.view(1, b * s))


class VarlenAttention:
    """A backend whose attention takes per-request offsets; every other op is the inner
    backend's. `cu_seqlens` [R+1] delimits each request's queries in the packed sequence, and
    `rows` [R] names its cache row in the flattened cache of `capacity` slots per row."""

    def __init__(self, inner, cu_seqlens: Sequence[int], rows: Sequence[int], capacity: int):
        self.inner = inner
        self.cu_seqlens = [int(x) for x in cu_seqlens]
        self.rows = [int(r) for r in rows]
        self.capacity = capacity

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [1, sum T, H, D] over the flattened cache [1, B*S, Hkv, D] → [1, sum T, H*D]; the
        queries of request i see only slots rows[i]*S .. rows[i]*S + S - 1."""
        s, outs = self.capacity, []
        for i, row in enumerate(self.rows):
            a, b = self.cu_seqlens[i], self.cu_seqlens[i + 1]
            lo = row * s
            outs.append(self.inner.attention(q[:, a:b], k_cache[:, lo:lo + s],
                                              v_cache[:, lo:lo + s], mask[:, a:b, lo:lo + s],
                                              scale))
        return torch.cat(outs, dim=1)


def with_varlen_attention(model, cu_seqlens: Sequence[int], rows: Sequence[int], capacity: int):
    """A shallow copy of `model` (weights shared) whose attention takes the packed offsets."""
    packed = copy.copy(model)
    packed.backend = VarlenAttention(model.backend, cu_seqlens, rows, capacity)
    return packed


def ragged_greedy_accept(logits: torch.Tensor, offsets: Sequence[int], node_tokens: torch.Tensor,
                         node_offsets: Sequence[int], parents: torch.Tensor,
                         depths: torch.Tensor) -> List[AcceptedPath]:
    """Greedy longest-match acceptance of a whole packed batch.

    Request i's target logits are rows offsets[i]:offsets[i+1] of `logits` (its root first, then
    its nodes); its drafted nodes are node_offsets[i]:node_offsets[i+1] of `node_tokens`, with
    `parents` (request-local, -1 for the root) and `depths`. A node is accepted when its token
    is the target's argmax at its parent and its parent is accepted; the accepted nodes of a
    request form one path (siblings carry distinct tokens), ending at its deepest accepted node,
    whose argmax is the bonus. Same result as `greedy_accept` on each request.
    """
    device = logits.device
    pred = torch.argmax(logits, dim=-1)
    counts = [node_offsets[i + 1] - node_offsets[i] for i in range(len(offsets) - 1)]
    total = int(node_offsets[-1])
    request = torch.repeat_interleave(torch.arange(len(counts), device=device),
                                      torch.tensor(counts, device=device))
    node_base = torch.tensor(node_offsets[:-1], device=device, dtype=torch.int64)[request]
    row_base = torch.tensor(offsets[:-1], device=device, dtype=torch.int64)[request]
    parents = parents.to(device)
    # The target row of a node's parent: the request's root row, or the parent node's row.
    parent_row = row_base + parents + 1
    match = node_tokens.to(device) == pred[parent_row]
    parent_global = torch.where(parents >= 0, node_base + parents, torch.full_like(parents, -1))
    accepted = match.clone()
    # Parents precede children, so `depth` sweeps settle every chain of ancestors.
    for _ in range(int(depths.max()) if total else 0):
        from_parent = torch.where(parent_global >= 0, accepted[parent_global.clamp(min=0)],
                                  torch.ones_like(accepted))
        accepted = match & from_parent
    depth_if_accepted = torch.where(accepted, depths.to(device), torch.zeros_like(depths))
    out = []
    acc, par = depth_if_accepted.tolist(), parents.tolist()
    pred_list = pred.tolist()
    for i in range(len(counts)):
        lo, hi = node_offsets[i], node_offsets[i + 1]
        best = max(range(lo, hi), key=lambda g: (acc[g], -g), default=None)
        nodes: List[int] = []
        if best is not None and acc[best] > 0:
            node = best - lo
            while node != -1:
                nodes.append(node)
                node = par[lo + node]
            nodes.reverse()
        last_row = offsets[i] + (nodes[-1] + 1 if nodes else 0)
        out.append(AcceptedPath(tuple(nodes), pred_list[last_row]))
    return out
