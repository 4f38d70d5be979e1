"""Plain torch reference of every generated kernel family (codegen/families.py).

These define what each kernel computes; generated kernels are tested against them and the torch
backend can call them directly. Each takes inputs and returns fresh outputs (the kernels write
into caller buffers instead). Accumulation is float32 and results are rounded once to the input
dtype, except where HF transformers rounds intermediates (RMSNorm, RoPE): there the same
rounding is reproduced, so the generated decoder can match HF token for token.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def linear_ref(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias [N]) → [M, N] in x.dtype."""
    y = x.float() @ w.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def gate_up_silu_ref(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """silu(x @ w_gate^T) * (x @ w_up^T), all in float32, rounded once → [M, I]."""
    xf = x.float()
    gate = xf @ w_gate.float().T
    up = xf @ w_up.float().T
    return (F.silu(gate) * up).to(x.dtype)


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: Optional[torch.Tensor] = None,
                dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out, new_residual): s = x + residual (rounded to x.dtype, as HF's bf16 add), then
    out = weight * (s * rsqrt(mean(s^2) + eps)) with the statistics in float32 and the normalised
    value rounded to x.dtype before the weight multiply (HF LlamaRMSNorm). Without a residual,
    s = x and new_residual is None. `dtype` (default x.dtype) is the one rounded to: a float32
    residual stream normalised into the model's dtype (the fused kernels' X_FP32)."""
    dtype = x.dtype if dtype is None else dtype
    s = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    s32 = s.float()
    normed = (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    out = (weight.float() * normed.float()).to(dtype)
    return out, (None if residual is None else s)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                 attention_scaling: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*positions.shape, D] in `dtype`, halves duplicated, computed as HF does."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF apply_rotary_pos_emb on x [T, H, D] with cos/sin [T, D] in x.dtype: x*cos +
    rotate_half(x)*sin, each product and the sum rounded to x.dtype as torch does."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                  scale: Optional[float] = None, kv_len: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [B, T, Hq, D] attends over the cache [B, S, Hkv, D] (GQA: query head h uses kv head
    h // (Hq // Hkv)) where mask [B, T, S] is True and, if given, slot < kv_len[b]. Softmax in
    float32; a query with no visible slot gets zeros. Returns [B, T, Hq, D] in q.dtype."""
    b, t, hq, d = q.shape
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    visible = mask.bool()
    if kv_len is not None:
        visible = visible & (torch.arange(s, device=q.device)[None, None, :] < kv_len[:, None, None])
    qg = q.float().reshape(b, t, hkv, group, d)
    scores = torch.einsum("bthgd,bshd->bhgts", qg, k_cache.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows: 0, not NaN
    out = torch.einsum("bhgts,bshd->bthgd", probs, v_cache.float())
    return out.reshape(b, t, hq, d).to(q.dtype)


def varlen_visibility_mask(kv_limits: torch.Tensor, window_bits: torch.Tensor,
                           capacity: int) -> torch.Tensor:
    """The [N, capacity] bool mask that (kv_limits [N], window_bits [N, W] int32) describe:
    token t sees slot s when s < kv_limits[t], or when j = s - kv_limits[t] is in 0..32W-1 and
    bit j % 32 of window_bits[t, j // 32] is set."""
    n, words = window_bits.shape
    slots = torch.arange(capacity, device=kv_limits.device)
    limits = kv_limits.long()[:, None]
    j = slots[None, :] - limits
    in_window = (j >= 0) & (j < 32 * words)
    jc = j.clamp(0, 32 * words - 1)
    word = torch.gather(window_bits.long() & 0xFFFFFFFF, 1, jc // 32)
    bit = ((word >> (jc % 32)) & 1).bool()
    return (slots[None, :] < limits) | (in_window & bit)


def varlen_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cu_seqlens: torch.Tensor, cache_rows: torch.Tensor,
                         kv_limits: torch.Tensor, window_bits: torch.Tensor,
                         scale: Optional[float] = None) -> torch.Tensor:
    """Attention of requests packed without padding: q [N, Hq, D], request r owning tokens
    cu_seqlens[r]:cu_seqlens[r+1] and cache row cache_rows[r] of [B, S, Hkv, D]; visibility as
    in `varlen_visibility_mask`. Each request is `attention_ref` over its own row. Returns
    [N, Hq, D] in q.dtype (zeros for a token that sees no slot)."""
    cu, rows = [int(x) for x in cu_seqlens.tolist()], [int(r) for r in cache_rows.tolist()]
    if cu[0] != 0 or cu[-1] != q.shape[0] or any(a > b for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to N = {q.shape[0]}, got {cu}")
    mask = varlen_visibility_mask(kv_limits, window_bits, k_cache.shape[1])
    out = torch.empty_like(q)
    for r, row in enumerate(rows):
        a, b = cu[r], cu[r + 1]
        if a == b:
            continue
        out[a:b] = attention_ref(q[None, a:b], k_cache[row:row + 1], v_cache[row:row + 1],
                                 mask[None, a:b], scale)[0]
    return out


def greedy_accept_ref(logits: torch.Tensor, draft_tokens: torch.Tensor, parents: torch.Tensor):
    """Greedy verification of a draft tree (a chain is parents = (-1, 0, 1, ...)).

    logits [B, N+1, V]: row 0 belongs to the root (the last committed token), row i+1 to draft
    node i. draft_tokens [B, N]; parents [N] or [B, N], -1 for children of the root, every
    parent before its children. From the root, repeatedly step to the first child whose token
    equals the target's argmax at the current node. Returns int64 tensors
    (pred [B, N+1], accept_count [B], path [B, N] padded with -1, bonus [B]).
    """
    bsz, rows, _ = logits.shape
    n = rows - 1
    pred = logits.argmax(dim=-1)
    par = parents.expand(bsz, n) if parents.dim() == 1 else parents
    count = torch.zeros(bsz, dtype=torch.int64)
    path = torch.full((bsz, n), -1, dtype=torch.int64)
    bonus = torch.zeros(bsz, dtype=torch.int64)
    for b in range(bsz):
        p_list, tokens, preds = par[b].tolist(), draft_tokens[b].tolist(), pred[b].tolist()
        if any(p >= i or p < -1 for i, p in enumerate(p_list)):
            raise ValueError(f"parents must list each parent before its children, got {p_list}")
        current, accepted = -1, []
        while True:
            want = preds[current + 1]
            child = next((i for i, p in enumerate(p_list) if p == current and tokens[i] == want), None)
            if child is None:
                break
            accepted.append(child)
            current = child
        count[b] = len(accepted)
        path[b, :len(accepted)] = torch.tensor(accepted, dtype=torch.int64)
        bonus[b] = preds[current + 1]
    device = logits.device
    return pred.to(device), count.to(device), path.to(device), bonus.to(device)


def kv_compact_ref(cache: torch.Tensor, src_slots: torch.Tensor, dst_start: torch.Tensor,
                   counts: torch.Tensor) -> torch.Tensor:
    """A copy of cache [B, S, Hkv, D] (or [L, B, S, Hkv, D]) where, for each request b and
    i < counts[b], slot dst_start[b] + i holds what slot src_slots[b, i] held before."""
    out = cache.clone()
    batch_dim = cache.dim() - 4
    for b in range(src_slots.shape[0]):
        c = int(counts[b])
        src = src_slots[b, :c].long()
        dst = torch.arange(int(dst_start[b]), int(dst_start[b]) + c, device=cache.device)
        if batch_dim == 0:
            out[b, dst] = cache[b, src]
        else:
            out[:, b, dst] = cache[:, b, src]
    return out


def fused_linear_ref(x: torch.Tensor, w: torch.Tensor, residual: Optional[torch.Tensor] = None,
                     norm_weight: Optional[torch.Tensor] = None, eps: float = 0.0,
                     out_fp32: bool = False) -> torch.Tensor:
    """[residual +] [rmsnorm](x) @ w^T: the product rounded to x.dtype (linear_ref), then added
    to the residual and rounded again (a bf16 add); float32 holding those values with out_fp32."""
    y = linear_ref(x if norm_weight is None else rmsnorm_ref(x, norm_weight, eps, dtype=w.dtype)[0], w)
    if residual is not None:
        y = (residual.float() + y.float()).to(x.dtype)
    return y.float() if out_fp32 else y


def norm_gate_up_silu_ref(x: torch.Tensor, norm_weight: torch.Tensor, w_gate: torch.Tensor,
                          w_up: torch.Tensor, eps: float) -> torch.Tensor:
    """gate_up_silu_ref of rmsnorm_ref(x), in the weights' dtype (x may be a float32 residual
    stream)."""
    return gate_up_silu_ref(rmsnorm_ref(x, norm_weight, eps, dtype=w_gate.dtype)[0], w_gate, w_up)


def fold_ref(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + x @ w^T with nothing rounded to x's dtype, in float64, returned as float32: a
    projection folded into the kernel before it, added into a float32 residual stream (the
    attention's FOLD_O with x its output [B*T, Hq*D], norm_gate_up_silu's FOLD_DOWN with x the
    activation)."""
    return (residual.double() + x.double() @ w.double().T).float()


def norm_qkv_rope_ref(x: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor,
                      positions: torch.Tensor, slots: torch.Tensor, inv_freq: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, eps: float, num_heads: int,
                      tokens: Optional[torch.Tensor] = None,
                      cache_positions: Optional[torch.Tensor] = None):
    """A decoder layer's attention input, as runtime/model.py's decoder_layer computes it:
    (q [B, T, Hq, D], k_cache, v_cache, rows [B*T, H], cache_positions), the caches (and
    cache_positions, if given) new tensors with the tokens' k/v (positions) written at their
    slots. x is the residual stream [B*T, H], or with tokens [B, T] the embedding table whose
    rows they name (`rows` is then the gathered residual stream)."""
    b, t = positions.shape
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    rows = x[tokens.reshape(-1)] if tokens is not None else x
    qkv = linear_ref(rmsnorm_ref(rows, norm_weight, eps, dtype=w_qkv.dtype)[0], w_qkv)
    q, k, v = qkv.split([num_heads * d, hkv * d, hkv * d], dim=-1)
    cos, sin = rope_cos_sin(positions.reshape(-1), inv_freq, w_qkv.dtype)
    q = rope_ref(q.reshape(b * t, num_heads, d), cos, sin).reshape(b, t, num_heads, d)
    k = rope_ref(k.reshape(b * t, hkv, d), cos, sin).reshape(b, t, hkv, d)
    batch = torch.arange(b, device=positions.device)[:, None].expand(b, t)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_cache[batch, slots] = k
    v_cache[batch, slots] = v.reshape(b, t, hkv, d)
    if cache_positions is not None:
        cache_positions = cache_positions.clone()
        cache_positions[batch, slots] = positions.to(cache_positions.dtype)
    return q, k_cache, v_cache, rows, cache_positions


CHAIN_COMMIT_STATE = ("out", "count", "length", "last", "prev", "limit", "active", "log",
                      "row_round", "status", "round_index")


def chain_commit_ref(state: dict, committed: torch.Tensor, drafts: torch.Tensor,
                     eos: Optional[torch.Tensor] = None, log: str = "round") -> dict:
    """A graphed round's end, row by row (the chain_commit family): the state after committing
    committed[b, 0..n_b] on each active row b, as a fresh dict of CHAIN_COMMIT_STATE (row_round
    only for the row logs), plus "n", "before" and "r" (the accepted counts, who was active,
    the log row used). n is counted from drafts [B, C - 1]: the leading drafts equal to
    committed[b, j]. `log`: "round" (the batch's round), "row" (each row's own round
    counter) or "row_plain" (a refilled batch's plain step: counters only, no status)."""
    s = {key: value.clone() for key, value in state.items() if value is not None}
    B, C = committed.shape
    W = s["out"].shape[1]
    stops = set() if eos is None else set(eos.tolist())
    n = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        while n[b] < C - 1 and int(drafts[b, n[b]]) == int(committed[b, n[b]]):
            n[b] += 1
    before = s["active"].clone()
    r = min(int(s["round_index"]), W - 1)
    for b in range(B):
        if not before[b]:
            continue
        nb = int(n[b])
        tokens = committed[b, :nb + 1].tolist()
        for j, token in enumerate(tokens):
            s["out"][b, min(int(s["count"][b]) + j, W - 1)] = token
        s["prev"][b] = tokens[-2] if nb > 0 else s["last"][b]
        s["last"][b] = tokens[-1]
        s["length"][b] += nb + 1
        s["count"][b] += nb + 1
        s["active"][b] = bool(s["count"][b] < s["limit"][b]) and not stops & set(tokens)
    logged = torch.where(before, n.to(torch.int64), torch.full_like(n, -1))
    if log == "round":
        s["log"][r] = logged
    else:
        if log == "row":
            for b in range(B):
                s["log"][min(int(s["row_round"][b]), W - 1), b] = logged[b]
        s["row_round"] += before.to(torch.int64)
    if log != "row_plain":
        s["status"][r, 0] = int(not bool(s["active"].any()))
    s["round_index"] += 1
    s.update(n=n.to(torch.int64), before=before, r=torch.tensor(r))
    return s
