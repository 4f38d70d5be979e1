"""Canonical JSON of a Program, its content hash (the Program's id), and file load/save.

Canonical form: sorted keys, compact separators (`,` `:`), UTF-8, integral floats written as
ints, one trailing newline. Encoding a decoded canonical text gives back the same bytes.

`program_id(p)` is the sha256 of the canonical JSON of everything except `history`. It names
*what the decoder does*, not how it was reached: two Programs that decode the same way (same
models, formats, topology, kernels, ...) share an id, whichever transformations produced them,
so the id can key kernel caches and benchmark results.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from typing import Any, Dict, Union

from .errors import IRError
from .json_fields import (expect_bool, expect_int, expect_list, expect_object, expect_scalar,
                          expect_str, expect_topology, fail)
from .model_spec import ModelSpec
from .prune import prune_from_json
from .program import (SCHEMA_VERSION, BatchSpec, CommitSpec, DraftSpec, KernelsSpec, Models,
                      Program, VerifySpec)
from .transforms import transformation_from_obj, transformation_to_obj
from .wellformed import verify

PROGRAM_FILE = "program.json"  # the name of a Program inside a folder (exports, round outputs)

_MODEL_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim")
_MODEL_BOOL_FIELDS = ("qkv_bias", "qk_norm", "tie_embeddings")
_MODEL_STR_FIELDS = ("role", "family", "checkpoint", "dtype")
_MODEL_FIELDS = (_MODEL_INT_FIELDS + _MODEL_BOOL_FIELDS + _MODEL_STR_FIELDS
                 + ("layer_kinds", "weight_formats", "lossless12_escape_ppm"))


# ---------------------------------------------------------------------------------- encoding

def _normalise(value: Any, path: str = "") -> Any:
    """Integral floats become ints; NaN and infinities are refused (JSON has no spelling)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise fail(path or "value", f"non-finite number {value!r}")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _normalise(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def canonical_json(obj: Any) -> str:
    """The canonical text of any JSON-ready value (sorted keys, compact, trailing newline)."""
    return json.dumps(_normalise(obj), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False) + "\n"


def _pairs_to_object(pairs, path: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise fail(path, f"expected (name, value) pairs, got {pair!r}")
        if pair[0] in out:
            raise fail(f"{path}[{pair[0]}]", "listed twice")
        out[pair[0]] = pair[1]
    return out


def _model_to_obj(m: ModelSpec, path: str) -> Dict[str, Any]:
    obj = {name: getattr(m, name) for name in _MODEL_FIELDS}
    obj["layer_kinds"] = list(m.layer_kinds)
    obj["weight_formats"] = _pairs_to_object(m.weight_formats, f"{path}.weight_formats")
    obj["lossless12_escape_ppm"] = _pairs_to_object(m.lossless12_escape_ppm,
                                                    f"{path}.lossless12_escape_ppm")
    return obj


def _verify_to_obj(p: Program) -> Dict[str, Any]:
    obj = {"mask": p.verify.mask, "acceptance": p.verify.acceptance}
    # Fields added after the first schema are written only when they differ from their default,
    # so Programs that do not use them keep their text and id.
    if p.verify.prune is not None:
        obj["prune"] = p.verify.prune.to_json()
    return obj


def _batch_to_obj(p: Program) -> Dict[str, Any]:
    b = p.batch
    obj = {"layout": b.layout, "max_batch_size": b.max_batch_size,
           "draft_length_policy": b.draft_length_policy}
    if b.token_budget is not None:
        obj["token_budget"] = b.token_budget
    if b.refill != BatchSpec.refill:
        obj["refill"] = b.refill
    if b.length_estimator != BatchSpec.length_estimator:
        obj["length_estimator"] = b.length_estimator
    if b.length_drain != BatchSpec.length_drain:
        obj["length_drain"] = b.length_drain
    return obj


def _kernels_to_obj(p: Program) -> Dict[str, Any]:
    k = p.kernels
    overrides = _pairs_to_object(k.overrides, "kernels.overrides")
    obj = {"backend": k.backend, "capture_graphs": k.capture_graphs,
           "overrides": {node: _pairs_to_object(params, f"kernels.overrides[{node}]")
                         for node, params in overrides.items()}}
    if k.fast_path != KernelsSpec.fast_path:
        obj["fast_path"] = k.fast_path
    if k.drafter_kernels != KernelsSpec.drafter_kernels:
        obj["drafter_kernels"] = k.drafter_kernels
    if k.attention_kernels != KernelsSpec.attention_kernels:
        obj["attention_kernels"] = k.attention_kernels
    if k.accept_kernels != KernelsSpec.accept_kernels:
        obj["accept_kernels"] = k.accept_kernels
    return obj


def program_to_obj(p: Program, *, include_history: bool = True) -> Dict[str, Any]:
    """The Program as plain JSON-ready data (the shape of its canonical JSON)."""
    obj = {
        "schema_version": p.schema_version,
        "gpu": p.gpu,
        "models": {"target": _model_to_obj(p.models.target, "models.target"),
                   "drafter": _model_to_obj(p.models.drafter, "models.drafter")},
        "draft": {"drafter": p.draft.drafter, "topology": p.draft.topology.to_json()},
        "verify": _verify_to_obj(p),
        "commit": {"kv": p.commit.kv},
        "batch": _batch_to_obj(p),
        "kernels": _kernels_to_obj(p),
    }
    if include_history:
        obj["history"] = [transformation_to_obj(t) for t in p.history]
    return obj


def program_to_json(p: Program) -> str:
    """Canonical JSON text of the Program, history included."""
    return canonical_json(program_to_obj(p))


def program_id(p: Program) -> str:
    """sha256 hex digest of the canonical JSON of the Program without its history."""
    text = canonical_json(program_to_obj(p, include_history=False))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------- decoding

def _model_from_obj(value: Any, path: str) -> ModelSpec:
    obj = expect_object(value, path, _MODEL_FIELDS)
    kw: Dict[str, Any] = {}
    for name in _MODEL_INT_FIELDS:
        kw[name] = expect_int(obj[name], f"{path}.{name}")
    for name in _MODEL_BOOL_FIELDS:
        kw[name] = expect_bool(obj[name], f"{path}.{name}")
    for name in _MODEL_STR_FIELDS:
        kw[name] = expect_str(obj[name], f"{path}.{name}")
    kinds = expect_list(obj["layer_kinds"], f"{path}.layer_kinds")
    kw["layer_kinds"] = tuple(expect_str(k, f"{path}.layer_kinds[{i}]") for i, k in enumerate(kinds))
    formats = expect_object(obj["weight_formats"], f"{path}.weight_formats")
    kw["weight_formats"] = tuple((name, expect_str(fmt, f"{path}.weight_formats[{name}]"))
                                 for name, fmt in formats.items())
    rates = expect_object(obj["lossless12_escape_ppm"], f"{path}.lossless12_escape_ppm")
    kw["lossless12_escape_ppm"] = tuple(
        (name, expect_int(ppm, f"{path}.lossless12_escape_ppm[{name}]"))
        for name, ppm in rates.items())
    return ModelSpec(**kw)


def program_from_obj(value: Any, *, check: bool = True) -> Program:
    """Decode plain JSON data into a Program; `check` also runs `verify` on the result."""
    obj = expect_object(value, "")
    if "schema_version" in obj:
        version = expect_int(obj["schema_version"], "schema_version")
        if version != SCHEMA_VERSION:
            raise fail("schema_version", f"unsupported version {version} "
                                         f"(this build reads {SCHEMA_VERSION})")
    expect_object(obj, "", ("schema_version", "gpu", "models", "draft", "verify", "commit",
                            "batch", "kernels", "history"))
    models = expect_object(obj["models"], "models", ("target", "drafter"))
    draft = expect_object(obj["draft"], "draft", ("drafter", "topology"))
    verify_ = expect_object(obj["verify"], "verify", ("mask", "acceptance"), optional=("prune",))
    commit = expect_object(obj["commit"], "commit", ("kv",))
    batch = expect_object(obj["batch"], "batch",
                          ("layout", "max_batch_size", "draft_length_policy"),
                          optional=("token_budget", "refill", "length_estimator",
                                    "length_drain"))
    kernels = expect_object(obj["kernels"], "kernels", ("backend", "capture_graphs", "overrides"),
                            optional=("fast_path", "drafter_kernels", "attention_kernels",
                                      "accept_kernels"))
    overrides = expect_object(kernels["overrides"], "kernels.overrides")
    history = expect_list(obj["history"], "history")
    program = Program(
        schema_version=SCHEMA_VERSION,
        gpu=expect_str(obj["gpu"], "gpu"),
        models=Models(target=_model_from_obj(models["target"], "models.target"),
                      drafter=_model_from_obj(models["drafter"], "models.drafter")),
        draft=DraftSpec(drafter=expect_str(draft["drafter"], "draft.drafter"),
                        topology=expect_topology(draft["topology"], "draft.topology")),
        verify=VerifySpec(mask=expect_str(verify_["mask"], "verify.mask"),
                          acceptance=expect_str(verify_["acceptance"], "verify.acceptance"),
                          prune=(prune_from_json(verify_["prune"], "verify.prune")
                                 if "prune" in verify_ else None)),
        commit=CommitSpec(kv=expect_str(commit["kv"], "commit.kv")),
        batch=BatchSpec(layout=expect_str(batch["layout"], "batch.layout"),
                        max_batch_size=expect_int(batch["max_batch_size"], "batch.max_batch_size"),
                        draft_length_policy=expect_str(batch["draft_length_policy"],
                                                       "batch.draft_length_policy"),
                        token_budget=(expect_int(batch["token_budget"], "batch.token_budget")
                                      if "token_budget" in batch else None),
                        refill=expect_str(batch.get("refill", BatchSpec.refill), "batch.refill"),
                        length_estimator=expect_str(batch.get("length_estimator",
                                                              BatchSpec.length_estimator),
                                                    "batch.length_estimator"),
                        length_drain=expect_str(batch.get("length_drain",
                                                          BatchSpec.length_drain),
                                                "batch.length_drain")),
        kernels=KernelsSpec(
            backend=expect_str(kernels["backend"], "kernels.backend"),
            capture_graphs=expect_bool(kernels["capture_graphs"], "kernels.capture_graphs"),
            overrides=tuple(
                (node, tuple((param, expect_scalar(v, f"kernels.overrides[{node}][{param}]"))
                             for param, v in expect_object(
                                 params, f"kernels.overrides[{node}]").items()))
                for node, params in overrides.items()),
            fast_path=expect_str(kernels.get("fast_path", KernelsSpec.fast_path),
                                 "kernels.fast_path"),
            drafter_kernels=expect_str(kernels.get("drafter_kernels",
                                                   KernelsSpec.drafter_kernels),
                                       "kernels.drafter_kernels"),
            attention_kernels=expect_str(kernels.get("attention_kernels",
                                                     KernelsSpec.attention_kernels),
                                         "kernels.attention_kernels"),
            accept_kernels=expect_str(kernels.get("accept_kernels", KernelsSpec.accept_kernels),
                                      "kernels.accept_kernels")),
        history=tuple(transformation_from_obj(t, f"history[{i}]") for i, t in enumerate(history)),
    )
    if check:
        verify(program)
    return program


def program_from_json(text: Union[str, bytes], *, check: bool = True) -> Program:
    """Parse canonical (or any equivalent) JSON text into a Program.

    Malformed JSON and missing, extra or mistyped fields raise IRError naming the field's path
    (`draft.topology.k: expected int, got str '4'`); with `check` (the default) the result must
    also pass `verify`.
    """
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IRError(f"program: not valid JSON: {exc}") from None
    return program_from_obj(obj, check=check)


# ---------------------------------------------------------------------------------- files

def resolve_program_path(path: str) -> str:
    """`path` itself, or `path/program.json` when `path` is a folder."""
    return os.path.join(path, PROGRAM_FILE) if os.path.isdir(path) else path


def load_program(path: str, *, check: bool = True) -> Program:
    """Read a Program from a JSON file, or from `program.json` inside a folder."""
    file = resolve_program_path(os.fspath(path))
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise IRError(f"cannot read program file {file!r}: {exc.strerror or exc}") from None
    try:
        return program_from_json(data, check=check)
    except IRError as exc:
        raise type(exc)(f"{file}: {exc}") from None


def save_program(p: Program, path: str) -> None:
    """Verify `p` and write its canonical JSON to `path` atomically (a temporary file in the same
    folder, then os.replace), so a reader never sees a half-written Program."""
    verify(p)
    text = program_to_json(p)
    path = os.fspath(path)
    # A unique name next to the target (same file system, so os.replace is atomic); opened with
    # "x" so that the file gets the usual permissions under the process umask.
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise IRError(f"cannot write program file {path!r}: {exc.strerror or exc}") from None
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
