"""`ModelSpec`: the architecture, dtype and per-linear weight formats of one model of a Program.

Linear layers are named as in the checkpoint without the `model.` prefix and `.weight` suffix:
`layers.{i}.self_attn.{q,k,v,o}_proj`, `layers.{i}.mlp.{gate,up,down}_proj` and `lm_head`.
`lm_head` is always listed, also with tied embeddings: the head's matrix-vector product runs
every step whichever tensor it reads. With `tie_embeddings` its format is the format of the one
shared matrix, and the embedding lookup reads that matrix in that format.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Dict, Mapping, Optional, Tuple, Union

from .formats import DENSE_FORMAT_FOR_DTYPE

ROLES = ("target", "drafter")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
LAYER_KINDS = ("attention",)

ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")

def canonical_pairs(value: Union[Mapping, Tuple, list]) -> Tuple:
    """A mapping or a sequence of (key, value) pairs as a tuple of pairs sorted by key.

    Duplicate keys are kept (not merged) so that `verify` can report them.
    """
    items = value.items() if isinstance(value, Mapping) else value
    pairs = [tuple(p) if isinstance(p, (tuple, list)) else p for p in items]

    def key(p):  # a malformed entry sorts last instead of failing here; verify names it
        if isinstance(p, tuple) and p and isinstance(p[0], str):
            return (0, p[0])
        return (1, repr(p))
    return tuple(sorted(pairs, key=key))


def layer_linear_names(layer: int) -> Tuple[str, ...]:
    return (tuple(f"layers.{layer}.self_attn.{n}" for n in ATTENTION_LINEARS)
            + tuple(f"layers.{layer}.mlp.{n}" for n in MLP_LINEARS))


@lru_cache(maxsize=128)
def linear_names(num_layers: int) -> Tuple[str, ...]:
    """Every linear of a model with `num_layers` layers, sorted (the weight_formats key order)."""
    names = [n for i in range(num_layers) for n in layer_linear_names(i)] + ["lm_head"]
    return tuple(sorted(names))


def dense_weight_formats(num_layers: int, dtype: str) -> Tuple[Tuple[str, str], ...]:
    """The stock format map: every linear stored dense in the compute dtype."""
    fmt = DENSE_FORMAT_FOR_DTYPE[dtype]
    return tuple((name, fmt) for name in linear_names(num_layers))


@dataclass(frozen=True)
class ModelSpec:
    """One model of the pair. Tuples of pairs are kept sorted by key so that equal specs compare
    equal whatever order they were built in; a dict is accepted and converted."""
    role: str
    family: str
    checkpoint: str
    dtype: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool
    layer_kinds: Tuple[str, ...]
    weight_formats: Tuple[Tuple[str, str], ...]
    # Measured fraction of each linear's weights that lossless12 cannot code, in whole parts per
    # million rounded down; a linear without an entry has not been measured.
    lossless12_escape_ppm: Tuple[Tuple[str, int], ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        object.__setattr__(self, "weight_formats", canonical_pairs(self.weight_formats))
        object.__setattr__(self, "lossless12_escape_ppm",
                           canonical_pairs(self.lossless12_escape_ppm))

    @property
    def linears(self) -> Tuple[str, ...]:
        """Every linear of the model, sorted."""
        return linear_names(self.num_layers)

    # Lookup tables built once per (immutable) spec; cached_property writes the instance dict
    # directly, which a frozen dataclass allows, and they take no part in equality or hashing.
    @cached_property
    def _format_map(self) -> Dict[str, str]:
        return dict(self.weight_formats)

    @cached_property
    def _escape_map(self) -> Dict[str, int]:
        return dict(self.lossless12_escape_ppm)

    def formats(self) -> Dict[str, str]:
        """The weight formats as a fresh {linear: format} dict."""
        return dict(self._format_map)

    def format_of(self, linear: str) -> str:
        """The format of `linear`; KeyError when the spec lists none."""
        return self._format_map[linear]

    def escape_ppm(self, linear: str) -> Optional[int]:
        """The measured lossless12 escape rate of `linear`, None if it was never measured."""
        return self._escape_map.get(linear)

    def with_formats(self, updates: Mapping[str, str]) -> "ModelSpec":
        merged = dict(self.weight_formats)
        merged.update(updates)
        return replace(self, weight_formats=tuple(merged.items()))

    def with_escape_rates(self, rates: Mapping[str, int]) -> "ModelSpec":
        """A copy with measured lossless12 escape rates (ppm) recorded for the given linears."""
        merged = dict(self.lossless12_escape_ppm)
        merged.update(rates)
        return replace(self, lossless12_escape_ppm=tuple(merged.items()))

    def linear_shape(self, linear: str) -> Tuple[int, int]:
        """(out_features, in_features) of a linear, as stored in the checkpoint."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        h, f = self.hidden_size, self.intermediate_size
        if linear == "lm_head":
            return (self.vocab_size, h)
        short = linear.rsplit(".", 1)[-1]
        shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
                  "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}
        if linear not in self.linears or short not in shapes:
            raise KeyError(linear)
        return shapes[short]
