"""`apply(program, t)`: the one place where Transformation records change a Program.

Each rule checks its preconditions with `_check(cond, reason)` and builds the new Program; a
failed precondition (including a no-op such as "already chain(4)") becomes TransformRefused
with the reason. The input must be well formed, and the result is verified too, so a rule that
misses a precondition still ends in a reasoned refusal rather than an ill-formed Program.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import replace
from typing import Callable, Dict, Iterable, Optional, Type

from .errors import IllFormed, IRError, TransformRefused
from .formats import LOSSLESS12_MAX_ESCAPE_PPM, WEIGHT_FORMATS
from .model_spec import ROLES
from .program import (ACCEPT_KERNELS, ATTENTION_KERNELS, BACKENDS, BATCH_LAYOUTS,
                      DRAFT_LENGTH_POLICIES, DRAFTER_KERNELS, DRAFTERS, FAST_PATHS,
                      LENGTH_DRAINS, LENGTH_ESTIMATORS, REFILL_POLICIES, BatchSpec, Program)
from .prune import LayerSkipPrune
from .topology import MAX_DRAFT_LENGTH, Chain, SparseTree, Tree
from .transforms import (CaptureGraphs, SetAcceptKernels, SetAttentionKernels, SetBackend, SetBatchLayout,
                         SetDrafter, SetDrafterKernels, SetDraftLength, SetDraftLengthPolicy,
                         SetFastPath, SetLengthDrain, SetLengthEstimator, SetMaxBatchSize,
                         SetRefill,
                         SetTopology, SetVerifyPrune,
                         SetWeightFormat, Transformation, TuneKernel)
from .wellformed import verify

# Largest batch a Program may be specialised for; bigger batches leave the memory-bound regime
# speculative decoding pays off in, and the KV cache is preallocated for it.
MAX_BATCH_SIZE = 256

_LAYER_PREFIX = re.compile(r"layers\.[0-9]+\.")
# Kernel node names are dotted paths `<role>.<part>...`; parameters and string values reach
# generated source, so they are identifiers.
_KERNEL_NODE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NODE_LAYER = re.compile(r"\.layers\.[0-9]+\.")


class _Refusal(Exception):
    pass


def _check(cond: bool, reason: str) -> None:
    if not cond:
        raise _Refusal(reason)


def _check_speculates(p: Program, what: str) -> None:
    # A Program that does not speculate keeps its draft attributes only to switch back; changing
    # them would give the same decoder another id.
    _check(p.draft.speculates, f"the Program does not speculate (draft.drafter 'none'): {what} "
                               "changes nothing it does; SetDrafter('model') first")


def _set_drafter(p: Program, t: SetDrafter) -> Program:
    _check(t.drafter in DRAFTERS,
           f"unknown drafter {t.drafter!r} (known: {', '.join(DRAFTERS)})")
    _check(t.drafter != p.draft.drafter, f"the drafter is already {t.drafter!r}")
    if t.drafter == "none":
        # Plain greedy AR runs padded batches (drained or refilled), with nothing to prune,
        # adapt or fuse (ir/wellformed.py): name the attribute to reset rather than reset it
        # silently.
        b = p.batch
        for ok, attribute, reset in (
                (p.verify.prune is None, f"verify.prune is {p.verify.prune}",
                 "SetVerifyPrune(None)"),
                (p.kernels.drafter_kernels == "model", f"kernels.drafter_kernels is "
                 f"{p.kernels.drafter_kernels}", "SetDrafterKernels('model')"),
                (p.kernels.accept_kernels == "ops", f"kernels.accept_kernels is "
                 f"{p.kernels.accept_kernels}", "SetAcceptKernels('ops')"),
                (b.draft_length_policy == "fixed", f"batch.draft_length_policy is "
                 f"{b.draft_length_policy}", "SetDraftLengthPolicy('fixed', 0)"),
                (b.layout == "padded", f"batch.layout is {b.layout}", "SetBatchLayout('padded')")):
            _check(ok, f"greedy AR without a drafter runs padded batches, but "
                       f"{attribute}: apply {reset} first")
    return replace(p, draft=replace(p.draft, drafter=t.drafter))


def _set_topology(p: Program, t: SetTopology) -> Program:
    topo = t.topology
    _check_speculates(p, f"the topology {topo}")
    _check(topo != p.draft.topology, f"already {topo}")
    if isinstance(topo, Tree):
        # A tree of single children is a chain: keep one spelling per decoder so equal decoders
        # share an id, and the cheaper causal mask and in-place commit.
        _check(any(b > 1 for b in topo.branching),
               f"{topo} has no branches; it is chain({topo.depth}), use that")
    if isinstance(topo, SparseTree):
        regular = topo.regular()
        _check(regular is None, f"{topo} is {regular}, use that")
    if p.batch.draft_length_policy == "per_request_adaptive":
        _check(isinstance(topo, Chain), f"the batch adapts each request's chain length "
                                        f"(per_request_adaptive); {topo} is not a chain")
    _check(isinstance(topo, Chain) or p.kernels.accept_kernels == "ops",
           f"the fused round end accepts chains; {topo} is not one (SetAcceptKernels('ops') "
           f"first)")
    if isinstance(topo, Chain):
        mask, kv = "causal", "in_place"
    else:
        mask, kv = "tree", "compact"
    return replace(p, draft=replace(p.draft, topology=topo), verify=replace(p.verify, mask=mask),
                   commit=replace(p.commit, kv=kv))


def _set_draft_length(p: Program, t: SetDraftLength) -> Program:
    topo = p.draft.topology
    _check_speculates(p, f"the draft length {t.k}")
    _check(isinstance(topo, Chain),
           f"the draft is {topo}, whose length is its depth; change it with SetTopology")
    _check(1 <= t.k <= MAX_DRAFT_LENGTH, f"draft length must be in 1..{MAX_DRAFT_LENGTH}, got {t.k}")
    _check(t.k != topo.k, f"already chain({t.k})")
    return replace(p, draft=replace(p.draft, topology=Chain(t.k)))


def scope_matches(glob: str, linear: str) -> bool:
    """Whether a SetWeightFormat glob selects `linear` (its full name or the name without the
    `layers.N.` prefix)."""
    short = _LAYER_PREFIX.sub("", linear, count=1)
    return fnmatch.fnmatchcase(linear, glob) or fnmatch.fnmatchcase(short, glob)


def _set_weight_format(p: Program, t: SetWeightFormat) -> Program:
    role, _, glob = t.scope.partition(".")
    _check(role in ROLES and glob != "",
           f"scope must be '<target|drafter>.<glob>' (e.g. 'target.mlp.*'), got {t.scope!r}")
    _check(t.fmt in WEIGHT_FORMATS,
           f"unknown weight format {t.fmt!r} (known: {', '.join(WEIGHT_FORMATS)})")
    if role == "drafter":
        _check_speculates(p, "the drafter's weight format")
    model = getattr(p.models, role)
    matched = [name for name in model.linears if scope_matches(glob, name)]
    _check(bool(matched), f"scope {t.scope!r} matches no linear of the {role} (names look like "
                          "'layers.0.self_attn.q_proj', 'mlp.down_proj', 'lm_head')")
    spec = WEIGHT_FORMATS[t.fmt]
    if spec.dense:
        _check(spec.dtype == model.dtype,
               f"{t.fmt} is a dense {spec.dtype} format but the {role} computes in {model.dtype} "
               "(a dense format must match the compute dtype)")
    else:
        _check(spec.dtype == model.dtype,
               f"{t.fmt} packs {spec.dtype} weights but the {role}'s dtype is {model.dtype}")
    changing = [name for name in matched if model.format_of(name) != t.fmt]
    _check(bool(changing), f"already {t.fmt}: all {len(matched)} linears matched by {t.scope!r}")
    if t.fmt == "lossless12":
        unknown = [name for name in changing if model.escape_ppm(name) is None]
        _check(not unknown,
               f"the lossless12 escape rate of {role}.{unknown[0] if unknown else ''} is not "
               f"measured ({len(unknown)} of {len(changing)} linears unmeasured); without it the "
               "byte saving is unknown")
        worst = max(changing, key=model.escape_ppm)
        ppm = model.escape_ppm(worst)
        _check(ppm <= LOSSLESS12_MAX_ESCAPE_PPM,
               f"{role}.{worst} escapes {ppm} ppm of its weights, above the "
               f"{LOSSLESS12_MAX_ESCAPE_PPM} ppm limit beyond which the patch list eats the "
               "25% byte saving")
    new_model = model.with_formats({name: t.fmt for name in changing})
    return replace(p, models=replace(p.models, **{role: new_model}))


def _set_batch_layout(p: Program, t: SetBatchLayout) -> Program:
    _check(t.layout in BATCH_LAYOUTS,
           f"unknown batch layout {t.layout!r} (known: {', '.join(BATCH_LAYOUTS)})")
    _check(t.layout != p.batch.layout, f"already {t.layout}")
    return replace(p, batch=replace(p.batch, layout=t.layout))


def _set_draft_length_policy(p: Program, t: SetDraftLengthPolicy) -> Program:
    _check(t.policy in DRAFT_LENGTH_POLICIES, f"unknown draft length policy {t.policy!r} "
                                              f"(known: {', '.join(DRAFT_LENGTH_POLICIES)})")
    if t.policy == "fixed":
        _check(t.token_budget == 0, f"the fixed policy takes no token budget (give 0), "
                                    f"got {t.token_budget}")
        budget = None
    else:
        _check_speculates(p, "an adaptive draft length")
        _check(isinstance(p.draft.topology, Chain),
               f"per_request_adaptive adapts a chain's length; the draft is {p.draft.topology}")
        _check(t.token_budget >= p.batch.max_batch_size,
               f"token budget {t.token_budget} is below the max batch size "
               f"{p.batch.max_batch_size}: every request verifies at least its last token")
        budget = t.token_budget
    _check((t.policy, budget) != (p.batch.draft_length_policy, p.batch.token_budget),
           f"already {t.policy}" + (f" with token budget {budget}" if budget else ""))
    # Fixed lengths estimate nothing and optimise nothing: the estimator and the drain go back
    # to their defaults with them.
    adaptive = t.policy == "per_request_adaptive"
    estimator = p.batch.length_estimator if adaptive else BatchSpec.length_estimator
    drain = p.batch.length_drain if adaptive else BatchSpec.length_drain
    return replace(p, batch=replace(p.batch, draft_length_policy=t.policy, token_budget=budget,
                                    length_estimator=estimator, length_drain=drain))


def _check_length_rule_setting(p: Program, what: str, value: str, known) -> None:
    """`value` is one of `known`, for the adaptive length's batch rule (`what`: its "estimator"
    or its "drain"), which only per_request_adaptive lengths have."""
    _check(value in known, f"unknown length {what} {value!r} (known: {', '.join(known)})")
    _check(p.batch.draft_length_policy == "per_request_adaptive",
           f"the length {what} serves per_request_adaptive lengths; the policy is "
           f"{p.batch.draft_length_policy} (apply SetDraftLengthPolicy first)")


def _set_length_estimator(p: Program, t: SetLengthEstimator) -> Program:
    _check_length_rule_setting(p, "estimator", t.estimator, LENGTH_ESTIMATORS)
    _check(t.estimator != p.batch.length_estimator, f"already the {t.estimator} estimator")
    return replace(p, batch=replace(p.batch, length_estimator=t.estimator))


def _set_length_drain(p: Program, t: SetLengthDrain) -> Program:
    _check_length_rule_setting(p, "drain", t.drain, LENGTH_DRAINS)
    _check(p.batch.refill == "continuous",
           f"the length drain is what follows a continuous refill's queue; the refill is "
           f"{p.batch.refill} (apply SetRefill first)")
    _check(t.drain != p.batch.length_drain, f"already the {t.drain} drain")
    return replace(p, batch=replace(p.batch, length_drain=t.drain))


def _set_refill(p: Program, t: SetRefill) -> Program:
    _check(t.refill in REFILL_POLICIES,
           f"unknown refill policy {t.refill!r} (known: {', '.join(REFILL_POLICIES)})")
    _check(t.refill != p.batch.refill, f"already {t.refill} refill")
    # A batch that drains from its start has no queue to follow: the drain goes back to its
    # default with it.
    drain = p.batch.length_drain if t.refill == "continuous" else BatchSpec.length_drain
    return replace(p, batch=replace(p.batch, refill=t.refill, length_drain=drain))


def _set_verify_prune(p: Program, t: SetVerifyPrune) -> Program:
    _check(t.prune != p.verify.prune,
           "verification is already unpruned" if t.prune is None else f"already {t.prune}")
    if t.prune is not None:
        _check_speculates(p, f"pruning the draft ({t.prune})")
    if isinstance(t.prune, LayerSkipPrune):
        layers = p.models.target.num_layers
        _check(t.prune.keep_layers[-1] < layers,
               f"layer {t.prune.keep_layers[-1]} does not exist (the target has {layers} layers)")
        _check(len(t.prune.keep_layers) < layers,
               "keeps every layer of the target: no cheaper than the full verification")
    return replace(p, verify=replace(p.verify, prune=t.prune))


def _set_max_batch_size(p: Program, t: SetMaxBatchSize) -> Program:
    n = t.max_batch_size
    _check(1 <= n <= MAX_BATCH_SIZE, f"max batch size must be in 1..{MAX_BATCH_SIZE}, got {n}")
    _check(n != p.batch.max_batch_size, f"already max batch size {n}")
    return replace(p, batch=replace(p.batch, max_batch_size=n))


def _set_backend(p: Program, t: SetBackend) -> Program:
    _check(t.backend in BACKENDS, f"unknown backend {t.backend!r} (known: {', '.join(BACKENDS)})")
    _check(t.backend != p.kernels.backend, f"already backend {t.backend}")
    _check(t.backend == "torch" or p.kernels.fast_path == "ops",
           f"the {t.backend} backend runs its own kernels, not the torch backend's fast path "
           f"{p.kernels.fast_path!r} (SetFastPath('ops') first)")
    _check(t.backend == "torch" or p.kernels.drafter_kernels == "model",
           f"the {t.backend} backend runs its own kernels, not the fused drafter kernels, which "
           f"read the torch backend's dense weights (SetDrafterKernels('model') first)")
    _check(t.backend == "torch" or p.kernels.attention_kernels == "model",
           f"the {t.backend} backend runs its own kernels, not the torch backend's generated "
           f"attention (SetAttentionKernels('model') first)")
    return replace(p, kernels=replace(p.kernels, backend=t.backend))


def _set_fast_path(p: Program, t: SetFastPath) -> Program:
    _check(t.fast_path in FAST_PATHS,
           f"unknown fast path {t.fast_path!r} (known: {', '.join(FAST_PATHS)})")
    _check(t.fast_path != p.kernels.fast_path, f"already fast path {t.fast_path}")
    _check(p.kernels.backend == "torch" or t.fast_path == "ops",
           f"the fast path is the torch backend's; this Program runs the {p.kernels.backend} "
           f"backend's own kernels (SetBackend('torch') first)")
    return replace(p, kernels=replace(p.kernels, fast_path=t.fast_path))


def _set_drafter_kernels(p: Program, t: SetDrafterKernels) -> Program:
    _check(t.kernels in DRAFTER_KERNELS,
           f"unknown drafter kernels {t.kernels!r} (known: {', '.join(DRAFTER_KERNELS)})")
    _check(t.kernels != p.kernels.drafter_kernels, f"already drafter kernels {t.kernels}")
    if t.kernels != "model":
        _check_speculates(p, f"the drafter kernels {t.kernels!r}")
        _check(p.kernels.backend == "torch",
               f"the fused drafter kernels read the torch backend's dense weights; this Program "
               f"runs the {p.kernels.backend} backend's own kernels (SetBackend('torch') first)")
    return replace(p, kernels=replace(p.kernels, drafter_kernels=t.kernels))


def _set_attention_kernels(p: Program, t: SetAttentionKernels) -> Program:
    _check(t.kernels in ATTENTION_KERNELS,
           f"unknown attention kernels {t.kernels!r} (known: {', '.join(ATTENTION_KERNELS)})")
    _check(t.kernels != p.kernels.attention_kernels, f"already attention kernels {t.kernels}")
    if t.kernels != "model":
        _check(p.kernels.backend == "torch",
               f"the generated attention replaces the torch backend's; this Program runs the "
               f"{p.kernels.backend} backend's own kernels (SetBackend('torch') first)")
    return replace(p, kernels=replace(p.kernels, attention_kernels=t.kernels))


def _set_accept_kernels(p: Program, t: SetAcceptKernels) -> Program:
    _check(t.kernels in ACCEPT_KERNELS,
           f"unknown accept kernels {t.kernels!r} (known: {', '.join(ACCEPT_KERNELS)})")
    _check(t.kernels != p.kernels.accept_kernels, f"already accept kernels {t.kernels}")
    if t.kernels != "ops":
        _check_speculates(p, f"the accept kernels {t.kernels!r}")
        _check(isinstance(p.draft.topology, Chain),
               f"the fused round end accepts chains; {p.draft.topology} is not one")
    return replace(p, kernels=replace(p.kernels, accept_kernels=t.kernels))


def _capture_graphs(p: Program, t: CaptureGraphs) -> Program:
    _check(t.on != p.kernels.capture_graphs, f"graph capture already {'on' if t.on else 'off'}")
    return replace(p, kernels=replace(p.kernels, capture_graphs=t.on))


def _tune_kernel(p: Program, t: TuneKernel) -> Program:
    _check(bool(_KERNEL_NODE.match(t.node)),
           f"node must be a dotted kernel node name such as 'target.layers.0.mlp.down_proj' or, "
           f"for every layer, 'target.mlp.down_proj'; got {t.node!r}")
    _check(bool(_IDENTIFIER.match(t.param)),
           f"param must be a kernel parameter name (an identifier such as BLOCK_N), got {t.param!r}")
    if isinstance(t.value, str):
        _check(bool(_IDENTIFIER.match(t.value)),
               f"a string value must be an identifier (it reaches generated source), got {t.value!r}")
    overrides = {node: dict(params) for node, params in p.kernels.overrides}
    mine = overrides.get(t.node, {})
    _check(not (t.param in mine and type(mine[t.param]) is type(t.value)
                and mine[t.param] == t.value),
           f"already {t.param}={t.value!r} for {t.node}")
    every_layer = _NODE_LAYER.sub(".", t.node, count=1)
    if every_layer != t.node and t.param not in mine:
        shared = overrides.get(every_layer, {})
        _check(not (t.param in shared and type(shared[t.param]) is type(t.value)
                    and shared[t.param] == t.value),
               f"{every_layer} already sets {t.param}={t.value!r} for every layer")
    overrides[t.node] = {**mine, t.param: t.value}
    return replace(p, kernels=replace(p.kernels, overrides=tuple(
        (node, tuple(params.items())) for node, params in overrides.items())))


RULES: Dict[Type[Transformation], Callable[[Program, Transformation], Program]] = {
    SetDrafter: _set_drafter,
    SetTopology: _set_topology,
    SetDraftLength: _set_draft_length,
    SetWeightFormat: _set_weight_format,
    SetBatchLayout: _set_batch_layout,
    SetDraftLengthPolicy: _set_draft_length_policy,
    SetRefill: _set_refill,
    SetLengthEstimator: _set_length_estimator,
    SetLengthDrain: _set_length_drain,
    SetVerifyPrune: _set_verify_prune,
    SetMaxBatchSize: _set_max_batch_size,
    SetBackend: _set_backend,
    CaptureGraphs: _capture_graphs,
    SetFastPath: _set_fast_path,
    SetDrafterKernels: _set_drafter_kernels,
    SetAttentionKernels: _set_attention_kernels,
    SetAcceptKernels: _set_accept_kernels,
    TuneKernel: _tune_kernel,
}


def apply(program: Program, t: Transformation) -> Program:
    """Return `program` transformed by `t`, with `t` appended to its history, verified.

    Raises TransformRefused(t.name, reason) when a precondition fails (a no-op included), and
    IllFormed when `program` itself is not well formed.
    """
    verify(program)
    rule = RULES.get(type(t))
    if rule is None:
        raise IRError(f"no rule applies {t!r}: not a registered Transformation")
    try:
        result = rule(program, t)
    except _Refusal as refusal:
        raise TransformRefused(t.name, str(refusal)) from None
    result = replace(result, history=program.history + (t,))
    try:
        return verify(result)
    except IllFormed as exc:
        raise TransformRefused(t.name, f"the result would be ill-formed: {exc}") from None


def check(program: Program, t: Transformation) -> Optional[str]:
    """The reason `apply(program, t)` would refuse, or None when it applies."""
    try:
        apply(program, t)
    except TransformRefused as refusal:
        return refusal.reason
    return None


def record_escape_rates(program: Program, role: str, rates: Dict[str, int]) -> Program:
    """`program` with measured lossless12 escape rates (ppm per linear) recorded for one model.

    A measurement of the checkpoint, not a change of the decoder's behaviour, so it is not a
    Transformation and leaves history alone; it does change the id (the id covers every attribute
    but history). Raises IllFormed for a linear the model lacks or a rate outside 0..1e6.
    """
    if role not in ROLES:
        raise IllFormed(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    model = getattr(program.models, role).with_escape_rates(rates)
    return verify(replace(program, models=replace(program.models, **{role: model})))


def replay(program: Program, transformations: Iterable[Transformation]) -> Program:
    """Apply transformations in order (e.g. a Program's history onto its stock Program)."""
    for t in transformations:
        program = apply(program, t)
    return program
