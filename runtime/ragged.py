"""The ragged (varlen) verification layout: requests' tokens packed without padding.

A packed batch is one sequence of sum(T_i) tokens; request i owns tokens cu[i]:cu[i+1] and cache
row rows[i]. The static cache [B, S, ...] is viewed, without a copy, as one row of B*S slots, so
the model's forward runs unchanged on [1, sum(T_i)] tokens: every linear sees exactly the real
tokens, and a token's slot is rows[i]*S + slot. Two kernels take the per-request offsets:

  * attention (`VarlenAttention`): request i's queries attend only to its own cache row, the
    S slots starting at rows[i]*S, never to the B*S of the flattened view;
  * greedy accept (`ragged_greedy_accept`): the whole batch's tree walks in one pass over the
    packed logits, each request reading its rows from its offset.

Both have a torch implementation here (the reference the generated kernels must match). When
the inner backend has a varlen attention kernel (`has_varlen_attention`: the generated backend
of a ragged Program), `VarlenAttention` runs it once over the whole pack instead of one
attention per request; the torch backend keeps the per-request loop.

The kernel takes visibility as data, per packed token t: `kv_limits[t]` (it sees every slot
before) and `window_bits[t]` (int32 words; bit j marks slot kv_limits[t] + j). A causal token
is kv_limits = its slot + 1 and no bits; a tree node is kv_limits = the committed length and
the bits of its ancestors and itself. That is 4 + 4W bytes a token (W = 1 up to 32 nodes a
tree): 8 KiB for 64 requests x 16 tokens, where a packed [N, S] bool mask at S = 4096 is 4 MiB
and the flattened [N, B*S] mask 256 MiB. The bits are data, so one compiled kernel serves every
tree of a budget, and a request's prefill (its whole prompt, causal) fits without widening W.
"""
from __future__ import annotations

import copy
import math
from typing import List, Optional, Sequence, Tuple

import torch

from .acceptance import AcceptedPath
from .kv_cache import KVCache


def flat_cache_view(cache: KVCache) -> KVCache:
    """The same storage seen as one row of batch*capacity slots (writes land in `cache`)."""
    b, s = cache.batch, cache.capacity
    return KVCache(k=[t.view(1, b * s, *t.shape[2:]) for t in cache.k],
                   v=[t.view(1, b * s, *t.shape[2:]) for t in cache.v],
                   positions=cache.positions.view(1, b * s))


WORD_BITS = 32


def pack_window_bits(bits: torch.Tensor) -> torch.Tensor:
    """bool [N, 32W] -> int32 [N, W]: bit j of row t goes to bit j % 32 of word j // 32."""
    n, width = bits.shape
    words = width // WORD_BITS
    weights = torch.ones(WORD_BITS, dtype=torch.int64, device=bits.device) << torch.arange(
        WORD_BITS, device=bits.device)
    packed = (bits.reshape(n, words, WORD_BITS).to(torch.int64) * weights).sum(-1)
    # Bit 31 makes a word negative as an int32: wrap, keeping the bit pattern.
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)


