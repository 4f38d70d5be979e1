"""Typed kernel parameters and the schema of a kernel family, and measured default tiles.

A family declares its parameters once (name, type, allowed values, default). Every value that
reaches a template passes through one of these validators, so generated source only ever
contains ints in a declared range, members of a fixed enum, bools and plain identifiers.
`LINEAR_TILES` holds the `linear` family's best tiles as measured on a GPU, as data; lowering
picks from it by the rows a node multiplies.
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


# ------------------------------------------------------------------ measured tiles of `linear`

@dataclass(frozen=True)
class MeasuredTiles:
    """Tiles measured best for x[rows, k] @ w[n, k]^T with `rows`, `n` and `k` in the given
    (lo, hi) ranges."""
    rows: Tuple[int, int]
    n: Tuple[int, int]
    k: Tuple[int, int]
    tiles: Tuple[Tuple[str, Value], ...]

    def covers(self, rows: int, n: int, k: int) -> bool:
        return all(lo <= v <= hi for v, (lo, hi) in ((rows, self.rows), (n, self.n), (k, self.k)))


_ANY = 1 << 31
# Past this many output columns there are enough output tiles to fill the GPU without splitting
# K (measured: gate_up, N=28672, prefers no split; qkv/o/down, N<=6144, prefer SPLIT_K=2).
WIDE_N = 16384

# The best bf16 `linear` configurations measured on an NVIDIA H200 (132 SMs) by bench/kernels.py:
# bench/results/kernels.json, `best_configs` (2026-11-29, torch 2.11, Triton 3.6), Llama-3.1-8B
# shapes qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336 at M = 1, 4, 8, 16, 32,
# 64. Percentages are of the device copy bandwidth, best vs the multiply-add defaults they
# replace. What no entry covers (17..32 rows and more than 64: only the defaults were measured;
# 9..16 rows of a wide N: the default was best) keeps lowering's shape-derived tiles.
LINEAR_TILES: Tuple[MeasuredTiles, ...] = (
    # M=1,4,8, qkv/o/down: 55-75% (default 1-17%)
    MeasuredTiles((1, 8), (1, WIDE_N - 1), (1, _ANY),
                  (("BLOCK_M", 16), ("BLOCK_N", 64), ("BLOCK_K", 128), ("SPLIT_K", 2),
                   ("num_warps", 4), ("num_stages", 3))),
    # M=1,4,8, gate_up: 95-96% (default 4-30%)
    MeasuredTiles((1, 8), (WIDE_N, _ANY), (1, _ANY),
                  (("BLOCK_M", 16), ("BLOCK_N", 32), ("BLOCK_K", 128), ("SPLIT_K", 1),
                   ("num_warps", 4), ("num_stages", 3))),
    # M=16, qkv/o/down: 66-86% (default 28-40%)
    MeasuredTiles((9, 16), (1, WIDE_N - 1), (1, _ANY),
                  (("BLOCK_M", 16), ("BLOCK_N", 32), ("BLOCK_K", 256), ("SPLIT_K", 1),
                   ("num_warps", 4), ("num_stages", 4))),
    # M=64, o/qkv (K=4096): 58-63% (default 28-38%); down and gate_up were not swept at this M
    MeasuredTiles((33, 64), (1, WIDE_N - 1), (1, 4096),
                  (("BLOCK_M", 64), ("BLOCK_N", 32), ("BLOCK_K", 256), ("SPLIT_K", 1),
                   ("num_warps", 4), ("num_stages", 4))),
)


def measured_linear_tiles(rows: int, n: int, k: int) -> Optional[Dict[str, Value]]:
    """The tiles of the first `LINEAR_TILES` entry covering this matmul (tensor-core tiles), or
    None when none covers it."""
    for entry in LINEAR_TILES:
        if entry.covers(rows, n, k):
            return dict(entry.tiles)
    return None
