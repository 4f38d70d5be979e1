"""A lean Llama-family transformer over a static KV cache, generic in its op backend.

One entry point, `forward`, serves prefill, AR decode, chain verification and tree verification:
the caller says where each new token sits (`positions`, for RoPE), where its K/V goes in the cache
(`slots`) and which cache slots each token may attend to (`mask`). The decode loops own those
decisions; the model owns only the arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from specpilot.ir.errors import SpecPilotError

from .checkpoint import Checkpoint, load_checkpoint
from .config import ModelConfig
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
        cfg, be = self.config, self.backend
        b, t = tokens.shape
        rows = torch.arange(b, device=tokens.device)[:, None].expand(b, t)
        cache.positions[rows, slots] = positions
        windowed = {}
        for window in {cfg.window_of(i) for i in range(cfg.num_layers)} - {None}:
            # HF semantics: a key is visible while query_pos - key_pos < window.
            windowed[window] = mask & ((positions[:, :, None] - cache.positions[:, None, :]) < window)
        cos, sin = cos_sin(self.inv_freq, positions, self.dtype)
        x = self.embed[tokens]
        hd, h, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        for i, layer in enumerate(self.layers):
            lin = layer.linears
            y = be.rmsnorm(x, layer.input_norm, cfg.rms_norm_eps)
            if "self_attn.qkv_proj" in lin:
                q, k, v = be.linear(y, lin["self_attn.qkv_proj"]).split([h * hd, hkv * hd, hkv * hd], -1)
            else:
                q = be.linear(y, lin["self_attn.q_proj"])
                k = be.linear(y, lin["self_attn.k_proj"])
                v = be.linear(y, lin["self_attn.v_proj"])
            q, k, v = q.reshape(b, t, h, hd), k.reshape(b, t, hkv, hd), v.reshape(b, t, hkv, hd)
            if layer.q_norm is not None:
                q = be.rmsnorm(q, layer.q_norm, cfg.rms_norm_eps)
                k = be.rmsnorm(k, layer.k_norm, cfg.rms_norm_eps)
            q = be.rope(q, cos, sin)
            k = be.rope(k, cos, sin)
            cache.write(i, slots, k, v)
            window = cfg.window_of(i)
            layer_mask = mask if window is None else windowed[window]
            a = be.attention(q, cache.k[i], cache.v[i], layer_mask, self.scale)
            x = x + be.linear(a, lin["self_attn.o_proj"])
            y = be.rmsnorm(x, layer.post_norm, cfg.rms_norm_eps)
            if "mlp.gate_up_proj" in lin:
                act = be.silu_mul(*be.linear(y, lin["mlp.gate_up_proj"]).chunk(2, dim=-1))
            else:
                act = be.mlp_gate_up(y, lin["mlp.gate_proj"], lin["mlp.up_proj"])
            x = x + be.linear(act, lin["mlp.down_proj"])
        if logits_at is not None:
            x = torch.gather(x, 1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))
        x = be.rmsnorm(x, self.final_norm, cfg.rms_norm_eps)
        return be.linear(x, self.lm_head).to(torch.float32)
