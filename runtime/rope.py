"""Rotary position embedding tables, computed exactly as HF transformers does (float32)."""
from __future__ import annotations

import math

import torch

from .config import ModelConfig
from .reference_ops import rope_cos_sin


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """inv_freq[D/2] in float32, with Llama-3.1 ('llama3') or linear scaling applied."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    if s.rope_type == "linear":
        return inv_freq / s.factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = s.original_max_position_embeddings
    low_wavelen = old_len / s.low_freq_factor
    high_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin of shape [*positions.shape, D] (halves duplicated, HF's rotate-half layout)."""
    return rope_cos_sin(positions, inv_freq.to(positions.device), dtype)
