"""Read an HF `config.json` into a `ModelConfig`, for the Llama family of architectures.

Supported `model_type`s: llama (Llama 2/3/3.1), mistral, qwen2 (Qwen2/2.5, QKV bias), qwen3
(q/k RMSNorm). Both spellings of RoPE settings are read: transformers 4.x (`rope_theta` +
`rope_scaling`) and 5.x (`rope_parameters`, which carries `rope_theta` and the scaling keys).

HF transformers is the reference: a field missing from config.json takes the default of that
model type's HF config class, and each family's quirks (which projections carry a bias, which
layers slide) are resolved here so the model code never branches on `model_type`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Optional, Tuple

from .errors import CheckpointError, UnsupportedModel

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# RoPE variants we implement exactly; anything else is refused rather than silently wrong.
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
SUPPORTED_ACTIVATIONS = ("silu",)

# HF config-class defaults for fields that real config.json files often omit.
_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "num_key_value_heads": None, "head_dim": None,
              "sliding_window": None},
    "mistral": {"max_position_embeddings": 4096 * 32, "num_key_value_heads": 8, "head_dim": None,
                "sliding_window": 4096},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": None,
              "sliding_window": 4096},
    "qwen3": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128,
              "sliding_window": 4096},
}


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
    o_bias: bool                # bias on o_proj (Llama's and Qwen3's attention_bias also cover it)
    mlp_bias: bool
    qk_norm: bool               # Qwen3: RMSNorm over each head of q and k before RoPE
    sliding_window: Optional[int]  # window of the sliding layers; None when no layer slides
    bos_token_id: Optional[int]
    eos_token_ids: Tuple[int, ...]
    # Indices of the layers that use `sliding_window`; None means every layer (Mistral).
    # Qwen2/Qwen3 slide only some layers (their `layer_types`).
    sliding_layers: Optional[Tuple[int, ...]] = None

    def window_of(self, layer: int) -> Optional[int]:
        """The sliding window of `layer` (a key is visible while q_pos - k_pos < window), or None."""
        if self.sliding_window is None:
            return None
        if self.sliding_layers is None or layer in self.sliding_layers:
            return self.sliding_window
        return None


def _require_int(cfg: dict, key: str, path: str, default=None) -> int:
    value = cfg.get(key)
    if value is None:
        value = default
    if value is None:
        raise CheckpointError(f"{path}: missing required field '{key}'")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{path}: field '{key}' must be a positive integer, got {value!r}")
    return value


def _number(scaling: dict, key: str, rope_type: str, path: str, default=None) -> float:
    value = scaling.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{path}: RoPE type {rope_type!r} needs a numeric '{key}' in "
                              f"rope_parameters/rope_scaling, got {value!r}")
    return value


def _rope_settings(cfg: dict, path: str) -> Tuple[float, Optional[RopeScaling]]:
    # HF 5.x: a (legacy) `rope_scaling` dict takes precedence over `rope_parameters`; values in
    # the dict win over the top-level `rope_theta`.
    legacy = cfg.get("rope_scaling")
    params = legacy if isinstance(legacy, dict) and legacy else cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{path}: 'rope_parameters'/'rope_scaling' must be an object, "
                              f"got {params!r}")
    scaling = dict(params or {})
    theta = _number(scaling, "rope_theta", "default", path, cfg.get("rope_theta", 10000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModel(f"{path}: RoPE type {rope_type!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    partial = scaling.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise UnsupportedModel(f"{path}: partial_rotary_factor {partial!r} is not supported "
                               f"(only full rotary embeddings, 1.0)")
    if rope_type == "default":
        return float(theta), None
    factor = float(_number(scaling, "factor", rope_type, path))
    if rope_type == "linear":
        return float(theta), RopeScaling("linear", factor)
    original = scaling.get("original_max_position_embeddings",
                           cfg.get("max_position_embeddings"))
    return float(theta), RopeScaling(
        "llama3", factor,
        low_freq_factor=float(_number(scaling, "low_freq_factor", rope_type, path)),
        high_freq_factor=float(_number(scaling, "high_freq_factor", rope_type, path)),
        original_max_position_embeddings=int(_number(
            {"original_max_position_embeddings": original},
            "original_max_position_embeddings", rope_type, path)))


def _eos_ids(value) -> Tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _sliding(cfg: dict, model_type: str, num_layers: int, path: str):
    """(window, sliding layer indices or None for all) following each HF family's rules."""
    defaults = _DEFAULTS[model_type]
    if model_type == "llama":
        return None, None
    window = cfg.get("sliding_window", defaults["sliding_window"])
    if model_type in ("qwen2", "qwen3"):
        # Qwen configs carry a window that is used only when switched on, and then only on the
        # layers `layer_types` marks (by default those from `max_window_layers` on).
        if not cfg.get("use_sliding_window", False):
            return None, None
        if window is None:
            return None, None
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            first = cfg.get("max_window_layers", 28)
            layer_types = ["sliding_attention" if i >= first else "full_attention"
                           for i in range(num_layers)]
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise CheckpointError(f"{path}: 'layer_types' must list one entry per layer "
                                  f"({num_layers}), got {layer_types!r}")
        layers = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    else:
        layers = None  # Mistral slides every layer
    if window is None:
        return None, None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise CheckpointError(f"{path}: 'sliding_window' must be a positive integer or null, "
                              f"got {window!r}")
    return window, layers


