"""A small trainable Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention) for the zoo.

Its parameter names are exactly those of HF `LlamaForCausalLM` ("model.embed_tokens.weight",
"model.layers.0.self_attn.q_proj.weight", ..., "model.norm.weight", "lm_head.weight"), and its
arithmetic follows HF's (same RoPE layout, same RMSNorm), so its state dict saved as safetensors
is a checkpoint HF transformers loads and runs to the same logits. It is a training module only:
full-sequence causal attention, no KV cache.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.torch_version import TorchVersion

from specpilot.zoo.presets import ModelDims


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(head_dim: int, max_positions: int, theta: float):
    """cos/sin tables (max_positions, head_dim) in HF Llama's half-split layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """Rotate (B, heads, T, head_dim) queries or keys by position."""
    return x * cos + _rotate_half(x) * sin


# torch 2.5 added `enable_gqa`: flash attention then reads each kv head for its whole query group
# instead of a copy of the keys and values per query head.
SDPA_HAS_GQA = TorchVersion(torch.__version__) >= (2, 5)


def causal_attention(q, k, v, native_gqa: bool):
    """Causal softmax attention of q (B, heads, T, d) over k, v (B, kv_heads, T, d).

    Query head h reads kv head h // (heads // kv_heads), as HF's repeat_kv does; `native_gqa`
    lets SDPA do that grouping itself (torch >= 2.5) rather than repeating k and v first.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads == kv_heads:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if native_gqa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    group = heads // kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = dims.heads, dims.kv_heads, dims.head_dim
        self.q_proj = nn.Linear(dims.hidden, dims.heads * dims.head_dim, bias=False)
        self.k_proj = nn.Linear(dims.hidden, dims.kv_heads * dims.head_dim, bias=False)
        self.v_proj = nn.Linear(dims.hidden, dims.kv_heads * dims.head_dim, bias=False)
        self.o_proj = nn.Linear(dims.heads * dims.head_dim, dims.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        # In q's dtype, as HF does: under bf16 autocast the rotation stays in bf16 (a no-op cast
        # in float32).
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Native grouping on CUDA only: there it saves the copies; on CPU the explicit repeat keeps
        # the arithmetic, hence the CPU presets' weights, exactly what they were.
        y = causal_attention(q, k, v, native_gqa=SDPA_HAS_GQA and q.is_cuda)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.gate_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.up_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.down_proj = nn.Linear(dims.intermediate, dims.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.self_attn = Attention(dims)
        self.mlp = MLP(dims)
        self.input_layernorm = RMSNorm(dims.hidden, dims.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(dims.hidden, dims.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """The `model.` prefix of HF LlamaForCausalLM: embeddings, layers, final norm."""

    def __init__(self, dims: ModelDims, vocab_size: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, dims.hidden)
        self.layers = nn.ModuleList(DecoderLayer(dims) for _ in range(dims.layers))
        self.norm = RMSNorm(dims.hidden, dims.rms_norm_eps)


class TrainLlama(nn.Module):
    """Llama causal LM with HF LlamaForCausalLM parameter names; `forward(ids)` gives logits."""

    def __init__(self, dims: ModelDims, vocab_size: int):
        super().__init__()
        self.dims, self.vocab_size = dims, vocab_size
        self.model = Backbone(dims, vocab_size)
        self.lm_head = nn.Linear(dims.hidden, vocab_size, bias=False)
        cos, sin = rope_tables(dims.head_dim, dims.max_position_embeddings, dims.rope_theta)
        # Derived from the config, so kept out of the state dict (HF recomputes them too).
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2 style init from `generator`: N(0, 0.02), residual outputs scaled by 1/sqrt(2 layers)."""
        residual_std = 0.02 / math.sqrt(2 * self.dims.layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                else:
                    std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=generator) * std)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        if t > self.dims.max_position_embeddings:
            raise ValueError(f"sequence of {t} tokens exceeds max_position_embeddings="
                             f"{self.dims.max_position_embeddings}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
