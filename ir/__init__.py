"""The SpecPilot IR: the Program, its canonical JSON and id, verification, diff, transformations.

Imports nothing from the rest of SpecPilot. `dataflow_graph` (networkx) is loaded on first use.
"""
from .apply_rules import (MAX_BATCH_SIZE, apply, check, record_escape_rates, replay,
                          scope_matches)
from .canonical import (PROGRAM_FILE, canonical_json, load_program, program_from_json,
                        program_from_obj, program_id, program_to_json, program_to_obj,
                        resolve_program_path, save_program)
from .errors import IllFormed, IRError, SpecPilotError, TransformRefused
from .formats import (DENSE_FORMAT_FOR_DTYPE, DTYPE_BYTES, DTYPES, LOSSLESS12_MAX_ESCAPE_PPM,
                      WEIGHT_FORMATS, WeightFormat, may_change_output, weight_bytes)
from .model_spec import FAMILIES, LAYER_KINDS, ROLES, ModelSpec, dense_weight_formats, linear_names
from .program import (ACCEPT_KERNELS, ATTENTION_KERNELS, DRAFT_LENGTH_POLICIES, DRAFTER_KERNELS,
                      DRAFTERS, FAST_PATHS, LENGTH_DRAINS, LENGTH_ESTIMATORS, REFILL_POLICIES,
                      SCHEMA_VERSION, BatchSpec, CommitSpec, Deployment, DraftSpec, KernelsSpec,
                      Models, Program, VerifySpec)
from .prune import LayerSkipPrune, LowPrecisionPrune, Prune, prune_from_json
from .program_diff import Change, diff, format_diff
from .stock import STOCK_DRAFT_LENGTH, stock_program
from .topology import (Chain, DynamicTree, SparseTree, Topology, Tree, TreeShape,
                       topology_from_json)
from .transforms import (TRANSFORMATIONS, CaptureGraphs, SetAcceptKernels, SetAttentionKernels,
                         SetBackend, SetBatchLayout, SetDrafter, SetDrafterKernels, SetDraftLength,
                         SetDraftLengthPolicy, SetFastPath, SetLengthDrain, SetLengthEstimator,
                         SetMaxBatchSize,
                         SetRefill, SetTopology, SetVerifyPrune, SetWeightFormat, Transformation,
                         TuneKernel, transformation_from_json, transformation_from_obj,
                         transformation_to_json, transformation_to_obj)
from .wellformed import verify

_LAZY = ("dataflow_graph", "linear_weight_bytes", "total_weight_bytes")


def __getattr__(name):
    # networkx is only needed by the graph view; keep `import specpilot.ir` light without it.
    if name in _LAZY:
        from . import graph
        return getattr(graph, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MAX_BATCH_SIZE", "apply", "check", "record_escape_rates", "replay", "scope_matches",
    "PROGRAM_FILE", "canonical_json", "load_program", "program_from_json", "program_from_obj",
    "program_id", "program_to_json", "program_to_obj", "resolve_program_path", "save_program",
    "IllFormed", "IRError", "SpecPilotError", "TransformRefused",
    "DENSE_FORMAT_FOR_DTYPE", "DTYPE_BYTES", "DTYPES", "LOSSLESS12_MAX_ESCAPE_PPM",
    "WEIGHT_FORMATS", "WeightFormat", "may_change_output", "weight_bytes",
    "FAMILIES", "LAYER_KINDS", "ROLES", "ModelSpec", "dense_weight_formats", "linear_names",
    "ACCEPT_KERNELS", "ATTENTION_KERNELS", "DRAFT_LENGTH_POLICIES", "DRAFTER_KERNELS", "DRAFTERS",
    "FAST_PATHS",
    "LENGTH_DRAINS", "LENGTH_ESTIMATORS", "REFILL_POLICIES", "SCHEMA_VERSION", "BatchSpec",
    "CommitSpec",
    "Deployment", "DraftSpec", "KernelsSpec", "Models", "Program", "VerifySpec",
    "LayerSkipPrune", "LowPrecisionPrune", "Prune", "prune_from_json",
    "Change", "diff", "format_diff",
    "STOCK_DRAFT_LENGTH", "stock_program",
    "Chain", "DynamicTree", "SparseTree", "Topology", "Tree", "TreeShape", "topology_from_json",
    "TRANSFORMATIONS", "CaptureGraphs", "SetAcceptKernels", "SetAttentionKernels", "SetBackend",
    "SetBatchLayout",
    "SetDrafter", "SetDrafterKernels", "SetDraftLength", "SetDraftLengthPolicy", "SetFastPath",
    "SetLengthDrain", "SetLengthEstimator", "SetMaxBatchSize", "SetRefill", "SetTopology",
    "SetVerifyPrune", "SetWeightFormat", "Transformation", "TuneKernel",
    "transformation_from_json", "transformation_from_obj", "transformation_to_json",
    "transformation_to_obj",
    "verify",
    *_LAZY,
]
