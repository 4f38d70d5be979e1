"""KernelSpec: a kernel family plus its validated, canonical parameters.

A KernelSpec is a frozen value. Constructing one validates every parameter against the family's
schema (codegen/families.py) and fills defaults, so two specs that mean the same kernel compare
and hash equal, and nothing unvalidated can reach a template.

    spec = kernel_spec("linear", DTYPE="bf16", BLOCK_N=64, HAS_BIAS=True)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Tuple

from .errors import KernelSpecError
from .families import DENSE_FAMILIES
from .params import FamilySchema, Value

_REGISTRY: Dict[str, FamilySchema] = {f.name: f for f in DENSE_FAMILIES}


def register_family(schema: FamilySchema) -> FamilySchema:
    """Add a family (e.g. a weight format's fused kernels) to the registry; idempotent."""
    if not isinstance(schema, FamilySchema):
        raise KernelSpecError(f"register_family expects a FamilySchema, got {type(schema).__name__}")
    existing = _REGISTRY.get(schema.name)
    if existing is not None and existing != schema:
        raise KernelSpecError(f"kernel family {schema.name!r} is already registered differently")
    _REGISTRY[schema.name] = schema
    return schema


def get_family(name: Any) -> FamilySchema:
    """The schema of a registered family; KernelSpecError naming the known ones otherwise."""
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    raise KernelSpecError(f"unknown kernel family {name!r}; known families: "
                          f"{', '.join(known_families())}")


def known_families() -> Tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: `family` (a registered name) and `params` as ((name, value), ...) in the
    family's declaration order with defaults filled in. Always valid once constructed."""
    family: str
    params: Tuple[Tuple[str, Value], ...] = ()

    def __post_init__(self):
        schema = get_family(self.family)
        pairs = self.params.items() if isinstance(self.params, Mapping) else self.params
        given: Dict[str, Any] = {}
        try:
            for name, value in pairs:
                if name in given:
                    raise KernelSpecError(f"kernel family {self.family!r}: parameter {name} given twice")
                given[name] = value
        except (TypeError, ValueError):
            raise KernelSpecError(f"kernel spec params must be (name, value) pairs, got "
                                  f"{self.params!r}") from None
        object.__setattr__(self, "params", schema.canonical_params(given))

    @classmethod
    def create(cls, family: str, **params: Value) -> "KernelSpec":
        return cls(family, tuple(params.items()))

    @property
    def schema(self) -> FamilySchema:
        return get_family(self.family)

    @property
    def backend(self) -> str:
        return self.schema.backend

    def get(self, name: str) -> Value:
        for key, value in self.params:
            if key == name:
                return value
        raise KernelSpecError(f"kernel family {self.family!r} has no parameter {name!r}")

    def with_params(self, **changes: Value) -> "KernelSpec":
        """This spec with `changes` to its parameters, validated as any spec is."""
        return KernelSpec(self.family, tuple({**dict(self.params), **changes}.items()))

    def as_dict(self) -> Dict[str, Any]:
        """Plain JSON-able form; `KernelSpec.from_dict` inverts it."""
        return {"family": self.family, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelSpec":
        if not isinstance(data, Mapping) or set(data) != {"family", "params"} \
                or not isinstance(data["params"], Mapping):
            raise KernelSpecError(f"a kernel spec is {{'family': name, 'params': {{...}}}}, got {data!r}")
        return cls(data["family"], tuple(data["params"].items()))

    def __str__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.family}({inner})"


def kernel_spec(family: str, **params: Value) -> KernelSpec:
    """Validated spec of `family` with the given parameters (others at their defaults)."""
    return KernelSpec.create(family, **params)