def varlen_visibility(limits: Sequence[int], extras: Sequence[Sequence[int]],
                      device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(kv_limits int32 [N], window_bits int32 [N, W]) of packed tokens where token t sees the
    request-local slots before limits[t] and the slots extras[t] (those below the limit are
    seen already). W is the fewest words that hold every extra slot, at least 1."""
    offsets = [[x - lim for x in ex if x >= lim] for lim, ex in zip(limits, extras)]
    span = max((max(o) + 1 for o in offsets if o), default=0)
    words = max(1, math.ceil(span / WORD_BITS))
    bits = torch.zeros(len(offsets), words * WORD_BITS, dtype=torch.bool)
    for t, o in enumerate(offsets):
        bits[t, o] = True
    return (torch.tensor(list(limits), dtype=torch.int32, device=device),
            pack_window_bits(bits).to(device))


def visibility_from_mask(mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(kv_limits, window_bits) describing exactly the bool mask [N, S] of request-local slots:
    each token's leading run of visible slots is its limit, the rest of what it sees its window
    (W as wide as the farthest visible slot needs; reads one number back from the device)."""
    n, s = mask.shape
    device = mask.device
    slots = torch.arange(s, device=device)
    limits = mask.to(torch.int32).cumprod(dim=1).sum(dim=1)
    rest = mask & (slots[None, :] >= limits[:, None])
    last = torch.where(rest, slots[None, :], -1).amax(dim=1)
    span = int((last - limits + 1).clamp(min=0).max()) if n else 0
    words = max(1, math.ceil(span / WORD_BITS))
    window = limits[:, None] + torch.arange(words * WORD_BITS, device=device)[None, :]
    bits = torch.gather(rest, 1, window.clamp(max=s - 1)) & (window < s)
    return limits.to(torch.int32), pack_window_bits(bits)


def has_varlen_kernel(backend) -> bool:
    """Whether `backend` runs varlen attention as one kernel over a packed batch."""
    return bool(getattr(backend, "has_varlen_attention", False))


class VarlenAttention:
    """A backend whose attention takes per-request offsets; every other op is the inner
    backend's. `cu_seqlens` [R+1] delimits each request's queries in the packed sequence, and
    `rows` [R] names its cache row in the flattened cache of `capacity` slots per row.

    With a varlen kernel in the inner backend, the whole pack is one launch. Its visibility is
    `visibility` = (limits, extras) per packed token (request-local slots, as `Feed`), when
    given; otherwise it is read off each distinct mask the model passes (once per forward, since
    the layers share one mask, and exactly, sliding windows included)."""

    def __init__(self, inner, cu_seqlens: Sequence[int], rows: Sequence[int], capacity: int,
                 visibility: Optional[Tuple[Sequence[int], Sequence[Sequence[int]]]] = None):
        self.inner = inner
        self.cu_seqlens = [int(x) for x in cu_seqlens]
        self.rows = [int(r) for r in rows]
        self.capacity = capacity
        self.visibility = visibility
        self._offsets = None      # (cu_seqlens, rows) on the device, built at the first call
        self._given = None        # `visibility` as (kv_limits, window_bits), built once
        self._seen = []           # [(mask, (kv_limits, window_bits))] of the masks seen

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def attention_masks(self, masks: list) -> list:
        """The masks as given: this attention slices each request's rows and slots out of them
        (the inner backend's own preparation, such as the generated attention's bounds, would
        be of the packed mask, not of a request's)."""
        return masks

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [1, sum T, H, D] over the flattened cache [1, B*S, Hkv, D] → [1, sum T, H*D]; the
        queries of request i see only slots rows[i]*S .. rows[i]*S + S - 1."""
        if has_varlen_kernel(self.inner):
            return self._packed_attention(q, k_cache, v_cache, mask, scale)
        s, outs = self.capacity, []
        for i, row in enumerate(self.rows):
            a, b = self.cu_seqlens[i], self.cu_seqlens[i + 1]
            lo = row * s
            outs.append(self.inner.attention(q[:, a:b], k_cache[:, lo:lo + s],
                                              v_cache[:, lo:lo + s], mask[:, a:b, lo:lo + s],
                                              scale))
        return torch.cat(outs, dim=1)

    def _packed_attention(self, q, k_cache, v_cache, mask, scale):
        s, device = self.capacity, q.device
        if self._offsets is None:
            self._offsets = (torch.tensor(self.cu_seqlens, dtype=torch.int32, device=device),
                             torch.tensor(self.rows, dtype=torch.int32, device=device))
        limits, bits = self._token_visibility(mask, device)
        cu, rows = self._offsets
        longest = max(b - a for a, b in zip(self.cu_seqlens, self.cu_seqlens[1:]))
        out = self.inner.varlen_attention(
            q[0], k_cache[0].unflatten(0, (-1, s)), v_cache[0].unflatten(0, (-1, s)), cu, rows,
            limits, bits, scale, max_seqlen=longest)
        return out[None]

    def _token_visibility(self, mask, device):
        if self.visibility is not None:
            if self._given is None:
                self._given = varlen_visibility(*self.visibility, device=device)
            return self._given
        # The layers of a forward share one mask object (sliding-window layers one per window),
        # so each is read off once, not once per layer.
        for seen, visibility in self._seen:
            if seen is mask:
                return visibility
        s = self.capacity
        local = torch.cat([mask[0, a:b, row * s:(row + 1) * s] for a, b, row in
                           zip(self.cu_seqlens, self.cu_seqlens[1:], self.rows)])
        self._seen.append((mask, visibility_from_mask(local)))
        return self._seen[-1][1]


def with_varlen_attention(model, cu_seqlens: Sequence[int], rows: Sequence[int], capacity: int,
                          visibility: Optional[Tuple[Sequence[int], Sequence[Sequence[int]]]] = None):
    """A shallow copy of `model` (weights shared) whose attention takes the packed offsets.

    `visibility` = (limits, extras) per packed token (request-local slots) spares the varlen
    kernel reading it off the mask; it is ignored for a model with sliding-window layers, whose
    masks differ from layer to layer."""
    if getattr(getattr(model, "config", None), "sliding_window", None) is not None:
        visibility = None
    # A drafter in fused layer kernels (runtime/fused_forward.py) has no packed attention: the
    # packed forward is its model's own, per op.
    model = getattr(model, "unfused", model)
    packed = copy.copy(model)
    packed.backend = VarlenAttention(model.backend, cu_seqlens, rows, capacity, visibility)
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
    node_tokens, parents, depths = (x.to(device) for x in (node_tokens, parents, depths))
    pred = torch.argmax(logits, dim=-1)
    counts = [node_offsets[i + 1] - node_offsets[i] for i in range(len(offsets) - 1)]
    total = int(node_offsets[-1])
    # Each node's request's first node and first logits row, built on the host from the
    # offsets and copied to the device in one transfer.
    request = [i for i, c in enumerate(counts) for _ in range(c)]
    node_base, row_base = torch.tensor([[node_offsets[r] for r in request],
                                        [offsets[r] for r in request]],
                                       dtype=torch.int64, device=device)
    # The target row of a node's parent: the request's root row, or the parent node's row.
    parent_row = row_base + parents + 1
    match = node_tokens == pred[parent_row]
    parent_global = torch.where(parents >= 0, node_base + parents, torch.full_like(parents, -1))
    accepted = match.clone()
    # Parents precede children, so `depth` sweeps settle every chain of ancestors.
    for _ in range(int(depths.max()) if total else 0):
        from_parent = torch.where(parent_global >= 0, accepted[parent_global.clamp(min=0)],
                                  torch.ones_like(accepted))
        accepted = match & from_parent
    depth_if_accepted = torch.where(accepted, depths, torch.zeros_like(depths))
    # One read back: accepted depths, parents and predictions.
    host = torch.cat([depth_if_accepted, parents, pred]).tolist()
    acc, par, pred_list = host[:total], host[total:2 * total], host[2 * total:]
    out = []
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
