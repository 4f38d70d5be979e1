"""The `torch` backend: every op of the forward pass as plain torch, matching HF's numerics.

A backend is an object with these methods; the `generated` backend (a Program's kernels) has
the same interface, so the model and the decode loops never know which one runs.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .reference_ops import attention_ref, rmsnorm_ref, rope_ref


class TorchBackend:
    """`fast_ops` (for a CUDA GPU) runs norm, RoPE and the SwiGLU product as compiled fused
    kernels and attention as one SDPA call (runtime/fast_ops.py); off, every op is the
    reference formula, eager."""

    name = "torch"

    def __init__(self, fast_ops: bool = False):
        self.fast_ops = fast_ops
        self._ops = None
        if fast_ops:
            from .fast_ops import CompiledOps
            self._ops = CompiledOps()

    def prepare_linear(self, name: str, weight: torch.Tensor, bias: Optional[torch.Tensor], fmt: str):
        """Turn a checkpoint weight into whatever `linear` consumes (dense here)."""
        return (weight, bias)

    def linear(self, x: torch.Tensor, packed) -> torch.Tensor:
        weight, bias = packed
        return F.linear(x, weight, bias)

    # Norm, RoPE and attention are the kernel families' torch references themselves: the stock
    # decoder and the generated kernels' tests share one definition of each op's numerics.
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self._ops is not None:
            from .fast_ops import rmsnorm_formula
            return self._ops("rmsnorm", rmsnorm_formula)(x, weight, eps)
        return rmsnorm_ref(x, weight, eps)[0]

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D]; cos/sin [B, T, D]."""
        if self._ops is not None:
            from .fast_ops import rope_formula
            return self._ops("rope", rope_formula)(x, cos, sin)
        b, t, h, d = x.shape
        return rope_ref(x.reshape(b * t, h, d), cos.reshape(b * t, d),
                        sin.reshape(b * t, d)).reshape(b, t, h, d)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, T, H, D] over cache [B, S, Hkv, D] with visibility mask [B, T, S] → [B, T, H*D]."""
        if self.fast_ops:
            from .fast_ops import grouped_sdpa
            return grouped_sdpa(q, k_cache, v_cache, mask, scale)
        b, t, h, d = q.shape
        return attention_ref(q, k_cache, v_cache, mask, scale).reshape(b, t, h * d)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self._ops is not None:
            from .fast_ops import silu_mul_formula
            return self._ops("silu_mul", silu_mul_formula)(gate, up)
        return F.silu(gate) * up

    def mlp_gate_up(self, y: torch.Tensor, gate, up) -> torch.Tensor:
        """silu(y @ gate.T) * (y @ up.T), the MLP's input half; a backend may fuse it."""
        return self.silu_mul(self.linear(y, gate), self.linear(y, up))
