"""Batching agent: the batch layout, how finished slots are refilled, the draft-length policy,
and whether to speculate at all, as far as the IR names them and the runtime executes them.
Layout, refill and length policy only matter to a batch of more than one request; speculation
on or off matters at any batch size.

Speculation off (SetDrafter("none")) is offered to every Program that speculates: a large batch
turns the target's verification compute-bound, where every rejected draft costs as much as an
accepted one, and at any batch size a drafter that is rarely right, or rounds that cost more
than the roofline sees (the eager runtime on a CPU measured 994 tokens/s of greedy AR against
855 of the best speculative Program on the tiny pair), make greedy AR the fastest decoder.
Whether it is, is one cheap evaluation to measure; the cost model only ranks it among the
others. A Program that does not speculate is offered its drafter again, and the other refill
policy (greedy AR drains its batches or refills their slots); its layout and draft length stay
at their defaults (ir/wellformed.py). A graphed Program with adaptive lengths is offered the
other estimate of what a chain commits (SetLengthEstimator: one acceptance per request, or one
per request and draft depth), and, with continuous refill, the other objective once the queue is
empty (SetLengthDrain: the drain's makespan, or the time per token as while refilling)."""
from __future__ import annotations

from typing import List, Optional

from specpilot.ir import (Chain, Program, SetBatchLayout, SetDrafter, SetDraftLengthPolicy,
                          SetLengthDrain, SetLengthEstimator, SetRefill, Transformation)
from specpilot.ir import program as ir_program

from .base import Agent, Budget, rank_by_prediction


def ridge_budget(program: Program, context: int = 512) -> Optional[int]:
    """Tokens per verification forward at which the target turns compute-bound on the
    Program's GPU (runtime.adaptive_draft.ridge_token_budget over the roofline's byte and FLOP
    counts, the batch's KV cache at `context` included); None for an unknown GPU or a CPU."""
    from specpilot.cost.gpu_specs import UnknownGpu, gpu_spec
    from specpilot.cost.roofline import _linear_params, _weight_bytes, kv_row_bytes
    from specpilot.runtime.adaptive_draft import ridge_token_budget

    if program.gpu == "cpu":
        return None
    try:
        gpu = gpu_spec(program.gpu)
    except UnknownGpu:
        return None
    t, batch = program.models.target, program.batch.max_batch_size
    weights = sum(_weight_bytes(t, n) for n in t.linears)
    kv = t.num_layers * batch * context * kv_row_bytes(t)
    return ridge_token_budget(gpu.flops_for(t.dtype), gpu.memory_bandwidth, weights,
                              2.0 * _linear_params(t, t.linears), kv, batch)


def ridge_capped_budget(batch: int, k: int, ridge: Optional[int]) -> int:
    """A batch's token budget at the target's compute `ridge` (None: unknown, no cap), between
    one token per request and a full chain(k) each."""
    full = batch * (k + 1)
    return full if ridge is None else min(full, max(batch, ridge))


def _policy_records(program: Program) -> List[Transformation]:
    """Per-request adaptive chain lengths with a few token budgets: as many verified tokens per
    step as the fixed chain verifies, half of that (adaptive lengths spend it where acceptance
    is high), where the target turns compute-bound on this GPU (the ridge), and one token per
    request (speculation off: what a batch deep in the compute-bound regime should do); and, where
    adaptive lengths run in graphed rounds, the rule's other length estimator."""
    from specpilot.runtime.graphed_program import captures_rounds

    topology = program.draft.topology
    batch = program.batch.max_batch_size
    out: List[Transformation] = []
    if program.batch.draft_length_policy != "fixed":
        out.append(SetDraftLengthPolicy("fixed", 0))
    if isinstance(topology, Chain):
        full = batch * (topology.k + 1)
        # An unknown ridge caps nothing: its budget is `full`, already there.
        budgets = {full, max(batch, full // 2), batch,
                   ridge_capped_budget(batch, topology.k, ridge_budget(program))}
        for budget in sorted(budgets, reverse=True):
            out.append(SetDraftLengthPolicy("per_request_adaptive", budget))
    if program.batch.draft_length_policy == "per_request_adaptive" and captures_rounds(program):
        # The other estimate of what a chain commits: the graphed rule's choice
        # (runtime/depth_acceptance.py); which is faster depends on the drafts' runs and the
        # rounds' prices, so it is measured. The eager loop's lengths do not read it.
        out += [SetLengthEstimator(e) for e in ir_program.LENGTH_ESTIMATORS
                if e != program.batch.length_estimator]
        if program.batch.refill == "continuous":
            # What the rule optimises once nobody waits for a slot: replayed on measured
            # calls, neither drain won everywhere (runtime/batch_length.py), so it is measured.
            out += [SetLengthDrain(d) for d in ir_program.LENGTH_DRAINS
                    if d != program.batch.length_drain]
    return out


class BatchingAgent(Agent):
    direction = "batching"
    categories = ("batching_waste",)

    def __init__(self, cost_model=None, acceptance=None):
        super().__init__()
        self.cost_model, self.acceptance = cost_model, acceptance

    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        self._reset()
        speculates = program.draft.speculates
        proposals: List[Transformation] = [] if speculates else [SetDrafter("model")]
        if program.batch.max_batch_size <= 1:
            self.notes.append("batch size 1: no batch layout, refill or draft-length policy "
                              "applies")
        else:
            proposals += [SetBatchLayout(layout) for layout in ir_program.BATCH_LAYOUTS
                          if layout != program.batch.layout]
            proposals += [SetRefill(refill) for refill in ir_program.REFILL_POLICIES
                          if refill != program.batch.refill]
            proposals += _policy_records(program)
        if speculates:
            proposals.append(SetDrafter("none"))
        legal = self._legal(program, proposals, memory)
        if not legal:
            self.notes.append("the runtime executes no other batch layout, refill or "
                              "draft-length policy for this Program")
            return []
        if self.cost_model is not None:
            # The roofline sees refill (idle slots) and speculation on/off but not layout or
            # adaptive lengths: those keep their order after the ones it predicts a gain for.
            ranked = rank_by_prediction(program, legal, self.cost_model, self.acceptance,
                                        program.batch.max_batch_size, min_gain=-1.0)
            order = [t for _, t in ranked]
            legal = order + [t for t in legal if t not in order]
        kept = legal[:budget.max_proposals]
        off = SetDrafter("none")
        if off in legal and off not in kept and kept:
            # The roofline's step times are what speculation off is measured against, so a
            # predicted loss is no reason to leave out its one evaluation: it takes the last slot.
            kept[-1] = off
        return kept
