"""The Program: an immutable description of one speculative decoder for one Deployment.

Every part is a frozen dataclass; a new Program is made with `dataclasses.replace`, never by
mutation. Field values are not checked on construction (so that an ill-formed Program can be
built, inspected and reported); `verify(program)` is the well-formedness check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Tuple, Union

from .model_spec import ModelSpec, canonical_pairs
from .topology import Chain, Tree

SCHEMA_VERSION = 1

DRAFTERS = ("model",)
MASKS = ("causal", "tree")
ACCEPTANCE_RULES = ("greedy",)
KV_COMMITS = ("in_place", "compact")
BATCH_LAYOUTS = ("padded", "ragged")
DRAFT_LENGTH_POLICIES = ("fixed",)
BACKENDS = ("torch", "generated")

OverrideValue = Union[int, str, bool]


@dataclass(frozen=True)
class Deployment:
    """What a decoder is compiled for: the model pair, the GPU (or "cpu") and the workload name."""
    target: ModelSpec
    drafter: ModelSpec
    gpu: str
    workload: str


@dataclass(frozen=True)
class Models:
    target: ModelSpec
    drafter: ModelSpec


@dataclass(frozen=True)
class DraftSpec:
    """How tokens are proposed: by a drafter model, laid out as `topology`."""
    drafter: str
    topology: Union[Chain, Tree]


@dataclass(frozen=True)
class VerifySpec:
    """How the target checks a proposal: attention mask over the drafted tokens, acceptance rule."""
    mask: str
    acceptance: str


@dataclass(frozen=True)
class CommitSpec:
    """How accepted tokens enter the KV cache: `in_place` keeps the accepted prefix where it was
    written (enough for a chain); `compact` copies the accepted path of a tree into place."""
    kv: str


@dataclass(frozen=True)
class BatchSpec:
    layout: str
    max_batch_size: int
    draft_length_policy: str


def _canonical_overrides(value) -> Tuple:
    outer = canonical_pairs(value)
    return tuple((p[0], canonical_pairs(p[1])) if isinstance(p, tuple) and len(p) == 2
                 and isinstance(p[1], (Mapping, tuple, list)) else p for p in outer)


@dataclass(frozen=True)
class KernelsSpec:
    """Kernel backend, CUDA-graph capture, and per-node kernel parameter overrides
    (`((node, ((param, value), ...)), ...)`, both levels sorted; a nested dict is accepted)."""
    backend: str
    capture_graphs: bool
    overrides: Tuple[Tuple[str, Tuple[Tuple[str, OverrideValue], ...]], ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "overrides", _canonical_overrides(self.overrides))


@dataclass(frozen=True)
class Program:
    """One speculative decoder. `history` lists the Transformations that produced it from the
    stock Program; it is provenance, not part of what the decoder does (nor of its id)."""
    gpu: str
    models: Models
    draft: DraftSpec
    verify: VerifySpec
    commit: CommitSpec
    batch: BatchSpec
    kernels: KernelsSpec
    history: Tuple = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        object.__setattr__(self, "history", tuple(self.history))
