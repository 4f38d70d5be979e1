"""Shape-only model presets: random-weight `Transformer`s with the exact dimensions of released
models, built directly on the device (weights are drawn there, in the compute dtype, so an 8B
model never passes through host memory).

They measure step costs in the memory-bound regime real deployments live in; their outputs mean
nothing, so speculation on them is evaluated by replaying a measured acceptance profile.
`scale` < 1 shrinks every width (hidden, head_dim, intermediate, vocabulary) by the same factor,
keeping layer and head counts, so tests can build a miniature with the same proportions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, Optional, Tuple

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.config import ModelConfig, RopeScaling
from specpilot.runtime.model import LINEARS, Transformer
from specpilot.runtime.fast_ops import fast_ops_mode
from specpilot.runtime.torch_backend import TorchBackend


class ShapeError(SpecPilotError):
    """An unknown preset, or a scale the preset's dimensions cannot be shrunk by."""


@dataclass(frozen=True)
class ShapePreset:
    """The dimensions of one released model (from its published config.json)."""
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    rope_theta: float
    rope_scaling: Optional[RopeScaling]
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5

    def config(self, scale: float = 1.0) -> ModelConfig:
        """The runtime ModelConfig, every width multiplied by `scale` (exactly)."""
        f = _check_scale(scale)

        def shrink(value: int, what: str, even: bool = False) -> int:
            out = value * f
            if out.denominator != 1 or out < 1 or (even and out.numerator % 2):
                raise ShapeError(f"{self.name}: scale {scale} makes {what} {value} * {scale} = "
                                 f"{float(out)}, not a positive{' even' if even else ''} integer; "
                                 f"choose a scale like 1/2, 1/4, ... 1/32")
            return out.numerator

        return ModelConfig(
            model_type="llama", vocab_size=shrink(self.vocab, "vocab"),
            hidden_size=shrink(self.hidden, "hidden"),
            intermediate_size=shrink(self.intermediate, "intermediate"),
            num_layers=self.layers, num_heads=self.heads, num_kv_heads=self.kv_heads,
            head_dim=shrink(self.head_dim, "head_dim", even=True), rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_embeddings, attention_bias=False, o_bias=False,
            mlp_bias=False, qk_norm=False, sliding_window=None, bos_token_id=None,
            eos_token_ids=())

    def hf_config(self, scale: float = 1.0) -> dict:
        """The HF config.json fields of this preset at `scale` (for checking against HF)."""
        c = self.config(scale)
        s = self.rope_scaling
        rope = {"rope_type": "default", "rope_theta": c.rope_theta}
        if s is not None:
            rope = {"rope_type": "llama3", "rope_theta": c.rope_theta, "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings}
        return {"model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
                "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
                "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
                "max_position_embeddings": c.max_position_embeddings,
                "tie_word_embeddings": c.tie_word_embeddings, "rope_parameters": rope,
                "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False}


PRESETS: Dict[str, ShapePreset] = {
    "llama-3.1-8b": ShapePreset(
        "llama-3.1-8b", hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8,
        head_dim=128, vocab=128256, tie_embeddings=False, rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), max_position_embeddings=131072),
    "llama-3.2-1b": ShapePreset(
        "llama-3.2-1b", hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8,
        head_dim=64, vocab=128256, tie_embeddings=True, rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192), max_position_embeddings=131072),
    # The zoo's gpu-small pair (specpilot/zoo/presets.py), for profiling its step costs without
    # training it first.
    "zoo-gpu-small": ShapePreset(
        "zoo-gpu-small", hidden=1024, intermediate=3072, layers=12, heads=16, kv_heads=4,
        head_dim=64, vocab=8192, tie_embeddings=False, rope_theta=10000.0, rope_scaling=None,
        max_position_embeddings=2048),
    "zoo-gpu-small-drafter": ShapePreset(
        "zoo-gpu-small-drafter", hidden=384, intermediate=1024, layers=4, heads=6, kv_heads=2,
        head_dim=64, vocab=8192, tie_embeddings=False, rope_theta=10000.0, rope_scaling=None,
        max_position_embeddings=2048),
}


def _check_scale(scale) -> Fraction:
    try:
        f = Fraction(scale).limit_denominator(1 << 20)
    except (TypeError, ValueError):
        raise ShapeError(f"scale must be a number in (0, 1], got {scale!r}") from None
    if not 0 < f <= 1:
        raise ShapeError(f"scale must be in (0, 1], got {scale!r}")
    return f


