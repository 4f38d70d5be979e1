"""The `torch` backend: every op of the forward pass as plain torch, matching HF's numerics.

A backend is an object with these methods; the `generated` backend (a Program's kernels) has
the same interface, so the model and the decode loops never know which one runs.
"""
from __future__ import annotations

import copy
import warnings
from typing import Optional, Union

import torch
import torch.nn.functional as F

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.program import ATTENTION_KERNELS

from . import fast_ops as _fast_ops
from .fast_ops import LAYERS, OFF, OPS, compiled, grouped_sdpa
from .reference_ops import attention_ref, rmsnorm_ref, rope_ref


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rmsnorm_ref(x, weight, eps)[0]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D]."""
    b, t, h, d = x.shape
    return rope_ref(x.reshape(b * t, h, d), cos.reshape(b * t, d),
                    sin.reshape(b * t, d)).reshape(b, t, h, d)


def _reference_attention(q, k_cache, v_cache, mask, scale) -> torch.Tensor:
    b, t, h, d = q.shape
    return attention_ref(q, k_cache, v_cache, mask, scale).reshape(b, t, h * d)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


class TorchBackend:
    """Every op is its kernel family's torch reference (runtime/reference_ops.py): the stock
    decoder and the generated kernels' tests share one definition of each op's numerics.

    `fast_ops` (for a CUDA GPU; runtime/fast_ops.py says why: a small model's decode step is
    bound by its kernel count) is False (or "off"), True (or "ops") or "layers":
    - True: those same references compiled one op at a time with `torch.compile` (each becomes
      one fused kernel instead of several), attention one grouped SDPA call;
    - "layers": the model compiles whole blocks (`Transformer.forward`) from `graph_ops`, the
      references with the grouped SDPA attention, so Inductor fuses across ops. Its per-op
      methods are the True path's, for wrappers that replace an op (they run op by op).
    Where whole-block compilation cannot run, "layers" warns with the reason and runs as True.

    `attention_kernels` "generated" (a Program's kernels.attention_kernels) runs attention by
    the codegen kernel instead (runtime/generated_attention.py), on or off the fast path (off
    it, on the CPU, in Triton's interpreter), built into `kernel_cache`. With "layers" the
    compiled blocks call it as a custom op (runtime/compiled_attention.py).
    """

    name = "torch"

    def __init__(self, fast_ops: Union[bool, str] = False, attention_kernels: str = "model",
                 kernel_cache=None):
        mode = {False: OFF, True: OPS}.get(fast_ops, fast_ops)
        if mode not in (OFF, OPS, LAYERS):
            raise SpecPilotError(f"fast_ops must be False, True, {OPS!r} or {LAYERS!r}, "
                                 f"got {fast_ops!r}")
        if attention_kernels not in ATTENTION_KERNELS:
            raise SpecPilotError(f"attention_kernels must be "
                                 f"{' or '.join(map(repr, ATTENTION_KERNELS))}, got "
                                 f"{attention_kernels!r}")
        if mode == LAYERS:
            refusal = _fast_ops.compile_refusal()
            if refusal is not None:
                warnings.warn(f"fast_ops='layers' runs as the per-op fast path: {refusal}",
                              stacklevel=2)
                mode = OPS
        self.fast_ops_mode = mode
        self._rmsnorm, self._rope, self._silu_mul = _rmsnorm, _rope, _silu_mul
        self._attention = _reference_attention
        if self.fast_ops:
            self._rmsnorm, self._rope, self._silu_mul = (compiled(_rmsnorm), compiled(_rope),
                                                         compiled(_silu_mul))
            self._attention = grouped_sdpa
        self.attention_kernels = "model"
        # What a compiled block calls: plain references (torch.compile traces them) with the
        # grouped SDPA attention. Never the per-op compiled functions: blocks compile whole.
        self.graph_ops = _graph_ops() if self.compiles_layers else None
        if attention_kernels == "generated":
            self._use_generated_attention(kernel_cache)

    @property
    def fast_ops(self) -> bool:
        """Whether any fast path runs ("ops" or "layers")."""
        return self.fast_ops_mode != OFF

    @property
    def compiles_layers(self) -> bool:
        """Whether the model compiles whole blocks (`fast_ops_mode` "layers")."""
        return self.fast_ops_mode == LAYERS

    def prepare_linear(self, name: str, weight: torch.Tensor, bias: Optional[torch.Tensor], fmt: str):
        """Turn a checkpoint weight into whatever `linear` consumes (dense here)."""
        return (weight, bias)

    def linear(self, x: torch.Tensor, packed) -> torch.Tensor:
        weight, bias = packed
        return F.linear(x, weight, bias)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._rmsnorm(x, weight, eps)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D]; cos/sin [B, T, D]."""
        return self._rope(x, cos, sin)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, T, H, D] over cache [B, S, Hkv, D] with visibility mask [B, T, S] → [B, T, H*D]."""
        return self._attention(q, k_cache, v_cache, mask, scale)

    def with_generated_attention(self, kernel_cache=None) -> "TorchBackend":
        """A copy of this backend (sharing its compiled ops) whose attention is the generated
        kernel, as TorchBackend(..., attention_kernels="generated") builds it."""
        out = copy.copy(self)
        out._use_generated_attention(kernel_cache)
        return out

    def _use_generated_attention(self, kernel_cache) -> None:
        from .generated_attention import GeneratedAttention

        self.attention_kernels = "generated"
        self._attention = GeneratedAttention(kernel_cache)
        if self.compiles_layers:
            from .compiled_attention import CompiledGeneratedAttention

            self.graph_ops = _graph_ops(CompiledGeneratedAttention(self._attention))

    @property
    def attention_kernel_cache(self):
        """The KernelCache the generated attention builds into (None for the model's
        attention, or before it chose one)."""
        return getattr(self._attention, "kernel_cache", None)

    def attention_masks(self, masks: list) -> list:
        """A forward's layer masks as `attention` reads them: the generated attention pairs each
        with its bound, found once a forward (runtime/generated_attention.py); else as given."""
        if self.attention_kernels == "generated":
            return self._attention.bounded_masks(masks)
        return masks

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self._silu_mul(gate, up)

    def mlp_gate_up(self, y: torch.Tensor, gate, up) -> torch.Tensor:
        """silu(y @ gate.T) * (y @ up.T), the MLP's input half; a backend may fuse it."""
        return self.silu_mul(self.linear(y, gate), self.linear(y, up))


def _graph_ops(attention=grouped_sdpa) -> TorchBackend:
    ops = TorchBackend()
    ops._attention = attention
    return ops
