"""Load an HF checkpoint folder: config, weights (single or sharded safetensors), tokenizer.

Weights are returned by HF name (`model.layers.0.self_attn.q_proj.weight`, ...); shapes are
checked against the config so a truncated or mismatched file fails here with its name rather
than deep inside a matmul.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict

import torch

from .config import ModelConfig, load_model_config
from .errors import CheckpointError, TokenizerMismatch


def _safetensor_files(checkpoint_dir: str):
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index} is malformed ({exc}): it must be JSON with a "
                                  f"'weight_map' from tensor names to shard files") from None
        return [os.path.join(checkpoint_dir, f) for f in files]
    single = os.path.join(checkpoint_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    found = sorted(f for f in os.listdir(checkpoint_dir) if f.endswith(".safetensors"))
    if found:
        return [os.path.join(checkpoint_dir, f) for f in found]
    raise CheckpointError(f"{checkpoint_dir!r} has no *.safetensors weights "
                          f"(expected model.safetensors or a model.safetensors.index.json)")


def load_state_dict(checkpoint_dir: str) -> Dict[str, torch.Tensor]:
    """All tensors of the checkpoint by name, on the CPU, in their stored dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors: Dict[str, torch.Tensor] = {}
    for path in _safetensor_files(checkpoint_dir):
        if not os.path.isfile(path):
            raise CheckpointError(f"weight shard {path!r} named by model.safetensors.index.json "
                                  f"is missing: copy the complete checkpoint folder")
        try:
            tensors.update(load_file(path, device="cpu"))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc}): it is "
                                  f"truncated or corrupt; copy or export it again") from None
    return tensors


def expected_shapes(cfg: ModelConfig) -> Dict[str, tuple]:
    """The HF name and shape of every tensor the forward pass reads."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        })
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (cfg.intermediate_size,),
                           p + "mlp.up_proj.bias": (cfg.intermediate_size,),
                           p + "mlp.down_proj.bias": (h,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return shapes


def check_weights(cfg: ModelConfig, tensors: Dict[str, torch.Tensor], where: str) -> None:
    """Every tensor the forward pass reads is present with the shape config.json implies.

    Tensors the config does not use (a stray bias, rotary buffers) are ignored, as HF does.
    """
    for name, shape in expected_shapes(cfg).items():
        if name not in tensors:
            if name == "lm_head.weight":
                # HF would initialise a missing untied head at random; refuse instead.
                raise CheckpointError(
                    f"{where}: tensor 'lm_head.weight' is missing but config.json has "
                    f"tie_word_embeddings false: add the output head to the weights, or set "
                    f"tie_word_embeddings to true if the head shares the embedding")
            raise CheckpointError(f"{where}: tensor {name!r} is missing from the weights: the "
                                  f"safetensors files do not match config.json")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                                  f"config.json implies {shape}: the weights and config.json "
                                  f"disagree (fix the config or re-export the weights)")


@dataclass
class Checkpoint:
    path: str
    config: ModelConfig
    tensors: Dict[str, torch.Tensor]


def load_checkpoint(checkpoint_dir: str) -> Checkpoint:
    """Config + weights of an HF checkpoint folder, checked against each other.

    Raises CheckpointError (UnsupportedModel for an architecture we do not implement) naming
    the file and what to fix.
    """
    cfg = load_model_config(checkpoint_dir)
    tensors = load_state_dict(checkpoint_dir)
    check_weights(cfg, tensors, checkpoint_dir)
    return Checkpoint(checkpoint_dir, cfg, tensors)


def load_tokenizer(checkpoint_dir: str):
    """The checkpoint's `tokenizers.Tokenizer` (from tokenizer.json), or None if it has none."""
    path = os.path.join(checkpoint_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(f"{path} is not a readable tokenizer ({exc}): save the "
                              f"tokenizer again (tokenizer.save_pretrained)") from None


def check_same_vocabulary(target: ModelConfig, drafter: ModelConfig, target_tok=None,
                          drafter_tok=None, target_dir: str = "target",
                          drafter_dir: str = "drafter") -> None:
    """Speculation compares token ids, so both models must use the same vocabulary."""
    if target.vocab_size != drafter.vocab_size:
        raise TokenizerMismatch(
            f"target {target_dir!r} has vocab_size {target.vocab_size} but drafter {drafter_dir!r} "
            f"has {drafter.vocab_size}: the drafter must share the target's tokenizer")
    if target_tok is not None and drafter_tok is not None:
        if target_tok.get_vocab() != drafter_tok.get_vocab():
            raise TokenizerMismatch(
                f"the tokenizers of target {target_dir!r} and drafter {drafter_dir!r} differ: "
                f"the drafter must share the target's tokenizer")
