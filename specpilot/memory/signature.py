"""Deployment signatures: what a mechanism was validated on, and how alike two deployments are.

A signature keeps what decides whether a mechanism transfers: the GPU class, the dtype, each
model's family and rough size (a power-of-two bucket of its linear parameters), the drafter's
size relative to the target, the batch size and the workload. Exact checkpoints are left out on
purpose, so a mechanism found on one 8B/1B pair is offered to another.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Dict

from specpilot.ir import Program

# How much each part of the signature counts towards similarity (sums to 1).
WEIGHTS = {"gpu": 0.25, "dtype": 0.15, "family": 0.15, "target_size": 0.15,
           "drafter_ratio": 0.1, "batch": 0.1, "workload": 0.1}
SIMILAR = 0.6


def _linear_params(model) -> int:
    total = 0
    for name in model.linears:
        out_features, in_features = model.linear_shape(name)
        total += out_features * in_features
    return total


def _gpu_class(gpu: str) -> str:
    from specpilot.cost.gpu_specs import UnknownGpu, gpu_key
    try:
        return gpu_key(gpu)
    except UnknownGpu:
        return gpu.lower()


def deployment_signature(program: Program, workload: str, batch_size: int) -> Dict:
    """The signature of the deployment `program` serves (JSON-ready, canonical order)."""
    target, drafter = program.models.target, program.models.drafter
    t_params, d_params = _linear_params(target), _linear_params(drafter)
    return {
        "gpu": _gpu_class(program.gpu),
        "dtype": target.dtype,
        "family": target.family,
        "target_size": int(round(math.log2(max(t_params, 1)))),
        "drafter_ratio": int(round(math.log2(max(t_params, 1) / max(d_params, 1)))),
        "batch": int(round(math.log2(max(batch_size, 1)))),
        "workload": workload if workload == "humaneval" else "file:" + workload.rsplit("/", 1)[-1],
    }


def signature_key(signature: Dict) -> str:
    text = json.dumps(signature, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def similarity(a: Dict, b: Dict) -> float:
    """1.0 for equal signatures; sizes one bucket apart count half."""
    score = 0.0
    for part, weight in WEIGHTS.items():
        x, y = a.get(part), b.get(part)
        if x == y:
            score += weight
        elif isinstance(x, int) and isinstance(y, int) and abs(x - y) == 1:
            score += weight / 2
    return round(score, 6)
