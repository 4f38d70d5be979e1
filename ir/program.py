"""The Program: an immutable description of one speculative decoder for one Deployment.

Every part is a frozen dataclass; a new Program is made with `dataclasses.replace`, never by
mutation. Field values are not checked on construction (so that an ill-formed Program can be
built, inspected and reported); `verify(program)` is the well-formedness check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple, Union

from .model_spec import ModelSpec, canonical_pairs
from .prune import Prune
from .topology import Topology

SCHEMA_VERSION = 1

# "model": the drafter model proposes tokens for the target to verify. "none": no speculation,
# the decoder is greedy AR of the target alone (where speculation does not pay, e.g. large
# batches); the drafter stays in `models` so that SetDrafter("model") can switch back.
DRAFTERS = ("model", "none")
MASKS = ("causal", "tree")
ACCEPTANCE_RULES = ("greedy",)
KV_COMMITS = ("in_place", "compact")
BATCH_LAYOUTS = ("padded", "ragged")
DRAFT_LENGTH_POLICIES = ("fixed", "per_request_adaptive")
REFILL_POLICIES = ("drain", "continuous")
# What the graphed batch-length rule expects a chain of L to commit, for per_request_adaptive:
# one acceptance per request, or one per request and depth (runtime/depth_acceptance.py).
LENGTH_ESTIMATORS = ("geometric", "per_depth")
LENGTH_DRAINS = ("makespan", "throughput")
BACKENDS = ("torch", "generated")
# How the torch backend fuses its small ops on a CUDA GPU (runtime/fast_ops.py): "ops" compiles
# RMSNorm, RoPE and SwiGLU one op at a time; "layers" compiles each decoder layer whole, so that
# Inductor fuses across ops (fewer kernels per forward; it compiles for seconds on first use).
FAST_PATHS = ("ops", "layers")
# How the drafter's forward runs: "model" as its model runs (its backend and fast path); "fused"
# in the fused layer kernels of runtime/fused_forward.py (five launches a layer), which pays where
# a small drafter's step is bound by its kernel count.
DRAFTER_KERNELS = ("model", "fused")
# How the torch backend's attention runs (both models; a fused drafter has its own): "model" as
# the backend runs it (one grouped SDPA call on the CUDA fast path, the reference op otherwise);
# "generated" the codegen attention kernel, which walks each request's cache only up to its last
# visible slot and reads a tree's mask as given (runtime/generated_attention.py). Not with the
# "layers" fast path: its compiled blocks trace their attention.
ATTENTION_KERNELS = ("model", "generated")
# How a graphed chain round ends (acceptance, the commit, who stops, the round's log): "ops" as
# torch ops (some forty small kernels), "fused" in one generated kernel (the chain_commit family,
# runtime/graphed_chain.py), and with adaptive lengths the length's update in one more (the
# length_policy family) rather than seven compiled ones. Chains only: trees keep their own
# walk.
ACCEPT_KERNELS = ("ops", "fused")

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
    """How tokens are proposed: by a drafter model (`drafter` "model"), laid out as `topology`;
    or not at all (`drafter` "none": greedy AR of the target, `topology` kept but unused)."""
    drafter: str
    topology: Topology

    @property
    def speculates(self) -> bool:
        """Whether the decoder drafts at all (False: plain greedy AR of the target)."""
        return self.drafter != "none"

    def describe(self) -> str:
        """The draft in a few words for reports: the topology, or that there is none."""
        return str(self.topology) if self.speculates else "no speculation (greedy AR)"


@dataclass(frozen=True)
class VerifySpec:
    """How the target checks a proposal: attention mask over the drafted tokens, acceptance rule,
    and optionally a cheaper verifier that prunes the drafted tree first (two-level
    verification, see ir/prune.py; None verifies the whole tree with the target alone)."""
    mask: str
    acceptance: str
    prune: Optional[Prune] = None


@dataclass(frozen=True)
class CommitSpec:
    """How accepted tokens enter the KV cache: `in_place` keeps the accepted prefix where it was
    written (enough for a chain); `compact` copies the accepted path of a tree into place."""
    kv: str


@dataclass(frozen=True)
class BatchSpec:
    """How requests share a decode step.

    layout: `padded` (every request's verify tokens padded to the longest) or `ragged` (packed
        without padding, the kernels take per-request offsets).
    draft_length_policy: `fixed` (every request drafts the topology's chain length) or
        `per_request_adaptive` (each request's chain length follows its own recent acceptance,
        the batch's verified tokens per step capped at `token_budget`; chains only).
    token_budget: tokens (roots + drafts) verified per step over the whole batch, for
        `per_request_adaptive`; None otherwise.
    refill: `drain` (a batch runs until all its requests finish, then the next batch starts) or
        `continuous` (a finished request's slot takes the next queued request at once, whose
        prefill shares a step with the others' decoding).
    length_estimator: what the graphed batch-length rule of `per_request_adaptive` expects a
        chain of L drafts to commit: `geometric` (one acceptance probability per request, each
        draft an independent trial) or `per_depth` (one per request and draft depth, for
        drafts that agree in runs); `geometric` for every other policy. Only the graphed
        runtime's rule reads it; the eager loop's per-request lengths keep one alpha.
    length_drain: what that rule optimises once a `continuous` refill's queue is empty:
        `makespan` (the batch drains like a padded one, its slowest request deciding) or
        `throughput` (the time per token, as while refilling); `makespan` for every other
        policy or refill.
    """
    layout: str
    max_batch_size: int
    draft_length_policy: str
    token_budget: Optional[int] = None
    refill: str = "drain"
    length_estimator: str = "geometric"
    length_drain: str = "makespan"


def _canonical_overrides(value) -> Tuple:
    outer = canonical_pairs(value)
    return tuple((p[0], canonical_pairs(p[1])) if isinstance(p, tuple) and len(p) == 2
                 and isinstance(p[1], (Mapping, tuple, list)) else p for p in outer)


@dataclass(frozen=True)
class KernelsSpec:
    """Kernel backend, CUDA-graph capture, per-node kernel parameter overrides
    (`((node, ((param, value), ...)), ...)`, both levels sorted; a nested dict is accepted),
    the torch backend's fast path on a CUDA GPU (`fast_path`, one of FAST_PATHS), and how the
    drafter runs (`drafter_kernels`, one of DRAFTER_KERNELS), and how the torch backend's
    attention runs (`attention_kernels`, one of ATTENTION_KERNELS), and how a graphed chain
    round ends (`accept_kernels`, one of ACCEPT_KERNELS)."""
    backend: str
    capture_graphs: bool
    overrides: Tuple[Tuple[str, Tuple[Tuple[str, OverrideValue], ...]], ...] = field(default=())
    fast_path: str = "ops"
    drafter_kernels: str = "model"
    attention_kernels: str = "model"
    accept_kernels: str = "ops"

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
