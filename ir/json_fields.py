"""Typed reads of decoded JSON values, each failure an IRError naming the field's path.

Paths read like attribute access on the Program: `draft.topology.k`, `history[2].params.fmt`,
`models.target.weight_formats[lm_head]`.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from .errors import IRError
from .topology import TOPOLOGY_KINDS, Chain, DynamicTree, SparseTree, Topology, Tree


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", list: "list", dict: "object"}.get(
        type(value), type(value).__name__)


def fail(path: str, message: str) -> IRError:
    return IRError(f"{path or 'program'}: {message}")


def expect_object(value: Any, path: str, keys: Optional[Iterable[str]] = None,
                  optional: Iterable[str] = ()) -> dict:
    """`value` as a dict; with `keys`, exactly those keys must be present (missing or extra
    named), besides any of `optional` (fields whose default is left out of canonical JSON)."""
    if not isinstance(value, dict):
        raise fail(path, f"expected object, got {_kind(value)}")
    if keys is not None:
        wanted = set(keys)
        allowed = wanted | set(optional)
        missing = sorted(wanted - set(value))
        extra = sorted(set(value) - allowed)
        where = (path + ".") if path else ""
        if missing:
            raise IRError(f"{where}{missing[0]}: missing field"
                          + (f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""))
        if extra:
            raise IRError(f"{where}{extra[0]}: unknown field"
                          + (f" (also unknown: {', '.join(extra[1:])})" if extra[1:] else "")
                          + f"; expected only {', '.join(sorted(allowed))}")
    return value


def expect_int(value: Any, path: str) -> int:
    """An integer; a float with an integral value (4.0) is read as that integer."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, f"expected int, got {_kind(value)} {value!r}")
    return value


def expect_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise fail(path, f"expected str, got {_kind(value)} {value!r}")
    return value


def expect_bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise fail(path, f"expected bool, got {_kind(value)} {value!r}")
    return value


def expect_list(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise fail(path, f"expected list, got {_kind(value)}")
    return value


def expect_choice(value: Any, path: str, choices: Iterable[str]) -> str:
    value = expect_str(value, path)
    choices = tuple(choices)
    if value not in choices:
        raise fail(path, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def expect_scalar(value: Any, path: str):
    """An int, str or bool (the value types of kernel parameter overrides)."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise fail(path, f"expected int, str or bool, got {_kind(value)} {value!r}")
    return value


def expect_topology(value: Any, path: str) -> Topology:
    """A topology object: `{"kind": "chain", "k": K}`, `{"kind": "tree", "branching": [...]}`,
    `{"kind": "sparse_tree", "paths": [[0], [1], [0, 0], ...]}` or
    `{"kind": "dynamic_tree", "budget": N, "depth": D, "width": W}`."""
    obj = expect_object(value, path)
    if "kind" not in obj:
        raise fail(f"{path}.kind", "missing field")
    kind = expect_choice(obj.get("kind"), f"{path}.kind", TOPOLOGY_KINDS)
    try:
        if kind == "chain":
            expect_object(obj, path, ("kind", "k"))
            return Chain(expect_int(obj["k"], f"{path}.k"))
        if kind == "tree":
            expect_object(obj, path, ("kind", "branching"))
            items = expect_list(obj["branching"], f"{path}.branching")
            return Tree(tuple(expect_int(b, f"{path}.branching[{i}]") for i, b in enumerate(items)))
        if kind == "sparse_tree":
            expect_object(obj, path, ("kind", "paths"))
            paths = expect_list(obj["paths"], f"{path}.paths")
            return SparseTree(tuple(
                tuple(expect_int(r, f"{path}.paths[{i}][{j}]")
                      for j, r in enumerate(expect_list(q, f"{path}.paths[{i}]")))
                for i, q in enumerate(paths)))
        expect_object(obj, path, ("kind", "budget", "depth", "width"))
        return DynamicTree(*(expect_int(obj[name], f"{path}.{name}")
                             for name in ("budget", "depth", "width")))
    except IRError as exc:
        if str(exc).startswith(path):
            raise
        raise fail(path, str(exc)) from None
