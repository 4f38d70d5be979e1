"""Transformations as data: small frozen records (`name` + params), serialisable and replayable.

A record only says *what* to change; `specpilot.ir.apply.apply` decides whether it may and does
it. Construction checks parameter types (a record with a string where an int belongs is
malformed, an IRError); whether a value makes sense for a given Program (an unknown layout, a
draft length out of range) is a reasoned refusal of `apply`, so that proposals from any source,
agents included, get an answer instead of a crash.

`may_change_output` declares whether applying the record can change the decoder's output
tokens. Every transformation here keeps the output identical except SetWeightFormat to a lossy
format (none exists yet: bf16/fp32 are the checkpoint's own values and lossless12 restores every
bit). Token forcing remains the final judge either way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Dict, Type, Union

from .errors import IRError
from .formats import WEIGHT_FORMATS
from .formats import may_change_output as _format_may_change_output
from .json_fields import (expect_bool, expect_int, expect_object, expect_scalar, expect_str,
                          expect_topology)
from .prune import PRUNES, prune_from_json
from .topology import TOPOLOGIES, TOPOLOGY_NAMES

TRANSFORMATIONS: Dict[str, Type["Transformation"]] = {}

def _expect_prune_or_null(value, path):
    return None if value is None else prune_from_json(value, path)


_READERS = {"int": expect_int, "str": expect_str, "bool": expect_bool,
            "scalar": expect_scalar, "topology": expect_topology, "prune": _expect_prune_or_null}
# Param kinds whose values are IR objects (written with their `to_json`).
_OBJECT_KINDS = {"topology": (TOPOLOGIES, TOPOLOGY_NAMES),
                 "prune": (PRUNES + (type(None),), "LayerSkipPrune, LowPrecisionPrune or None")}


def register(cls):
    """Add a Transformation class to the registry under its `name`."""
    if cls.name in TRANSFORMATIONS:
        raise ValueError(f"transformation {cls.name} registered twice")
    TRANSFORMATIONS[cls.name] = cls
    return cls


class Transformation:
    """Base of the records. Subclasses are frozen dataclasses whose fields are the params;
    `PARAMS` maps each field to its JSON kind ("int", "str", "bool", "scalar" (an int, str or
    bool), "topology" or "prune")."""
    name: ClassVar[str]
    PARAMS: ClassVar[Dict[str, str]]

    def __post_init__(self):
        for field_name, kind in self.PARAMS.items():
            value = getattr(self, field_name)
            if kind in _OBJECT_KINDS:
                types, names = _OBJECT_KINDS[kind]
                if not isinstance(value, types):
                    raise IRError(f"{self.name}.{field_name}: expected {names}, got {value!r}")
                continue
            object.__setattr__(self, field_name,
                               _READERS[kind](value, f"{self.name}.{field_name}"))

    @property
    def may_change_output(self) -> bool:
        return False

    def params(self) -> Dict[str, Any]:
        """The params as a JSON-ready dict."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_json() if hasattr(value, "to_json") else value
        return out

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            text = json.dumps(value) if isinstance(value, str) else str(value)
            parts.append(f"{f.name}={text}")
        return f"{self.name}({', '.join(parts)})"


@register
@dataclass(frozen=True)
class SetTopology(Transformation):
    """Lay the draft out as `topology`; the verify mask and KV commit follow it (any tree: tree
    mask and compaction; chain: causal mask and in-place commit)."""
    topology: object
    name: ClassVar[str] = "SetTopology"
    PARAMS: ClassVar[Dict[str, str]] = {"topology": "topology"}


@register
@dataclass(frozen=True)
class SetDrafter(Transformation):
    """`model` (the drafter model proposes, the target verifies) or `none` (no speculation: the
    decoder is greedy AR of the target; the draft topology and the drafter model are kept, so
    SetDrafter("model") restores the speculative decoder)."""
    drafter: str
    name: ClassVar[str] = "SetDrafter"
    PARAMS: ClassVar[Dict[str, str]] = {"drafter": "str"}


@register
@dataclass(frozen=True)
class SetDraftLength(Transformation):
    """Change the length of a chain draft (a tree's depth is part of its shape: SetTopology)."""
    k: int
    name: ClassVar[str] = "SetDraftLength"
    PARAMS: ClassVar[Dict[str, str]] = {"k": "int"}


