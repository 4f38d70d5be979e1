"""Two-level verification: the cheaper verifier that prunes a drafted tree before the target.

`verify.prune` names a cheaper path through the *target* itself. It runs over the drafted tree
first; a node survives when its token is among the cheap verifier's top-`top_k` after its parent
(and its parent survived). The full target then verifies only the survivors and, as always, has
the last word, so pruning can cost accepted tokens but never change the output.

    LayerSkipPrune(keep_layers, top_k)   the target's layers `keep_layers` only (same weights)
    LowPrecisionPrune(dtype, top_k)      the target's weights and activations cast to `dtype`

Construction checks types and the ranges that need no Program; `verify` checks the rest against
the target (layer indices, a strictly lower precision).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple, Union

from .errors import IRError
from .json_fields import expect_choice, expect_int, expect_list, expect_object, expect_str, fail

PRUNE_KINDS = ("layer_skip", "low_precision")


def _check_top_k(top_k) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise IRError(f"prune top_k must be an integer >= 1, got {top_k!r}")


@dataclass(frozen=True)
class LayerSkipPrune:
    keep_layers: Tuple[int, ...]
    top_k: int

    kind = "layer_skip"

    def __post_init__(self):
        keep = self.keep_layers
        if (not isinstance(keep, tuple) or not keep
                or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in keep)):
            raise IRError(f"layer_skip keep_layers must be a non-empty tuple of layer indices, "
                          f"got {keep!r}")
        if list(keep) != sorted(set(keep)):
            raise IRError(f"layer_skip keep_layers must be strictly increasing, got {list(keep)}")
        _check_top_k(self.top_k)

    def to_json(self) -> dict:
        return {"kind": self.kind, "keep_layers": list(self.keep_layers), "top_k": self.top_k}

    def __str__(self) -> str:
        return f"layer_skip(keep_layers={list(self.keep_layers)}, top_k={self.top_k})"


@dataclass(frozen=True)
class LowPrecisionPrune:
    dtype: str
    top_k: int

    kind = "low_precision"

    def __post_init__(self):
        if not isinstance(self.dtype, str):
            raise IRError(f"low_precision dtype must be a dtype name, got {self.dtype!r}")
        _check_top_k(self.top_k)

    def to_json(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype, "top_k": self.top_k}

    def __str__(self) -> str:
        return f"low_precision(dtype={self.dtype}, top_k={self.top_k})"


Prune = Union[LayerSkipPrune, LowPrecisionPrune]
PRUNES = (LayerSkipPrune, LowPrecisionPrune)


def prune_from_json(value: Any, path: str = "prune") -> Prune:
    """Decode `{"kind": "layer_skip", "keep_layers": [...], "top_k": k}` or
    `{"kind": "low_precision", "dtype": "...", "top_k": k}`; errors name `path`."""
    obj = expect_object(value, path)
    if "kind" not in obj:
        raise fail(f"{path}.kind", "missing field")
    kind = expect_choice(obj["kind"], f"{path}.kind", PRUNE_KINDS)
    try:
        if kind == "layer_skip":
            expect_object(obj, path, ("kind", "keep_layers", "top_k"))
            items = expect_list(obj["keep_layers"], f"{path}.keep_layers")
            keep = tuple(expect_int(i, f"{path}.keep_layers[{n}]") for n, i in enumerate(items))
            return LayerSkipPrune(keep, expect_int(obj["top_k"], f"{path}.top_k"))
        expect_object(obj, path, ("kind", "dtype", "top_k"))
        return LowPrecisionPrune(expect_str(obj["dtype"], f"{path}.dtype"),
                                 expect_int(obj["top_k"], f"{path}.top_k"))
    except IRError as exc:
        if str(exc).startswith(path):
            raise
        raise fail(path, str(exc)) from None
