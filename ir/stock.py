"""`stock_program(deployment)`: the plain speculative decoder every search starts from."""
from __future__ import annotations

from dataclasses import replace

from .errors import IllFormed
from .formats import DENSE_FORMAT_FOR_DTYPE
from .model_spec import ModelSpec, dense_weight_formats
from .program import (BatchSpec, CommitSpec, Deployment, DraftSpec, KernelsSpec, Models, Program,
                      VerifySpec)
from .topology import Chain
from .wellformed import verify

# A chain of 4 is the usual starting point of model-drafter speculation: long enough to gain on
# a well-matched pair, short enough that a poor drafter wastes little verification work.
STOCK_DRAFT_LENGTH = 4


def _dense(m: ModelSpec, path: str) -> ModelSpec:
    if m.dtype not in DENSE_FORMAT_FOR_DTYPE:
        raise IllFormed(f"{path}.dtype: expected one of {', '.join(DENSE_FORMAT_FOR_DTYPE)}, "
                        f"got {m.dtype!r}")
    return replace(m, weight_formats=dense_weight_formats(m.num_layers, m.dtype))


def stock_program(deployment: Deployment) -> Program:
    """The stock Program of a deployment: chain(4) drafting by the drafter model, causal mask,
    greedy acceptance, in-place KV commit, padded batch of 1, every linear dense in its model's
    dtype, torch kernels without graph capture, empty history. Verified before it is returned."""
    program = Program(
        gpu=deployment.gpu,
        models=Models(target=_dense(deployment.target, "deployment.target"),
                      drafter=_dense(deployment.drafter, "deployment.drafter")),
        draft=DraftSpec(drafter="model", topology=Chain(STOCK_DRAFT_LENGTH)),
        verify=VerifySpec(mask="causal", acceptance="greedy"),
        commit=CommitSpec(kv="in_place"),
        batch=BatchSpec(layout="padded", max_batch_size=1, draft_length_policy="fixed"),
        kernels=KernelsSpec(backend="torch", capture_graphs=False, overrides=()),
        history=(),
    )
    return verify(program)