@register
@dataclass(frozen=True)
class SetWeightFormat(Transformation):
    """Store the linears matched by `scope` in format `fmt`.

    scope is `<target|drafter>.<glob>`; the glob is matched (fnmatch, case-sensitive) against each
    linear's name and against that name without its `layers.N.` prefix, so `target.mlp.*` means
    every MLP linear of the target and `drafter.layers.0.*` every linear of its first layer.
    """
    scope: str
    fmt: str
    name: ClassVar[str] = "SetWeightFormat"
    PARAMS: ClassVar[Dict[str, str]] = {"scope": "str", "fmt": "str"}

    @property
    def may_change_output(self) -> bool:
        # An unknown format is refused by apply; until then assume the worst.
        return self.fmt not in WEIGHT_FORMATS or _format_may_change_output(self.fmt)


@register
@dataclass(frozen=True)
class SetBatchLayout(Transformation):
    layout: str
    name: ClassVar[str] = "SetBatchLayout"
    PARAMS: ClassVar[Dict[str, str]] = {"layout": "str"}


@register
@dataclass(frozen=True)
class SetDraftLengthPolicy(Transformation):
    """`fixed` (token_budget 0: none) or `per_request_adaptive`: each request's chain length
    follows its own recent acceptance, at most `token_budget` tokens verified per step."""
    policy: str
    token_budget: int
    name: ClassVar[str] = "SetDraftLengthPolicy"
    PARAMS: ClassVar[Dict[str, str]] = {"policy": "str", "token_budget": "int"}


@register
@dataclass(frozen=True)
class SetLengthEstimator(Transformation):
    """`geometric` or `per_depth`: what the adaptive draft length's batch rule expects a chain
    of L drafts to commit (per_request_adaptive only)."""
    estimator: str
    name: ClassVar[str] = "SetLengthEstimator"
    PARAMS: ClassVar[Dict[str, str]] = {"estimator": "str"}


@register
@dataclass(frozen=True)
class SetLengthDrain(Transformation):
    """`makespan` or `throughput`: what the adaptive draft length's batch rule optimises once
    a continuous refill's queue is empty (per_request_adaptive with continuous refill only)."""
    drain: str
    name: ClassVar[str] = "SetLengthDrain"
    PARAMS: ClassVar[Dict[str, str]] = {"drain": "str"}


@register
@dataclass(frozen=True)
class SetRefill(Transformation):
    """`drain` or `continuous`: whether a finished request's slot waits for the whole batch or
    takes the next queued request at once."""
    refill: str
    name: ClassVar[str] = "SetRefill"
    PARAMS: ClassVar[Dict[str, str]] = {"refill": "str"}


@register
@dataclass(frozen=True)
class SetVerifyPrune(Transformation):
    """Two-level verification: prune the drafted tree with a cheaper path through the target
    (`LayerSkipPrune` / `LowPrecisionPrune`) before the full target verifies the survivors;
    None verifies with the target alone."""
    prune: object
    name: ClassVar[str] = "SetVerifyPrune"
    PARAMS: ClassVar[Dict[str, str]] = {"prune": "prune"}


@register
@dataclass(frozen=True)
class SetMaxBatchSize(Transformation):
    max_batch_size: int
    name: ClassVar[str] = "SetMaxBatchSize"
    PARAMS: ClassVar[Dict[str, str]] = {"max_batch_size": "int"}


@register
@dataclass(frozen=True)
class SetBackend(Transformation):
    backend: str
    name: ClassVar[str] = "SetBackend"
    PARAMS: ClassVar[Dict[str, str]] = {"backend": "str"}


@register
@dataclass(frozen=True)
class SetFastPath(Transformation):
    """The torch backend's fast path on a CUDA GPU: `ops` (small ops compiled one at a time) or
    `layers` (each decoder layer compiled whole, fewer kernels per forward)."""
    fast_path: str
    name: ClassVar[str] = "SetFastPath"
    PARAMS: ClassVar[Dict[str, str]] = {"fast_path": "str"}


