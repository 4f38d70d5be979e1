"""KernelPlan: which kernel runs every compute node of a Program, and building those kernels.

A plan is a frozen value produced by `lower_program` (codegen/lower.py):

* `nodes`: one `PlanNode` per compute node, in execution order (target layers, target head,
  drafter layers, drafter head, then the speculative step), each naming its kernel by key;
* `kernels`: the distinct KernelSpecs, keyed by `<family>_<12 hex digits of the spec's hash>`,
  so the many layers that share a kernel share one entry.

Its canonical JSON (sorted keys, compact, one trailing newline) is what golden tests snapshot
and what an export ships next to the kernels. `build_plan` builds every distinct kernel once and
reports a kernel that fails to build as a `PlanBuildError` naming the nodes that needed it.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from specpilot.ir.canonical import canonical_json
from specpilot.ir.errors import SpecPilotError

from . import formats  # noqa: F401  (registers the weight formats' kernel families)
from .build import try_build_kernel
from .cache import KernelCache
from .errors import BuildError
from .kernel_spec import KernelSpec

PLAN_SCHEMA_VERSION = 1
PLAN_FILE = "plan.json"

AttrValue = Any  # int, str, bool


class PlanError(SpecPilotError):
    """A malformed plan (bad JSON, a node naming a kernel the plan lacks)."""


def kernel_key(spec: KernelSpec) -> str:
    """`<family>_<hash>`: a stable identifier of a spec, usable as a file and module name."""
    digest = hashlib.sha256(canonical_json(spec.as_dict()).encode("utf-8")).hexdigest()
    return f"{spec.family}_{digest[:12]}"


@dataclass(frozen=True)
class PlanNode:
    """One compute node: `name` (e.g. `target.layers.0.self_attn.attention`), the operation it
    performs (`op`), the key of its kernel, the checkpoint linears it reads (linear ops only)
    and shape attributes (sorted (name, value) pairs) that say what it computes."""
    name: str
    op: str
    kernel: str
    linears: Tuple[str, ...] = ()
    attrs: Tuple[Tuple[str, AttrValue], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "linears", tuple(self.linears))
        items = self.attrs.items() if isinstance(self.attrs, Mapping) else self.attrs
        object.__setattr__(self, "attrs", tuple(sorted((str(k), v) for k, v in items)))

    @property
    def role(self) -> str:
        """`target`, `drafter` or `step`: the first component of the name."""
        return self.name.split(".", 1)[0]

    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        return dict(self.attrs).get(name, default)

    def to_obj(self) -> Dict[str, Any]:
        return {"name": self.name, "op": self.op, "kernel": self.kernel,
                "linears": list(self.linears), "attrs": dict(self.attrs)}


@dataclass(frozen=True)
class KernelPlan:
    nodes: Tuple[PlanNode, ...]
    kernels: Tuple[Tuple[str, KernelSpec], ...]
    _by_name: Dict[str, PlanNode] = field(default=None, init=False, repr=False, compare=False)
    _by_key: Dict[str, KernelSpec] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "kernels", tuple(sorted(self.kernels)))
        by_key = dict(self.kernels)
        by_name: Dict[str, PlanNode] = {}
        for node in self.nodes:
            if node.name in by_name:
                raise PlanError(f"plan node {node.name} is listed twice")
            if node.kernel not in by_key:
                raise PlanError(f"plan node {node.name} names kernel {node.kernel}, which the plan lacks")
            by_name[node.name] = node
        for key, spec in self.kernels:
            if key != kernel_key(spec):
                raise PlanError(f"plan kernel {key} is not the key of its spec ({kernel_key(spec)})")
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_by_key", by_key)

    def node(self, name: str) -> PlanNode:
        try:
            return self._by_name[name]
        except KeyError:
            raise PlanError(f"the plan has no node {name!r}") from None

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    def spec(self, key: str) -> KernelSpec:
        """The KernelSpec of a kernel key."""
        try:
            return self._by_key[key]
        except KeyError:
            raise PlanError(f"the plan has no kernel {key!r}") from None

    def spec_of(self, node_name: str) -> KernelSpec:
        """The KernelSpec that runs node `node_name`."""
        return self.spec(self.node(node_name).kernel)

    def nodes_of(self, role: str) -> Tuple[PlanNode, ...]:
        return tuple(n for n in self.nodes if n.role == role)

    def nodes_using(self, key: str) -> Tuple[str, ...]:
        """Names of the nodes that run kernel `key`, in execution order."""
        return tuple(n.name for n in self.nodes if n.kernel == key)

    def to_obj(self) -> Dict[str, Any]:
        return {"schema_version": PLAN_SCHEMA_VERSION,
                "kernels": {key: spec.as_dict() for key, spec in self.kernels},
                "nodes": [n.to_obj() for n in self.nodes]}


def plan_to_json(plan: KernelPlan) -> str:
    """Canonical JSON of the plan (sorted keys, compact, trailing newline)."""
    return canonical_json(plan.to_obj())


def plan_from_json(text) -> KernelPlan:
    """Parse a plan written by `plan_to_json`; PlanError (or KernelSpecError) on bad input."""
    try:
        obj = json.loads(text)
        if obj.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise PlanError(f"unsupported plan schema_version {obj.get('schema_version')!r}")
        kernels = tuple((key, KernelSpec.from_dict(spec)) for key, spec in obj["kernels"].items())
        nodes = tuple(PlanNode(n["name"], n["op"], n["kernel"], tuple(n["linears"]),
                               tuple(n["attrs"].items())) for n in obj["nodes"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"not a kernel plan: {type(exc).__name__}: {exc}") from None
    return KernelPlan(nodes=nodes, kernels=kernels)


# ------------------------------------------------------------------------------------ diff

def diff_plans(a: KernelPlan, b: KernelPlan) -> List[str]:
    """One line per node whose kernel changed, appeared or disappeared, in b's node order
    (removed nodes last): `name: old spec → new spec`, with `absent` for a missing side."""
    lines = []
    for node in b.nodes:
        new = str(b.spec(node.kernel))
        old = str(a.spec_of(node.name)) if a.has_node(node.name) else "absent"
        if old != new:
            lines.append(f"{node.name}: {old} → {new}")
    for node in a.nodes:
        if not b.has_node(node.name):
            lines.append(f"{node.name}: {a.spec(node.kernel)} → absent")
    return lines


def format_plan_diff(a: KernelPlan, b: KernelPlan) -> str:
    lines = diff_plans(a, b)
    return "\n".join(lines) if lines else "no differences"


# ------------------------------------------------------------------------------------ build

class PlanBuildError(BuildError):
    """A plan kernel that failed to build; `nodes` are the plan nodes that needed it."""

    def __init__(self, key: str, nodes: Tuple[str, ...], error: BuildError):
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        super().__init__(f"kernel {key} ({error.what}) for node {shown}", error.stage, error.log)
        self.key = key
        self.nodes = nodes
        self.cause = error


@dataclass(frozen=True)
class BuiltPlan:
    """The built modules of a plan by kernel key, and a PlanBuildError per kernel that failed."""
    plan: KernelPlan
    modules: Mapping[str, Any]
    errors: Tuple[PlanBuildError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def module_of(self, node_name: str) -> Any:
        """The built module running node `node_name`; its PlanBuildError if it failed."""
        key = self.plan.node(node_name).kernel
        for error in self.errors:
            if error.key == key:
                raise error
        return self.modules[key]

    def raise_first_error(self) -> "BuiltPlan":
        if self.errors:
            raise self.errors[0]
        return self


def build_plan(plan: KernelPlan, cache: Optional[KernelCache] = None,
               template_dir: Optional[os.PathLike] = None,
               nodes: Optional[Tuple[str, ...]] = None) -> BuiltPlan:
    """Build each distinct kernel of `plan` once (only those of `nodes` when given).

    Never raises for a kernel that fails to build: the failure is recorded as a PlanBuildError
    naming every node that needed that kernel (and in `cache.failures`), and the other kernels
    are still built.
    """
    cache = cache if cache is not None else KernelCache()
    wanted = plan.nodes if nodes is None else tuple(plan.node(n) for n in nodes)
    modules: Dict[str, Any] = {}
    errors: List[PlanBuildError] = []
    for key in sorted({n.kernel for n in wanted}):
        outcome = try_build_kernel(plan.spec(key), cache, template_dir)
        if outcome.ok:
            modules[key] = outcome.module
        else:
            users = tuple(n.name for n in wanted if n.kernel == key)
            errors.append(PlanBuildError(key, users, outcome.error))
    return BuiltPlan(plan, modules, tuple(errors))
