"""Fewer, fused kernels for the torch backend on a CUDA GPU.

A decode step of a small model is bound by how many kernels it launches, not by its bytes: the
reference RMSNorm is about ten elementwise kernels, RoPE five per tensor, the reference attention
a dozen (float32 copies of the cache, two einsums, mask, softmax). Here RMSNorm, RoPE and the
SwiGLU product are the reference functions themselves compiled by `torch.compile` (`compiled`;
each becomes one fused kernel), and attention is one `scaled_dot_product_attention` call. Grouped-query attention is
expressed without copying the cache: the query heads that share a kv head become extra query
rows of that head, with the mask repeated for them.

The arithmetic is the reference's up to rounding order (fused reductions, bf16 attention
probabilities), which token forcing tolerates as near-ties.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

FAST_OPS_ENV = "SPECPILOT_FAST_OPS"


def fast_ops_enabled() -> bool:
    """Whether CUDA models get the fast path (default on; SPECPILOT_FAST_OPS=0 turns it off,
    e.g. to measure what it saves)."""
    return os.environ.get(FAST_OPS_ENV, "1") != "0"


def grouped_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, T, H, D] over the cache [B, S, Hkv, D] where mask [B, T, S] is True → [B, T, H*D].

    Query head h reads kv head h // (H // Hkv), as HF's repeat_kv does. Every query must see at
    least one slot (its own), as in every decode step."""
    b, t, h, d = q.shape
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    rows = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    visible = mask[:, None, None, :, :].expand(b, 1, g, t, s).reshape(b, 1, g * t, s)
    out = F.scaled_dot_product_attention(rows, k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                         attn_mask=visible, scale=scale)
    return out.reshape(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h * d)


def compiled(fn):
    """`fn` compiled with shapes dynamic, so batch and width changes do not recompile beyond the
    size-1 specialisations."""
    return torch.compile(fn, dynamic=True, fullgraph=True)
