"""A lean Llama-family transformer over a static KV cache, generic in its op backend.

One entry point, `forward`, serves prefill, AR decode, chain verification and tree verification:
the caller says where each new token sits (`positions`, for RoPE), where its K/V goes in the cache
(`slots`) and which cache slots each token may attend to (`mask`). The decode loops own those
decisions; the model owns only the arithmetic.

The arithmetic is three blocks: `prologue` (embeddings, RoPE tables, window masks),
`decoder_layer` once per layer, `epilogue` (final norm, LM head). Eagerly, each op is one call of
the backend. A decode step is bound by how many kernels it launches rather than by the bytes it
reads (runtime/fast_ops.py has the H200 numbers), so with the torch backend's "layers" fast path
(kernels.fast_path, or SPECPILOT_FAST_OPS=layers) each block is compiled whole instead: Inductor
fuses the small ops between the GEMMs and SDPA (residual add with RMSNorm, RoPE with the KV
write, SwiGLU), and every layer replays the one compiled layer graph with its own weights. With
the generated attention the compiled layer calls its kernel as a custom op
(runtime/compiled_attention.py) where it would call SDPA.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from specpilot.ir.errors import SpecPilotError

from .checkpoint import Checkpoint, load_checkpoint
from .config import ModelConfig
from .fast_ops import CompiledBlocks, mark_dims
from .generated_attention import BoundedMask
from .kv_cache import KVCache
from .rope import cos_sin, inverse_frequencies
from .torch_backend import TorchBackend

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# Projections that read the same input, and the name of their concatenation when fused.
FUSED_GROUPS = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    linears: Dict[str, object]          # LINEARS name → backend-prepared weight
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]


class Transformer:
    def __init__(self, config: ModelConfig, tensors: Dict[str, torch.Tensor], dtype: torch.dtype,
                 device="cpu", backend=None, weight_formats: Optional[Dict[str, str]] = None,
                 fuse_projections: bool = False, consume_tensors: bool = False):
        """`fuse_projections` concatenates q/k/v and gate/up into one matrix each (one GEMV
        instead of three or two: fewer launches, and a wider matrix streams closer to the
        bandwidth limit). It needs the torch backend and dense weights; the outputs are the same
        dot products, though a GEMM library may block a wider matrix differently, so logits can
        differ in the last bits. `consume_tensors` pops each tensor from `tensors` once used,
        so fusing does not hold two copies of the weights on the device."""
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.backend = backend or TorchBackend()
        formats = weight_formats or {}

        def get(name):
            t = tensors.pop(name) if consume_tensors else tensors[name]
            return t.to(device=self.device, dtype=dtype)

        def bias(name, present):
            # Biases follow the config, as in HF: a stray bias tensor in the file is ignored.
            return get(name) if present else None

        self.embed = get("model.embed_tokens.weight")
        self.final_norm = get("model.norm.weight")
        lm_head = self.embed if config.tie_word_embeddings else get("lm_head.weight")
        self.lm_head = self.backend.prepare_linear("lm_head", lm_head, None, formats.get("lm_head", "dense"))
        has_bias = {"self_attn.q_proj": config.attention_bias, "self_attn.k_proj": config.attention_bias,
                    "self_attn.v_proj": config.attention_bias, "self_attn.o_proj": config.o_bias,
                    "mlp.gate_proj": config.mlp_bias, "mlp.up_proj": config.mlp_bias,
                    "mlp.down_proj": config.mlp_bias}
        self.fused = bool(fuse_projections)
        if self.fused and getattr(self.backend, "name", None) != "torch":
            raise SpecPilotError("fuse_projections needs the torch backend (a generated backend "
                                 "has one kernel per checkpoint linear)")
        self.layers: List[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            linears = {}
            fusing = {}
            if self.fused:
                fusing = {fused: parts for fused, parts in FUSED_GROUPS.items()
                          if all(formats.get(f"layers.{i}.{x}", "dense") in ("dense", "bf16", "fp32",
                                                                            "fp16")
                                 for x in parts)}
            fused_parts = {x for parts in fusing.values() for x in parts}
            for fused, parts in fusing.items():
                biases = [bias(p + x + ".bias", has_bias[x]) for x in parts]
                linears[fused] = self.backend.prepare_linear(
                    f"layers.{i}.{fused}", torch.cat([get(p + x + ".weight") for x in parts]),
                    None if biases[0] is None else torch.cat(biases), "dense")
            for lin in LINEARS:
                if lin in fused_parts:
                    continue
                name = f"layers.{i}.{lin}"
                linears[lin] = self.backend.prepare_linear(
                    name, get(p + lin + ".weight"), bias(p + lin + ".bias", has_bias[lin]),
                    formats.get(name, "dense"))
            self.layers.append(LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                post_norm=get(p + "post_attention_layernorm.weight"),
                linears=linears,
                q_norm=get(p + "self_attn.q_norm.weight") if config.qk_norm else None,
                k_norm=get(p + "self_attn.k_norm.weight") if config.qk_norm else None))
        self.inv_freq = inverse_frequencies(config).to(self.device)
        self.scale = config.head_dim ** -0.5
        # The compiled blocks of the "layers" fast path (runtime/fast_ops.py). Made here so
        # that shallow copies (runtime/two_level.py's cheap verifiers) share its graphs.
        self._blocks = self._new_blocks() if compiles_layers(self.backend) else None

    @classmethod
    def from_checkpoint(cls, checkpoint, dtype="float32", device="cpu", backend=None,
                        weight_formats=None, fuse_projections: bool = False) -> "Transformer":
        """Load a checkpoint folder (or an already loaded Checkpoint) as a model in `dtype`
        ("float32", "bfloat16", "float16" or a torch dtype); errors name what to fix."""
        if isinstance(dtype, str) and dtype not in DTYPES:
            raise SpecPilotError(f"dtype {dtype!r} is not supported: choose one of "
                                 f"{', '.join(sorted(DTYPES))}")
        torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
        return cls(ckpt.config, ckpt.tensors, torch_dtype, device, backend, weight_formats,
                   fuse_projections=fuse_projections)

    def with_backend(self, backend) -> "Transformer":
        """A copy sharing this model's weights that runs `backend`, with compiled blocks of its
        own where that backend compiles whole layers (the original's keep theirs)."""
        out = copy.copy(self)
        out.backend = backend
        out._blocks = out._new_blocks() if compiles_layers(backend) else None
        return out

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        c = self.config
        return KVCache.allocate(c.num_layers, batch, capacity, c.num_kv_heads, c.head_dim,
                                self.dtype, self.device)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, cache: KVCache,
                logits_at: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Run new tokens [B, T] through the model, writing their K/V at `slots` [B, T].

        mask [B, T, S] says which cache slots each new token sees (its own slot included).
        logits_at [B, R] picks the token indices whose logits are returned ([B, R, V] float32);
        None returns logits for all T.
        """
        if compiles_layers(self.backend):
            return self._compiled_forward(tokens, positions, slots, mask, cache, logits_at)
        cfg, be = self.config, self.backend
        windows = self._windows()
        x, cos, sin, masks = prologue(tokens, positions, slots, mask, cache.positions, self.embed,
                                      self.inv_freq, windows, self.dtype)
        delta, dims = None, self._head_dims()
        layer_masks = self._layer_masks(masks, windows)
        if hasattr(be, "attention_masks"):     # what the backend's attention reads
            layer_masks = be.attention_masks(layer_masks)
        for i, (layer, layer_mask) in enumerate(zip(self.layers, layer_masks)):
            x, delta = decoder_layer(be, layer, x, delta, cos, sin, layer_mask, slots, cache.k[i],
                                     cache.v[i], dims, cfg.rms_norm_eps, self.scale)
        return epilogue(be, x, delta, logits_at, self.final_norm, self.lm_head, cfg.rms_norm_eps)

    # Derived from the config at each forward, not at construction: runtime/two_level.py's
    # layer-skip verifier is a shallow copy with fewer layers and its own config.
    def _windows(self) -> Tuple[int, ...]:
        """The distinct sliding windows of the layers, in a fixed order."""
        cfg = self.config
        return tuple(sorted({cfg.window_of(i) for i in range(cfg.num_layers)} - {None}))

    def _layer_masks(self, masks, windows: Tuple[int, ...]) -> list:
        """Each layer's mask out of `prologue`'s masks: masks[0] for a layer that attends to
        everything, masks[1 + j] for one with the j-th of `windows`."""
        cfg = self.config
        return [masks[0 if w is None else 1 + windows.index(w)]
                for w in (cfg.window_of(i) for i in range(len(self.layers)))]

    def _head_dims(self) -> Tuple[int, int, int]:
        """(query heads, kv heads, head dim), as `decoder_layer` takes them."""
        cfg = self.config
        return cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def _new_blocks(self) -> CompiledBlocks:
        return CompiledBlocks(f"{self.config.model_type}{self.config.hidden_size}")

    def _compiled_forward(self, tokens, positions, slots, mask, cache, logits_at):
        """`forward` as compiled blocks (the "layers" fast path, runtime/fast_ops.py): the
        prologue, one graph shared by every layer, the epilogue. Batch, token and cache-slot
        counts are symbolic sizes, so the shapes a decoder uses (T = 1 steps, k + 1 chain and
        tree verifications, prefill buckets, any batch) compile once per shape class.
        Inputs are made contiguous first: an expanded or strided view would be a new stride
        pattern for dynamo's guards, and a recompile."""
        if self._blocks is None:    # a backend swapped in after construction
            self._blocks = self._new_blocks()
        blocks, cfg, dt = self._blocks, self.config, self.dtype
        tokens, positions, slots, mask = (mark_dims(t.contiguous(), 0, 1)
                                          for t in (tokens, positions, slots, mask))
        mark_dims(mask, 2)
        windows = self._windows()
        # Dynamo guards on whether two inputs are one tensor (append_step passes its slots as
        # positions too): each case gets its own compiled copy rather than a recompile.
        aliased = positions is slots
        x, delta, cos, sin, masks = blocks.get(
            compiled_prologue, "aliased" if aliased else "distinct", dt, *windows)(
            tokens, positions, slots, mask, mark_dims(cache.positions, 0, 1), self.embed,
            self.inv_freq, windows, dt)
        for t in (x, delta, cos, sin):
            mark_dims(t, 0, 1)
        for m in masks:
            mark_dims(m, 0, 1, 2)
        layer_fn, ops = blocks.get(decoder_layer, dt), self.backend.graph_ops
        dims = self._head_dims()
        # With the generated attention each distinct mask comes bounded, once a forward and
        # outside the layers (two launches), as in the per-op forward; the compiled layer
        # passes the pair to the kernel's op (runtime/compiled_attention.py).
        layer_masks = self.backend.attention_masks(self._layer_masks(masks, windows))
        for m in layer_masks:
            if isinstance(m, BoundedMask):
                mark_dims(m.kv_len, 0)
        for i, (layer, layer_mask) in enumerate(zip(self.layers, layer_masks)):
            x, delta = layer_fn(ops, layer, x, delta, cos, sin, layer_mask, slots,
                                mark_dims(cache.k[i], 0, 1), mark_dims(cache.v[i], 0, 1), dims,
                                cfg.rms_norm_eps, self.scale)
            mark_dims(x, 0, 1)
            mark_dims(delta, 0, 1)
        picked = logits_at is not None
        if picked:
            logits_at = mark_dims(logits_at.contiguous(), 0, 1)
        return blocks.get(epilogue, "rows" if picked else "all", dt)(
            ops, x, delta, logits_at, self.final_norm, self.lm_head, cfg.rms_norm_eps)


def compiles_layers(backend) -> bool:
    """Whether `backend` asks for the compiled-blocks forward. Only a TorchBackend itself: a
    wrapper that replaces one of its ops (the ragged runtime's varlen attention) must run them
    one by one, and then gets the backend's per-op fast path."""
    return isinstance(backend, TorchBackend) and backend.compiles_layers


def prologue(tokens, positions, slots, mask, cache_positions, embed, inv_freq,
             windows: Tuple[int, ...], dtype):
    """Record the new tokens' positions in the cache and build what every layer reads:
    (embeddings [B, T, hidden], cos, sin [B, T, D], masks), masks[0] being `mask` and
    masks[1 + j] it restricted to the j-th sliding window."""
    b, t = tokens.shape
    rows = torch.arange(b, device=tokens.device)[:, None].expand(b, t)
    cache_positions[rows, slots] = positions
    masks = [mask]
    for window in windows:
        # HF semantics: a key is visible while query_pos - key_pos < window.
        masks.append(mask & ((positions[:, :, None] - cache_positions[:, None, :]) < window))
    cos, sin = cos_sin(inv_freq, positions, dtype)
    return embed[tokens], cos, sin, masks


def compiled_prologue(tokens, positions, slots, mask, cache_positions, embed, inv_freq,
                      windows: Tuple[int, ...], dtype):
    """`prologue` with a zero residual delta for the first layer (one graph for every layer;
    the zeros are written by the embedding's kernel)."""
    x, cos, sin, masks = prologue(tokens, positions, slots, mask, cache_positions, embed,
                                  inv_freq, windows, dtype)
    return x, torch.zeros_like(x), cos, sin, masks


def decoder_layer(be, layer: LayerWeights, x, delta, cos, sin, mask, slots, k_cache, v_cache,
                  dims: Tuple[int, int, int], eps: float, scale: float):
    """One decoder layer with `be`'s ops, writing its K/V into k_cache/v_cache at `slots`.

    The residual stream arrives as x plus the previous layer's MLP output `delta` (None before
    the first layer) and leaves as (x, this layer's MLP output): the add then sits in the same
    block as the RMSNorm that reads its result, so a compiler fuses the two."""
    h, hkv, hd = dims
    b, t = x.shape[0], x.shape[1]
    lin = layer.linears
    if delta is not None:
        x = x + delta
    y = be.rmsnorm(x, layer.input_norm, eps)
    if "self_attn.qkv_proj" in lin:
        q, k, v = be.linear(y, lin["self_attn.qkv_proj"]).split([h * hd, hkv * hd, hkv * hd], -1)
    else:
        q = be.linear(y, lin["self_attn.q_proj"])
        k = be.linear(y, lin["self_attn.k_proj"])
        v = be.linear(y, lin["self_attn.v_proj"])
    q, k, v = q.reshape(b, t, h, hd), k.reshape(b, t, hkv, hd), v.reshape(b, t, hkv, hd)
    if layer.q_norm is not None:
        q = be.rmsnorm(q, layer.q_norm, eps)
        k = be.rmsnorm(k, layer.k_norm, eps)
    q = be.rope(q, cos, sin)
    k = be.rope(k, cos, sin)
    rows = torch.arange(b, device=slots.device)[:, None].expand(b, t)
    k_cache[rows, slots] = k
    v_cache[rows, slots] = v
    a = be.attention(q, k_cache, v_cache, mask, scale)
    x = x + be.linear(a, lin["self_attn.o_proj"])
    y = be.rmsnorm(x, layer.post_norm, eps)
    if "mlp.gate_up_proj" in lin:
        act = be.silu_mul(*be.linear(y, lin["mlp.gate_up_proj"]).chunk(2, dim=-1))
    else:
        act = be.mlp_gate_up(y, lin["mlp.gate_proj"], lin["mlp.up_proj"])
    return x, be.linear(act, lin["mlp.down_proj"])


def epilogue(be, x, delta, logits_at, final_norm, lm_head, eps: float):
    """Float32 logits of the residual stream x + delta, at the rows logits_at [B, R] picks
    (all rows for None)."""
    if delta is not None:
        x = x + delta
    if logits_at is not None:
        x = torch.gather(x, 1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))
    x = be.rmsnorm(x, final_norm, eps)
    return be.linear(x, lm_head).to(torch.float32)