def parse_model_config(cfg: dict, path: str = "config.json") -> ModelConfig:
    """Validate and normalise a config dict; errors name the file and the field."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(f"{path}: model_type {model_type!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    defaults = _DEFAULTS[model_type]
    act = cfg.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedModel(f"{path}: hidden_act {act!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ACTIVATIONS)})")
    hidden = _require_int(cfg, "hidden_size", path)
    heads = _require_int(cfg, "num_attention_heads", path)
    # An explicit null means "as many as the query heads"; a missing field takes the class default.
    kv_default = defaults["num_key_value_heads"] if "num_key_value_heads" not in cfg else None
    kv_heads = _require_int(cfg, "num_key_value_heads", path, default=kv_default or heads)
    if heads % kv_heads:
        raise CheckpointError(f"{path}: num_attention_heads ({heads}) is not a multiple of "
                              f"num_key_value_heads ({kv_heads})")
    head_dim = cfg.get("head_dim") or defaults["head_dim"] or hidden // heads
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise CheckpointError(f"{path}: head_dim must be a positive even integer (RoPE rotates "
                              f"pairs), got {head_dim!r}")
    num_layers = _require_int(cfg, "num_hidden_layers", path)
    theta, scaling = _rope_settings(cfg, path)
    window, sliding_layers = _sliding(cfg, model_type, num_layers, path)
    attention_bias = bool(cfg.get("attention_bias", False))
    # Which projections carry a bias, as each HF modeling file builds them.
    qkv_bias = {"llama": attention_bias, "mistral": False, "qwen2": True,
                "qwen3": attention_bias}[model_type]
    o_bias = {"llama": attention_bias, "mistral": False, "qwen2": False,
              "qwen3": attention_bias}[model_type]
    mlp_bias = bool(cfg.get("mlp_bias", False)) if model_type == "llama" else False
    return ModelConfig(
        model_type=model_type,
        vocab_size=_require_int(cfg, "vocab_size", path),
        hidden_size=hidden,
        intermediate_size=_require_int(cfg, "intermediate_size", path),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_require_int(cfg, "max_position_embeddings", path,
                                             default=defaults["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=model_type == "qwen3",
        sliding_window=window,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        sliding_layers=sliding_layers,
    )


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}): re-export the checkpoint "
                              f"or repair the file") from None


def load_model_config(checkpoint_dir: str) -> ModelConfig:
    """Read `<checkpoint_dir>/config.json`; a clear CheckpointError if missing or malformed.

    As HF `generate` does, an `eos_token_id` in generation_config.json takes precedence over
    the one in config.json.
    """
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"checkpoint folder {checkpoint_dir!r} does not exist: "
                              f"pass the folder holding config.json and *.safetensors")
    path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{checkpoint_dir!r} has no config.json: is it an HF checkpoint "
                              f"folder? (save the model with save_pretrained)")
    cfg = parse_model_config(_read_json(path), path)
    gen_path = os.path.join(checkpoint_dir, "generation_config.json")
    if os.path.isfile(gen_path):
        gen = _read_json(gen_path)
        if isinstance(gen, dict) and gen.get("eos_token_id") is not None:
            cfg = replace(cfg, eos_token_ids=_eos_ids(gen["eos_token_id"]))
    return cfg
