"""The `torch` backend: every op of the forward pass as plain torch, matching HF's numerics.

A backend is an object with these methods; the `generated` backend (a Program's kernels) has
the same interface, so the model and the decode loops never know which one runs.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


class TorchBackend:
    name = "torch"

    def prepare_linear(self, name: str, weight: torch.Tensor, bias: Optional[torch.Tensor], fmt: str):
        """Turn a checkpoint weight into whatever `linear` consumes (dense here)."""
        return (weight, bias)

    def linear(self, x: torch.Tensor, packed) -> torch.Tensor:
        weight, bias = packed
        return F.linear(x, weight, bias)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # HF computes the statistics in float32 and casts back before the weight multiply.
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(dtype)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D]; cos/sin [B, T, D]."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, T, H, D] over cache [B, S, Hkv, D] with visibility mask [B, T, S] → [B, T, H*D]."""
        b, t, h, d = q.shape
        hkv = k_cache.shape[2]
        g = h // hkv
        qg = q.reshape(b, t, hkv, g, d).to(torch.float32)
        scores = torch.einsum("bthgd,bshd->bhgts", qg, k_cache.to(torch.float32)) * scale
        scores = scores.masked_fill(~mask[:, None, None, :, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("bhgts,bshd->bthgd", probs, v_cache.to(torch.float32))
        return out.reshape(b, t, h * d).to(q.dtype)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def mlp_gate_up(self, y: torch.Tensor, gate, up) -> torch.Tensor:
        """silu(y @ gate.T) * (y @ up.T), the MLP's input half; a backend may fuse it."""
        return self.silu_mul(self.linear(y, gate), self.linear(y, up))
