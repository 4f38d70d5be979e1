"""The generated attention inside compiled blocks: the "layers" fast path with
kernels.attention_kernels "generated".

The "layers" path compiles each decoder layer whole (runtime/model.py), and dynamo would trace
into a Triton launch wrapper written for eager calls (argument checks, Python grids). So the
kernel is registered as a torch custom op, `specpilot::generated_attention`: Inductor keeps it
as one opaque call between the kernels it fuses (the KV write before it, the o-projection's
residual after it), and a captured decoder replays its launch like any other. Its fake
implementation gives Inductor the output's shape without running it.

The op names the `GeneratedAttention` that runs it by an integer handle (a custom op takes
tensors and scalars only); the handle is a constant of the compiled graph, one per backend.
"""
from __future__ import annotations

import itertools
import weakref

import torch

from specpilot.ir.errors import SpecPilotError

from .generated_attention import BoundedMask, GeneratedAttention

_RUNNERS: "weakref.WeakValueDictionary[int, GeneratedAttention]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


@torch.library.custom_op("specpilot::generated_attention", mutates_args=())
def generated_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           mask: torch.Tensor, kv_len: torch.Tensor, scale: float,
                           handle: int) -> torch.Tensor:
    """q [B, T, H, D] over the caches [B, S, Hkv, D], visible where mask [B, T, S], each
    request's slots read up to kv_len [B] → [B, T, H*D], by the runner `handle` names."""
    runner = _RUNNERS.get(handle)
    if runner is None:
        raise SpecPilotError(f"no generated attention is registered under handle {handle}: "
                             "its backend was released while a compiled block still calls it")
    return runner(q, k_cache, v_cache, BoundedMask(mask, kv_len), scale)


@generated_attention_op.register_fake
def _(q, k_cache, v_cache, mask, kv_len, scale, handle):
    b, t, h, d = q.shape
    return q.new_empty((b, t, h * d))


class CompiledGeneratedAttention:
    """The attention op of a compiled block's ops (TorchBackend.graph_ops): (q, caches, a
    BoundedMask, scale) → [B, T, H*D] through `generated_attention_op`, run by `runner`.
    A plain mask is refused: its bound would be found in every layer; the forward bounds each
    distinct mask once (`Transformer._compiled_forward`)."""

    def __init__(self, runner: GeneratedAttention):
        self.runner = runner
        self.handle = next(_HANDLES)
        _RUNNERS[self.handle] = runner

    def __call__(self, q, k_cache, v_cache, mask, scale: float) -> torch.Tensor:
        if not isinstance(mask, BoundedMask):
            raise SpecPilotError("the compiled generated attention takes a BoundedMask (the "
                                 "forward's bounded_masks), not a plain mask")
        return torch.ops.specpilot.generated_attention(q, k_cache, v_cache, mask.mask,
                                                       mask.kv_len, float(scale), self.handle)
