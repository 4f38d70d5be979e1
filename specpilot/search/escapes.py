"""Measure each linear's lossless12 escape rate from a checkpoint, so that SetWeightFormat can
decide whether the packed format pays (the IR refuses it while the rate is unknown)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Dict, Optional

from specpilot.ir import Program, record_escape_rates
from specpilot.ir.formats import PPM


def checkpoint_key(linear: str, tied: bool) -> str:
    """The checkpoint tensor holding an IR linear's weight."""
    if linear == "lm_head":
        return "model.embed_tokens.weight" if tied else "lm_head.weight"
    return f"model.{linear}.weight"


def measure_escape_rates(model_spec, folder: str) -> Dict[str, int]:
    """{linear: escapes in ppm (rounded down)} of every linear of `model_spec` stored in
    `folder`, packed the way the generated backend packs (one exponent base per row)."""
    import torch

    from specpilot.codegen.formats.lossless12 import escape_rate, pack_lossless12
    from specpilot.runtime.checkpoint import load_state_dict

    tensors = load_state_dict(folder)
    out = {}
    for linear in model_spec.linears:
        weight = tensors[checkpoint_key(linear, model_spec.tie_embeddings)].to(torch.bfloat16)
        out[linear] = int(math.floor(escape_rate(pack_lossless12(weight, "row")) * PPM))
    return out


def with_measured_escapes(program: Program, target_dir: str, drafter_dir: str,
                          cache_file: Optional[str] = None) -> Program:
    """`program` with the escape rates of both models recorded (bfloat16 models only: lossless12
    packs bfloat16 weights). With `cache_file`, rates measured before are read from it and new
    ones written to it (packing an 8B model's weights takes a while)."""
    cached: Dict[str, Dict[str, int]] = {}
    if cache_file and os.path.exists(cache_file):
        with open(cache_file, encoding="utf-8") as f:
            cached = json.load(f)
    changed = False
    for role, folder in (("target", target_dir), ("drafter", drafter_dir)):
        spec = getattr(program.models, role)
        if spec.dtype != "bfloat16":
            continue
        if set(cached.get(role, {})) != set(spec.linears):
            cached[role] = measure_escape_rates(spec, folder)
            changed = True
        program = record_escape_rates(program, role, cached[role])
    if cache_file and changed:
        from .run_folder import write_json_atomic
        write_json_atomic(Path(cache_file), cached)
    return program
