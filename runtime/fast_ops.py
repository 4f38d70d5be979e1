"""Fewer, fused kernels for the torch backend on a CUDA GPU.

A decode step of a small model is bound by how many kernels it launches, not by its bytes: on an
H200 a graphed AR step of the zoo's 161M target launched 255 kernels (about 3 µs each, 0.8 ms)
against 0.1 ms of weight traffic, and at Llama-3.1-8B shape the small kernels between the GEMMs
(norms, RoPE, the KV write, attention's copies, SwiGLU, residual adds) cost about 1.6 ms of a
5.6 ms step. The reference RMSNorm is about ten elementwise kernels, RoPE five per tensor, the
reference attention a dozen (float32 copies of the cache, two einsums, mask, softmax).

Two modes, chosen by a Program's kernels.fast_path ("ops" without a Program); SPECPILOT_FAST_OPS
overrides it (`fast_ops_mode`):
- "ops" (the default; "1"): RMSNorm, RoPE and the SwiGLU product are the reference
  functions themselves compiled by `torch.compile` one op at a time (`compiled`; each becomes one
  fused kernel), and attention is one `scaled_dot_product_attention` call (`grouped_sdpa`).
- "layers": the model compiles whole blocks (runtime/model.py, `Transformer.forward`): the
  prologue (embedding, RoPE tables, window masks, cache positions), each decoder layer, and the
  final norm with the LM head. Inductor then fuses across op boundaries: residual add with the
  next RMSNorm, RoPE of q with its layout change for attention, RoPE of k with the KV-cache
  write, the mask expansion, SwiGLU with its split. What stays are the cuBLAS GEMMs and SDPA
  (or, with kernels.attention_kernels "generated", its kernel as a custom op:
  runtime/compiled_attention.py).
  Every layer runs the same compiled graph (weights are arguments), so compile time does not
  grow with depth. `CompiledBlocks` keeps the compiled functions of one model.
"0" turns both off (e.g. to measure what they save).

Grouped-query attention is expressed without copying the cache: the query heads that share a
kv head become extra query rows of that head, with the mask repeated for them.

The arithmetic is the reference's up to rounding order (fused reductions, bf16 attention
probabilities), which token forcing tolerates as near-ties.
"""
from __future__ import annotations

import os
import types
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

FAST_OPS_ENV = "SPECPILOT_FAST_OPS"
OFF, OPS, LAYERS = "off", "ops", "layers"


def fast_ops_mode(default: str = OPS) -> str:
    """The fast path SPECPILOT_FAST_OPS asks for: "off" for "0", "layers" for "layers", "ops"
    for "1" or "ops"; unset (or anything else), `default` (a Program's kernels.fast_path where
    there is one: the variable overrides Programs, for experiments)."""
    value = os.environ.get(FAST_OPS_ENV, "").strip().lower()
    return {"0": OFF, "1": OPS, OPS: OPS, LAYERS: LAYERS}.get(value, default)


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


# Compiled graphs a per-op function may hold. Its code object is shared by every model of the
# process, and each dtype, memory layout (RoPE reads q and k as views of one projection, whose
# strides differ between models) and size-1 specialisation adds one; dynamo's default of 8, past
# which a fullgraph function fails outright, was reached by a process that loads a few dozen
# models (the GPU test suite).
RECOMPILE_LIMIT = 64


def compiled(fn, backend: str = "inductor"):
    """`fn` compiled with shapes dynamic, so batch and width changes do not recompile beyond the
    size-1 specialisations. (`backend` "eager" traces without generating code: for tests.)"""
    _allow_recompiles(RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=True, fullgraph=True, backend=backend)


def _allow_recompiles(limit: int) -> None:
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):   # the newer name, then the older
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
            return


def compile_refusal() -> Optional[str]:
    """Why torch.compile cannot run in this process (None when it can): asked before compiling
    whole layers and the length policy's round."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    return None


def compiles_policy() -> bool:
    """Whether a captured decoder runs its length policy's round compiled
    (runtime/batch_length.py, `compiled_policy_round`): unless SPECPILOT_FAST_OPS is "0" (to
    measure what it saves) or torch.compile cannot run here."""
    return fast_ops_mode() != OFF and compile_refusal() is None


def private_compile(fn: Callable, tag: str) -> Callable:
    """`torch.compile(fn)` (fullgraph, Inductor's default mode: no cudagraphs of its own, so the
    result can be captured inside our CUDA graphs) on a private copy of fn's code object.

    Dynamo keeps compiled graphs, and counts recompiles against its recompile_limit (8 unless
    `compiled` has raised it), per code object. One copy per model and block gives each its own
    budget: a target and a drafter of different widths, or another model loaded in the same
    process, never push a block past the limit (past it, a fullgraph function fails)."""
    name = f"{fn.__name__}_{tag}"
    names = {"co_name": name}
    if hasattr(fn.__code__, "co_qualname"):  # Python 3.11+
        names["co_qualname"] = name
    code = fn.__code__.replace(**names)
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return torch.compile(copy, fullgraph=True, dynamic=None, options=_inductor_options())


def _inductor_options() -> dict:
    """Round bf16/fp16 intermediates where eager torch rounds them (a residual add before its
    RMSNorm, RoPE's products), so fused blocks keep the reference's (and HF's) numerics; it
    costs a conversion per value in kernels bound by memory."""
    import torch._inductor.config as inductor_config

    return ({"emulate_precision_casts": True}
            if hasattr(inductor_config, "emulate_precision_casts") else {})


def mark_dims(tensor: Optional[torch.Tensor], *dims: int) -> Optional[torch.Tensor]:
    """Ask dynamo to compile `dims` of `tensor` as symbolic sizes (batch, tokens, cache slots).

    Only these: hidden and head sizes stay static, so Inductor picks tile sizes for them. A
    dim of size 1 is still specialised (T = 1 decode steps get their own graph), which bounds
    a block at four shape classes: batch 1 or more, tokens 1 or more."""
    if tensor is not None:
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return tensor


class CompiledBlocks:
    """The compiled blocks of one model: each (block function, variant, dtype) gets its own
    `private_compile` copy, made on first use. Compilation happens at the first call with a
    shape class, which in a graphed decoder is its warm-up before capture: capturing then only
    replays compiled code."""

    def __init__(self, owner: str = "model"):
        self.owner = owner
        self._fns: Dict[Tuple, Callable] = {}

    def get(self, fn: Callable, *variant) -> Callable:
        key = (fn, *variant)
        if key not in self._fns:
            tag = "_".join([self.owner, *(str(v).replace(".", "_") for v in variant)])
            self._fns[key] = private_compile(fn, tag)
        return self._fns[key]

    def graphs(self) -> Dict[str, int]:
        """How many graphs dynamo holds for each compiled block, by the block's private name
        (a recompile adds one); empty where this torch cannot list them."""
        try:
            from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        except ImportError:
            return {}
        return {opt.__wrapped__.__name__: len(_debug_get_cache_entry_list(opt.__wrapped__.__code__))
                for opt in self._fns.values()}
