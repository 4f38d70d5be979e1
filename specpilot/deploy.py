"""Build a Deployment from two HF checkpoint folders: read their configs into ModelSpecs and check
that the pair can speculate together (one vocabulary). `model_spec_from_config` also serves
model shapes given as a config alone (the shape presets)."""
from __future__ import annotations

import os

from specpilot.ir import DTYPES, ROLES, Deployment, ModelSpec, dense_weight_formats
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.config import load_model_config
from specpilot.runtime.errors import TokenizerMismatch, UnsupportedModel


def model_spec_from_checkpoint(path: str, role: str, dtype: str = "bfloat16") -> ModelSpec:
    """The ModelSpec of the checkpoint folder `path` as `role`, computing in `dtype`, with every
    linear stored dense in that dtype. Raises a SpecPilotError naming the folder when the config
    is missing, malformed or of an architecture the IR cannot describe."""
    _check_role_dtype(role, dtype)      # before reading the folder
    return model_spec_from_config(load_model_config(path), role, dtype, os.path.abspath(path))


def _check_role_dtype(role: str, dtype: str) -> None:
    if role not in ROLES:
        raise SpecPilotError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if dtype not in DTYPES:
        raise SpecPilotError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def model_spec_from_config(cfg, role: str, dtype: str, checkpoint: str) -> ModelSpec:
    """The ModelSpec of a runtime ModelConfig `cfg` (a checkpoint's, or a shape preset's with
    `checkpoint` naming it) as `role`, every linear dense in `dtype`."""
    _check_role_dtype(role, dtype)
    # Biases on o_proj or the MLP exist in the config format but in no released model of these
    # families; the IR has no attribute for them, so refuse rather than describe them wrongly.
    if cfg.o_bias or cfg.mlp_bias:
        which = " and ".join(n for n, on in (("o_proj", cfg.o_bias), ("MLP", cfg.mlp_bias)) if on)
        raise UnsupportedModel(f"{checkpoint}: {which} biases are not supported")
    return ModelSpec(
        role=role,
        family=cfg.model_type,
        checkpoint=checkpoint,
        dtype=dtype,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        qkv_bias=cfg.attention_bias,
        qk_norm=cfg.qk_norm,
        tie_embeddings=cfg.tie_word_embeddings,
        layer_kinds=("attention",) * cfg.num_layers,
        weight_formats=dense_weight_formats(cfg.num_layers, dtype),
    )


def build_deployment(target_dir: str, drafter_dir: str, gpu: str = "cpu", dtype: str = "bfloat16",
                     workload: str = "humaneval") -> Deployment:
    """A Deployment of the target and drafter checkpoints on `gpu` ("cpu" or a GPU name).

    Raises TokenizerMismatch (a SpecPilotError) naming both vocabulary sizes when the two models
    cannot share a tokenizer."""
    if not isinstance(gpu, str) or not gpu:
        raise SpecPilotError(f"gpu must be a non-empty name (or 'cpu'), got {gpu!r}")
    target = model_spec_from_checkpoint(target_dir, "target", dtype)
    drafter = model_spec_from_checkpoint(drafter_dir, "drafter", dtype)
    if target.vocab_size != drafter.vocab_size:
        raise TokenizerMismatch(
            f"target {target_dir!r} has a vocabulary of {target.vocab_size} tokens but drafter "
            f"{drafter_dir!r} has {drafter.vocab_size}; speculation needs one shared tokenizer")
    return Deployment(target=target, drafter=drafter, gpu=gpu, workload=workload)


def detect_gpu() -> str:
    """The name of CUDA device 0, or "cpu" when there is none."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"
