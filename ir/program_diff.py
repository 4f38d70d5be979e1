"""Structural diff of two Programs by attribute path.

`diff(a, b)` lists every changed leaf as a `Change(path, old, new)`, in a fixed order (the
Program's sections top to bottom, keyed maps by key); `format_diff` prints one line per change:

    draft.topology: chain(4) → tree([4, 2, 2, 1])
    models.target.weight_formats[layers.3.mlp.down_proj]: bf16 → lossless12

A key or history entry present on one side only has `None` (printed `absent`) on the other.
History is compared entry by entry, so two Programs with the same id but different provenance
still show a difference.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, List

from .program import Program
from .topology import TOPOLOGIES
from .transforms import Transformation

# Program sections in reading order (the dataclass puts schema_version last for its default).
_PROGRAM_ORDER = ("schema_version", "gpu", "models", "draft", "verify", "commit", "batch",
                  "kernels")
# Tuple-of-pairs attributes, diffed key by key; `overrides` nests one more level.
_KEYED = ("weight_formats", "lossless12_escape_ppm")


@dataclass(frozen=True)
class Change:
    path: str
    old: Any
    new: Any


def _as_map(pairs) -> dict:
    return {p[0]: p[1] for p in pairs}


def _diff_keyed(path: str, a: dict, b: dict, out: List[Change], depth: int) -> None:
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key), b.get(key)
        if depth > 1:
            _diff_keyed(f"{path}[{key}]", _as_map(old or ()), _as_map(new or ()), out, depth - 1)
        elif old != new:
            out.append(Change(f"{path}[{key}]", old, new))


def _diff_value(path: str, a: Any, b: Any, out: List[Change]) -> None:
    if a == b:
        return
    name = path.rsplit(".", 1)[-1]
    if name in _KEYED:
        _diff_keyed(path, _as_map(a), _as_map(b), out, 1)
    elif name == "overrides":
        _diff_keyed(path, _as_map(a), _as_map(b), out, 2)
    elif is_dataclass(a) and type(a) is type(b) and not isinstance(a, TOPOLOGIES):
        for f in fields(a):
            _diff_value(f"{path}.{f.name}", getattr(a, f.name), getattr(b, f.name), out)
    else:
        out.append(Change(path, a, b))


def diff(a: Program, b: Program) -> List[Change]:
    """Every attribute that differs between `a` and `b`, by path (empty when equal)."""
    out: List[Change] = []
    for name in _PROGRAM_ORDER:
        _diff_value(name, getattr(a, name), getattr(b, name), out)
    for i in range(max(len(a.history), len(b.history))):
        old = a.history[i] if i < len(a.history) else None
        new = b.history[i] if i < len(b.history) else None
        if old != new:
            out.append(Change(f"history[{i}]", old, new))
    return out


def format_value(value: Any) -> str:
    """How a leaf value reads in a diff: plain strings, lowercase booleans, chain(4)/tree([..]),
    a prune spec as layer_skip(...)/low_precision(...)."""
    if value is None:
        return "absent"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, TOPOLOGIES + (Transformation,)):
        return str(value)
    if isinstance(value, tuple):
        return json.dumps(list(value), ensure_ascii=False)
    return str(value)


def format_diff(changes: List[Change]) -> str:
    """One `path: old → new` line per change, or `no differences`."""
    if not changes:
        return "no differences"
    return "\n".join(f"{c.path}: {format_value(c.old)} → {format_value(c.new)}" for c in changes)