def get_preset(name: str) -> ShapePreset:
    if name not in PRESETS:
        raise ShapeError(f"unknown shape preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def parse_shapes(text: str) -> Tuple[ShapePreset, ShapePreset]:
    """`TARGET:DRAFTER` preset names → the two presets (they must share a vocabulary)."""
    parts = text.split(":")
    if len(parts) != 2 or not all(parts):
        raise ShapeError(f"--shapes takes TARGET:DRAFTER preset names (e.g. "
                         f"llama-3.1-8b:llama-3.2-1b), got {text!r}")
    target, drafter = get_preset(parts[0]), get_preset(parts[1])
    if target.vocab != drafter.vocab:
        raise ShapeError(f"{target.name} (vocab {target.vocab}) and {drafter.name} (vocab "
                         f"{drafter.vocab}) cannot speculate together: they need one vocabulary")
    return target, drafter


def random_tensors(config: ModelConfig, device, dtype: torch.dtype,
                   seed: int = 0) -> Dict[str, torch.Tensor]:
    """Every tensor the forward reads, by HF name, drawn on `device` in `dtype` (no host copy).

    Linear weights ~ N(0, 1/fan_in) and embeddings ~ N(0, 1) keep activations O(1) through the
    layers; norm weights are 1 + U(-0.1, 0.1)."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, d = config.hidden_size, config.head_dim

    def normal(shape, std):
        return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    def norm(n):
        return torch.empty(n, device=device, dtype=dtype).uniform_(0.9, 1.1, generator=gen)

    shapes = {"self_attn.q_proj": (config.num_heads * d, h),
              "self_attn.k_proj": (config.num_kv_heads * d, h),
              "self_attn.v_proj": (config.num_kv_heads * d, h),
              "self_attn.o_proj": (h, config.num_heads * d),
              "mlp.gate_proj": (config.intermediate_size, h),
              "mlp.up_proj": (config.intermediate_size, h),
              "mlp.down_proj": (h, config.intermediate_size)}
    assert set(shapes) == set(LINEARS)
    out = {"model.embed_tokens.weight": normal((config.vocab_size, h), 1.0),
           "model.norm.weight": norm(h)}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = normal((config.vocab_size, h), 1.0 / math.sqrt(h))
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(h)
        out[p + "post_attention_layernorm.weight"] = norm(h)
        for name, shape in shapes.items():
            out[p + name + ".weight"] = normal(shape, 1.0 / math.sqrt(shape[1]))
    return out


def build_preset(name: str, device="cuda", dtype: torch.dtype = torch.bfloat16,
                 scale: float = 1.0, seed: int = 0) -> Transformer:
    """A random-weight Transformer of preset `name` at `scale`, with its weights on `device`."""
    config = get_preset(name).config(scale)
    tensors = random_tensors(config, device, dtype, seed)
    # Fused q/k/v and gate/up, as load_pair builds CUDA models; consumed so no copy lingers.
    fuse = torch.device(device).type == "cuda"
    # The fast path as SPECPILOT_FAST_OPS selects it (per op, whole layers, or off), as on a pair.
    backend = TorchBackend(fast_ops=fast_ops_mode() if fuse else False)
    return Transformer(config, tensors, dtype, device, backend=backend,
                       fuse_projections=fuse, consume_tensors=fuse)


def random_pair(shapes: str, scale: float = 1.0):
    """(target, drafter, graphs) of the `shapes` pair ("TARGET:DRAFTER" presets) with random
    weights (seeds 1 and 2): in bf16 on a CUDA GPU, where `graphs` is True, else in float32 on
    the CPU (to check a script)."""
    graphs = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if graphs else ("cpu", torch.float32)
    target_preset, drafter_preset = parse_shapes(shapes)
    return (build_preset(target_preset.name, device, dtype, scale, seed=1),
            build_preset(drafter_preset.name, device, dtype, scale, seed=2), graphs)


def preset_deployment(shapes: str, gpu: str, scale: float = 1.0, dtype: str = "bfloat16",
                      workload: str = "humaneval"):
    """The ir Deployment of the `shapes` pair ("TARGET:DRAFTER" presets) on `gpu` (a cost-model
    GPU key), for pricing preset shapes without checkpoints."""
    from specpilot.deploy import model_spec_from_config
    from specpilot.ir import Deployment

    target, drafter = parse_shapes(shapes)
    return Deployment(*(model_spec_from_config(p.config(scale), role, dtype, f"shape:{p.name}")
                        for p, role in ((target, "target"), (drafter, "drafter"))),
                      gpu, workload)
