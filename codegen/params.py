"""Typed kernel parameters and the schema of a kernel family.

A family declares its parameters once (name, type, allowed values, default). Every value that
reaches a template passes through one of these validators, so generated source only ever
contains ints in a declared range, members of a fixed enum, bools and plain identifiers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from .errors import KernelSpecError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BACKENDS = ("triton", "cuda")


def _fail(family: str, name: str, msg: str) -> KernelSpecError:
    return KernelSpecError(f"kernel family {family!r}, parameter {name}: {msg}")


@dataclass(frozen=True)
class IntParam:
    """An integer in [lo, hi]; `power_of_two` further restricts it to powers of two."""
    name: str
    lo: int
    hi: int
    default: int
    power_of_two: bool = False
    doc: str = ""

    def validate(self, family: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(family, self.name, f"expected an integer, got {value!r}")
        if not self.lo <= value <= self.hi:
            raise _fail(family, self.name, f"{value} is outside the allowed range {self.lo}..{self.hi}")
        if self.power_of_two and value & (value - 1):
            raise _fail(family, self.name, f"{value} is not a power of two")
        return int(value)

    def describe(self) -> str:
        kind = "power of two" if self.power_of_two else "int"
        return f"{kind} in {self.lo}..{self.hi}"


@dataclass(frozen=True)
class EnumParam:
    """One of a fixed tuple of strings (each a plain identifier)."""
    name: str
    choices: Tuple[str, ...]
    default: str
    doc: str = ""

    def validate(self, family: str, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise _fail(family, self.name, f"{value!r} is not one of {', '.join(self.choices)}")
        return value

    def describe(self) -> str:
        return "one of " + "|".join(self.choices)


@dataclass(frozen=True)
class BoolParam:
    """True or False (not 0/1: a typo'd int must not silently become a flag)."""
    name: str
    default: bool
    doc: str = ""

    def validate(self, family: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _fail(family, self.name, f"expected True or False, got {value!r}")
        return value

    def describe(self) -> str:
        return "bool"


@dataclass(frozen=True)
class IdentParam:
    """A name that may appear in generated source, matching ^[A-Za-z_][A-Za-z0-9_]*$."""
    name: str
    default: str
    max_len: int = 64
    doc: str = ""

    def validate(self, family: str, value: Any) -> str:
        if not isinstance(value, str) or len(value) > self.max_len or not IDENTIFIER.match(value):
            raise _fail(family, self.name,
                        f"{value!r} is not an identifier (letters, digits, '_', not starting "
                        f"with a digit, at most {self.max_len} characters)")
        return value

    def describe(self) -> str:
        return "identifier"


Param = Union[IntParam, EnumParam, BoolParam, IdentParam]
Value = Union[int, str, bool]


@dataclass(frozen=True)
class FamilySchema:
    """Everything codegen knows about one kernel family.

    `check(params)` returns an error message for combinations that are individually valid but
    illegal together (None when fine). `derive(params)` returns extra template constants that
    are computed here, in Python, from the validated parameters (ints, bools, or strings taken
    from fixed tables). `launcher` documents the entry point of the built module.
    `host_launcher` (CUDA families only) wraps the compiled extension into that entry point.
    """
    name: str
    backend: str
    params: Tuple[Param, ...]
    launcher: str
    summary: str
    check: Optional[Callable[[Mapping[str, Value]], Optional[str]]] = None
    derive: Optional[Callable[[Mapping[str, Value]], Dict[str, Value]]] = None
    host_launcher: Optional[Callable[..., Any]] = field(default=None, compare=False)

    def __post_init__(self):
        if not IDENTIFIER.match(self.name):
            raise KernelSpecError(f"kernel family name {self.name!r} is not an identifier")
        if self.backend not in BACKENDS:
            raise KernelSpecError(f"kernel family {self.name!r}: backend must be one of {BACKENDS}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise KernelSpecError(f"kernel family {self.name!r} declares a parameter twice")
        for p in self.params:
            if not IDENTIFIER.match(p.name):
                raise KernelSpecError(f"kernel family {self.name!r}: bad parameter name {p.name!r}")
            if isinstance(p, EnumParam) and not all(IDENTIFIER.match(c) for c in p.choices):
                raise KernelSpecError(f"kernel family {self.name!r}: enum {p.name} has a "
                                      f"choice that is not an identifier")
            p.validate(self.name, p.default)  # a bad default is a declaration bug: fail early

    @property
    def template_name(self) -> str:
        """Path of the family's template relative to the templates folder."""
        suffix = "py.j2" if self.backend == "triton" else "cu.j2"
        return f"{self.backend}/{self.name}.{suffix}"

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.params)
        raise KernelSpecError(f"kernel family {self.name!r} has no parameter {name!r} "
                              f"(known: {known})")

    def canonical_params(self, given: Mapping[str, Any]) -> Tuple[Tuple[str, Value], ...]:
        """Validate `given`, fill defaults, and return the params in declaration order."""
        for name in given:
            self.param(name)
        values = {p.name: p.validate(self.name, given.get(p.name, p.default)) for p in self.params}
        if self.check is not None:
            problem = self.check(values)
            if problem:
                raise KernelSpecError(f"kernel family {self.name!r}: {problem}")
        return tuple((p.name, values[p.name]) for p in self.params)