@register
@dataclass(frozen=True)
class SetDrafterKernels(Transformation):
    """How the drafter's forward runs: `model` (as its model runs: its backend and fast path)
    or `fused` (the fused layer kernels of runtime/fused_forward.py, five launches a layer:
    pays where a small drafter's step is bound by its kernel count). The drafter only proposes
    and the target verifies every token, so the output is unchanged either way."""
    kernels: str
    name: ClassVar[str] = "SetDrafterKernels"
    PARAMS: ClassVar[Dict[str, str]] = {"kernels": "str"}


@register
@dataclass(frozen=True)
class SetAttentionKernels(Transformation):
    """How the torch backend's attention runs, in both models: `model` (as the backend runs it:
    grouped SDPA on the CUDA fast path) or `generated` (the codegen attention kernel, bounded by
    each request's last visible slot: runtime/generated_attention.py). The target's numerics
    change by rounding order only (float32 softmax either way), which token forcing tolerates as
    near-ties and reports."""
    kernels: str
    name: ClassVar[str] = "SetAttentionKernels"
    PARAMS: ClassVar[Dict[str, str]] = {"kernels": "str"}


@register
@dataclass(frozen=True)
class SetAcceptKernels(Transformation):
    """How a graphed chain round ends: `ops` (the acceptance, the commit, who stops and the
    round's log as torch ops, some forty kernels) or `fused` (one generated kernel, the
    chain_commit family; with adaptive lengths the length's update in one more, the
    length_policy family). The commit is integers only and a length only sets the speed, so
    the output is the same either way."""
    kernels: str
    name: ClassVar[str] = "SetAcceptKernels"
    PARAMS: ClassVar[Dict[str, str]] = {"kernels": "str"}


@register
@dataclass(frozen=True)
class CaptureGraphs(Transformation):
    """Capture the fixed-shape decode steps as CUDA graphs (on) or launch kernels eagerly (off)."""
    on: bool
    name: ClassVar[str] = "CaptureGraphs"
    PARAMS: ClassVar[Dict[str, str]] = {"on": "bool"}


@register
@dataclass(frozen=True)
class TuneKernel(Transformation):
    """Set one kernel parameter of one compute node: `kernels.overrides[node][param] = value`.

    `node` is a lowered node name (`target.layers.3.mlp.down_proj`) or one without its
    `layers.N.` part (`target.mlp.down_proj`), which sets the parameter for every layer alike;
    `param` a kernel parameter such as BLOCK_N, or `family` to run another kernel family;
    `value` an int, str (an identifier) or bool. Which nodes and parameters exist, and which
    values a kernel family takes, is the lowering's to say (an unknown one fails lowering), so
    apply checks only the shape of the record. Tiles reorder the float32 accumulation, never the
    arithmetic, so outputs stay those of the same kernels (token forcing judges near ties).
    """
    node: str
    param: str
    value: Union[int, str, bool]
    name: ClassVar[str] = "TuneKernel"
    PARAMS: ClassVar[Dict[str, str]] = {"node": "str", "param": "str", "value": "scalar"}


def transformation_to_obj(t: Transformation) -> Dict[str, Any]:
    """`{"name": ..., "params": {...}}`, ready for json.dumps."""
    return {"name": t.name, "params": t.params()}


def transformation_from_obj(obj: Any, path: str = "transformation") -> Transformation:
    """Decode a `{"name", "params"}` object; unknown names and bad params are IRErrors naming
    `path`."""
    obj = expect_object(obj, path, ("name", "params"))
    name = expect_str(obj["name"], f"{path}.name")
    cls = TRANSFORMATIONS.get(name)
    if cls is None:
        raise IRError(f"{path}.name: unknown transformation {name!r} "
                      f"(known: {', '.join(sorted(TRANSFORMATIONS))})")
    params = expect_object(obj["params"], f"{path}.params", cls.PARAMS)
    values = {key: _READERS[kind](params[key], f"{path}.params.{key}")
              for key, kind in cls.PARAMS.items()}
    return cls(**values)


def transformation_to_json(t: Transformation) -> str:
    """Canonical JSON text of one record (sorted keys, compact, trailing newline)."""
    return json.dumps(transformation_to_obj(t), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False) + "\n"


def transformation_from_json(text: Union[str, bytes]) -> Transformation:
    """Parse a record from JSON text; malformed input is an IRError with the reason."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IRError(f"transformation: not valid JSON: {exc}") from None
    return transformation_from_obj(obj)
