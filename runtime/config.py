"""Read an HF `config.json` into a `ModelConfig`, for the Llama family of architectures.

Supported `model_type`s: llama (Llama 2/3/3.1), mistral, qwen2 (Qwen2/2.5, QKV bias), qwen3
(q/k RMSNorm). Both spellings of RoPE settings are read: transformers 4.x (`rope_theta` +
`rope_scaling`) and 5.x (`rope_parameters`, which carries `rope_theta` and the scaling keys).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from .errors import CheckpointError, UnsupportedModel

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# RoPE variants we implement exactly; anything else is refused rather than silently wrong.
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str                       # "llama3" | "linear"
    factor: float
    low_freq_factor: float = 1.0         # llama3 only
    high_freq_factor: float = 4.0        # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[RopeScaling]
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool        # bias on q, k, v projections
    o_bias: bool                # bias on o_proj (Llama's attention_bias also covers it)
    mlp_bias: bool
    qk_norm: bool               # Qwen3: RMSNorm over each head of q and k before RoPE
    sliding_window: Optional[int]
    bos_token_id: Optional[int]
    eos_token_ids: Tuple[int, ...]


def _require_int(cfg: dict, key: str, path: str, default=None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise CheckpointError(f"{path}: missing required field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{path}: field '{key}' must be a positive integer, got {value!r}")
    return value


def _rope_settings(cfg: dict, path: str) -> Tuple[float, Optional[RopeScaling]]:
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = dict(params)
    else:
        theta = cfg.get("rope_theta", 10000.0)
        scaling = dict(cfg.get("rope_scaling") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModel(f"{path}: RoPE type {rope_type!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    if rope_type == "default":
        return float(theta), None
    factor = float(scaling.get("factor", 1.0))
    if rope_type == "linear":
        return float(theta), RopeScaling("linear", factor)
    return float(theta), RopeScaling(
        "llama3", factor,
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)))


def _eos_ids(value) -> Tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def parse_model_config(cfg: dict, path: str = "config.json") -> ModelConfig:
    """Validate and normalise a config dict; errors name the file and the field."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(f"{path}: model_type {model_type!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    hidden = _require_int(cfg, "hidden_size", path)
    heads = _require_int(cfg, "num_attention_heads", path)
    kv_heads = _require_int(cfg, "num_key_value_heads", path, default=heads)
    if heads % kv_heads:
        raise CheckpointError(f"{path}: num_attention_heads ({heads}) is not a multiple of "
                              f"num_key_value_heads ({kv_heads})")
    head_dim = cfg.get("head_dim") or hidden // heads
    theta, scaling = _rope_settings(cfg, path)
    sliding = cfg.get("sliding_window")
    if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
        sliding = None  # Qwen2 configs carry a window that is only used when switched on
    if model_type == "qwen3" and not cfg.get("use_sliding_window", False):
        sliding = None
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=_require_int(cfg, "vocab_size", path),
        hidden_size=hidden,
        intermediate_size=_require_int(cfg, "intermediate_size", path),
        num_layers=_require_int(cfg, "num_hidden_layers", path),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=attention_bias if model_type in ("llama", "mistral") else False,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        sliding_window=int(sliding) if sliding else None,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
    )


def load_model_config(checkpoint_dir: str) -> ModelConfig:
    """Read `<checkpoint_dir>/config.json`; a clear CheckpointError if missing or malformed."""
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"checkpoint folder {checkpoint_dir!r} does not exist")
    path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{checkpoint_dir!r} has no config.json: is it an HF checkpoint folder?")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    return parse_model_config(cfg, path)
