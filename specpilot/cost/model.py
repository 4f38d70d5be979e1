"""CostModel: a GPU spec plus a calibration; costs Programs per step, per token and per
workload, and writes CostReports.

Steady-state step of a Program at batch B and context C (`step_nodes`): its predicted time is
the calibrated sum of the nodes' roofline and overhead times; tokens per step are
B x (1 - idle) x (mean accepted + 1), idle being the share of batch rows already finished while
others still decode (padded batches). The ceiling is the best ideal time per token over the
candidate topologies (cost/topologies.py), so the gap says both how far this Program's kernels
and formats are from the hardware and how far its topology is from the best one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, List, Optional, Sequence

from specpilot.ir import BatchSpec, Program, program_id

from .acceptance import is_dynamic, program_accepted_lengths, program_mean_accepted
from .calibrate import Calibration, CalibrationPoint
from .gpu_specs import GpuSpec
from .refill_schedule import refill_steps
from .report import CATEGORIES, GAP_CATEGORIES, CostReport, NodeSummary
from .roofline import (ACCEPT_OPS, forward_cost, gap_parts, graphed_share, step_nodes,
                       summed_seconds, time_parts)
from .topologies import candidate_topologies, shaped_topologies

DEFAULT_CONTEXT = 512
REPORTED_NODES = 5


@dataclass(frozen=True)
class WorkloadPrediction:
    """Roofline and overhead seconds of a whole workload run, and their calibrated sum."""
    roofline_s: float
    overhead_s: float
    seconds: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def idle_fraction(lengths: Optional[List[List[int]]], batch: int) -> Optional[float]:
    """Share of (step, row) slots of padded batches of `batch` whose request already finished;
    requests are cycled to fill whole batches. None when per-request lengths are unknown."""
    if lengths is None:
        return None
    steps = [len(row) for row in lengths if row]
    if not steps or batch <= 1:
        return 0.0
    padded = -(-len(steps) // batch) * batch
    order = [steps[i % len(steps)] for i in range(padded)]
    busy = total = 0
    for start in range(0, padded, batch):
        group = order[start:start + batch]
        busy += sum(group)
        total += batch * max(group)
    return 1.0 - busy / total if total else 0.0


def batch_idle(program: Program, acceptance, batch: int) -> Optional[float]:
    """The idle share of batch rows for `program`: none with continuous refill (a finished
    request's slot takes the next one at once), `idle_fraction` when batches drain."""
    if getattr(program.batch, "refill", "drain") != "drain":
        return 0.0
    return idle_fraction(program_accepted_lengths(program, acceptance), batch)


def unmodelled(program: Program) -> List[str]:
    """Mechanisms of `program` the roofline does not cost (measurement decides on them)."""
    notes = []
    if program.kernels.fast_path != "ops":
        notes.append(f"the torch backend's {program.kernels.fast_path} fast path is not "
                     "modelled: its kernels are counted as the per-op path's")
    if program.kernels.attention_kernels == "generated":
        notes.append("the generated attention's gain over the model's attention is not "
                     "modelled: only its bound's launches are counted")
    if not program.draft.speculates:
        return notes        # greedy AR: nothing of a draft to estimate
    if getattr(program.verify, "prune", None) is not None:
        notes.append(f"two-level verification ({program.verify.prune}) is not modelled: costed "
                     "as if the target verified every drafted node")
    if is_dynamic(program.draft.topology):
        notes.append(f"{program.draft.topology} picks its tree every step: its acceptance is "
                     "estimated by the best static tree of its budget, depth and width")
    b = program.batch
    if b.draft_length_policy != "fixed":
        chooser = []
        if b.length_estimator != BatchSpec.length_estimator:
            chooser.append(f"its {b.length_estimator} length estimator")
        if b.length_drain != BatchSpec.length_drain:
            chooser.append(f"its {b.length_drain} drain")
        estimator = f" (whatever {' and '.join(chooser)} chooses)" if chooser else ""
        notes.append(f"draft length policy {b.draft_length_policy} is not modelled: costed as "
                     f"its fixed chain{estimator}")
    return notes


class CostModel:
    def __init__(self, gpu: GpuSpec, calibration: Calibration = Calibration()):
        self.gpu = gpu
        self.calibration = calibration

    # ------------------------------------------------------------------ steps

    def step_seconds(self, program: Program, batch: int, context: int,
                     mean_accepted: float) -> float:
        nodes = step_nodes(program, self.gpu, batch, context, mean_accepted)
        return self.calibration.predict(*summed_seconds(nodes, self.gpu))

    @property
    def ceiling_alpha(self) -> float:
        """The roofline scale of the ceiling: the calibrated one where the device beats the
        measured roofline (caches), never worse than the roofline itself."""
        return min(self.calibration.alpha, 1.0)

    def ideal_step_seconds(self, program: Program, batch: int, context: int,
                           mean_accepted: float) -> float:
        nodes = step_nodes(program, self.gpu, batch, context, mean_accepted)
        return self.ceiling_alpha * sum(n.ideal_s(self.gpu) for n in nodes)

    def predicted_tokens_per_s(self, program: Program, acceptance, batch: Optional[int] = None,
                               context: int = DEFAULT_CONTEXT) -> float:
        """Steady-state decode tokens/s of `program` (ranking candidates without a report)."""
        batch = batch or program.batch.max_batch_size
        accepted = program_mean_accepted(program, acceptance)
        idle = batch_idle(program, acceptance, batch) or 0.0
        step = self.step_seconds(program, batch, context, accepted)
        return batch * (1 - idle) * (accepted + 1) / step

    def _ceiling(self, program: Program, acceptance, batch: int, context: int,
                 topologies: Iterable):
        """(best ideal seconds per token, its draft in words) over the Program's own draft,
        greedy AR without a drafter, and the drafter model drafting each of `topologies`."""
        best, best_draft = float("inf"), program.draft.describe()
        drafts = [program.draft, replace(program.draft, drafter="none")]
        drafts += [replace(program.draft, drafter="model", topology=t) for t in topologies]
        seen = set()
        for draft in drafts:
            key = (draft.drafter, draft.topology if draft.speculates else None)
            if key in seen:
                continue
            seen.add(key)
            variant = replace(program, draft=draft)
            accepted = program_mean_accepted(variant, acceptance)
            per_token = (self.ideal_step_seconds(variant, batch, context, accepted)
                         / (batch * (accepted + 1)))
            if per_token < best:
                best, best_draft = per_token, draft.describe()
        return best, best_draft

    # ------------------------------------------------------------------ report

    def report(self, program: Program, acceptance, batch: Optional[int] = None,
               context: int = DEFAULT_CONTEXT, topologies: Optional[Sequence] = None,
               notes: Sequence[str] = ()) -> CostReport:
        """The CostReport of `program` at `batch` (default: its max batch size) and `context`,
        with `acceptance` (an acceptance model, cost/acceptance.py)."""
        gpu, cal = self.gpu, self.calibration
        batch = batch or program.batch.max_batch_size
        accepted = program_mean_accepted(program, acceptance)
        notes = list(notes) + unmodelled(program)
        idle = batch_idle(program, acceptance, batch)
        if idle is None:
            idle = 0.0
            if batch > 1:
                notes.append("batching waste unknown: the acceptance model has no per-request "
                             "lengths for this topology")
        nodes = step_nodes(program, gpu, batch, context, accepted)
        step = cal.predict(*summed_seconds(nodes, gpu))
        per_step_tokens = batch * (accepted + 1)
        useful_tokens = per_step_tokens * (1 - idle)

        breakdown = dict.fromkeys(CATEGORIES, 0.0)
        gap = dict.fromkeys(GAP_CATEGORIES, 0.0)
        for node in nodes:
            for c, s in time_parts(node, gpu, cal.alpha, cal.beta).items():
                breakdown[c] += s / useful_tokens
            for c, s in gap_parts(node, gpu, cal.alpha, cal.beta, self.ceiling_alpha).items():
                gap[c] += s / per_step_tokens
        waste = step * idle / useful_tokens if idle < 1 else 0.0
        breakdown["batching_waste"] = gap["batching_waste"] = waste

        ideal_step = self.ceiling_alpha * sum(n.ideal_s(gpu) for n in nodes)
        program_ceiling = ideal_step / per_step_tokens
        if topologies is None:
            topologies = candidate_topologies() + shaped_topologies(acceptance)
        ceiling, ceiling_topology = self._ceiling(program, acceptance, batch, context, topologies)
        gap["topology"] = max(0.0, program_ceiling - ceiling)
        dominant = max(GAP_CATEGORIES, key=lambda c: gap[c])

        def efficiency(n):
            total = cal.predict(n.roofline_s(gpu), n.overhead_s(gpu))
            return (n.bytes / gpu.memory_bandwidth) / total if total > 0 else 1.0

        heavy = [n for n in nodes if n.bytes > 0]
        heavy.sort(key=efficiency)
        summaries = [NodeSummary(n.name, n.kind, cal.predict(n.roofline_s(gpu), n.overhead_s(gpu)),
                                 n.bound(gpu), efficiency(n)) for n in heavy[:REPORTED_NODES]]
        if gpu.source == "nominal":
            notes.append(f"{gpu.name} figures are nominal, not measured: run on the device "
                         "(compile measures it) for a meaningful scale")
        return CostReport(
            program_id=program_id(program), topology=program.draft.describe(), gpu=gpu.to_json(),
            batch_size=batch, context=context, acceptance=acceptance.label,
            mean_accepted=accepted, idle_fraction=idle, step_s=step,
            tokens_per_s=useful_tokens / step if step > 0 else float("inf"),
            breakdown_per_token_s=breakdown, ceiling_tokens_per_s=1.0 / ceiling,
            ceiling_topology=str(ceiling_topology),
            program_ceiling_tokens_per_s=1.0 / program_ceiling,
            gap_per_token_s=gap, dominant=dominant, nodes=summaries,
            calibration={"alpha": cal.alpha, "beta": cal.beta, "points": len(cal.points)},
            notes=notes)

    # ------------------------------------------------------------------ workloads

    def _prefill(self, program: Program, role: str, rows: int, tokens: int):
        model = getattr(program.models, role)
        node = forward_cost(f"{role}.prefill", "prefill", model, rows, tokens, 0, self.gpu)
        return node.roofline_s(self.gpu), node.overhead_s(self.gpu)

    def predict_speculative_run(self, program: Program, acceptance,
                                prompt_lengths: Sequence[int],
                                new_tokens: Sequence[int]) -> WorkloadPrediction:
        """Seconds of decoding every prompt with `program` in batches of its max batch size
        that drain, or on that many slots it refills (`_predict_refill_run`), prefills included,
        with per-request accepted lengths from `acceptance` (which must give them: a measured
        rank profile). A Program that does not speculate is costed as greedy AR steps of its
        target (no drafter prefill or forward, one token per step)."""
        lengths = program_accepted_lengths(program, acceptance)
        if lengths is None:
            raise ValueError("a workload prediction needs per-request accepted lengths")
        if program.batch.refill == "continuous":
            return self._predict_refill_run(program, lengths, prompt_lengths, new_tokens)
        batch = program.batch.max_batch_size
        roof = over = 0.0
        for start in range(0, len(prompt_lengths), batch):
            rows = list(range(start, min(start + batch, len(prompt_lengths))))
            longest = max(prompt_lengths[r] for r in rows)
            r, o = self._prefills(program, len(rows), longest)
            steps = [lengths[r] for r in rows]
            context = longest + max(new_tokens[r] for r in rows) // 2
            sr, so = self._steps(program, steps, max(len(s) for s in steps), len(rows), context)
            roof, over = roof + r + sr, over + o + so
        return WorkloadPrediction(roof, over, self.calibration.predict(roof, over),
                                  sum(new_tokens))

    def _prefills(self, program: Program, rows: int, longest: int):
        """(roofline, overhead) seconds of prefilling `rows` prompts of up to `longest` tokens
        into each model the Program runs."""
        roof = over = 0.0
        for role in ("target", "drafter") if program.draft.speculates else ("target",):
            r, o = self._prefill(program, role, rows, longest)
            roof, over = roof + r, over + o
        return roof, over

    def _steps(self, program: Program, lengths, count: int, rows: int, context: int):
        """(roofline, overhead) seconds of `count` steps of `rows` rows at `context`, accepting
        the mean of the accepted lengths `lengths` (per request, per step)."""
        flat = [a for s in lengths for a in s]
        if not flat:                                    # no request takes a step: count is 0
            return 0.0, 0.0
        nodes = step_nodes(program, self.gpu, rows, context, sum(flat) / len(flat))
        roofline, overhead = summed_seconds(nodes, self.gpu)
        return count * roofline, count * overhead

    def _predict_refill_run(self, program: Program, lengths, prompt_lengths: Sequence[int],
                            new_tokens: Sequence[int]) -> WorkloadPrediction:
        """`predict_speculative_run` with continuous refill: the first `min(B, n)` requests are
        prefilled together and every later one alone, as it takes a finished slot; every step
        runs all the slots, for as many steps as the slot schedule needs (each request holds
        a slot for its own steps: `refill_schedule.refill_steps`), at the mean context of the
        requests (slots hold requests at every stage, not one batch's longest). A Program whose
        rounds are captured runs them in replays (runtime/graphed_refill.py): a finished slot
        is refilled a replay late and the loop runs a replay past the last request, so its
        schedule is counted in the replays the captured decoder would run."""
        from specpilot.runtime.graphed_program import captures_rounds
        from specpilot.runtime.graphed_refill import refill_rounds_per_replay

        n = len(prompt_lengths)
        # The runtime's count (SPECPILOT_REFILL_ROUNDS included), read where it is set; eager
        # rounds refill at once.
        per = refill_rounds_per_replay() if captures_rounds(program) else None
        slots = min(program.batch.max_batch_size, n)
        roof, over = self._prefills(program, slots, max(prompt_lengths[:slots]))
        for r in range(slots, n):
            pr, po = self._prefills(program, 1, prompt_lengths[r])
            roof, over = roof + pr, over + po
        context = int(sum(prompt_lengths) / n + sum(new_tokens) / n / 2)
        steps = refill_steps([len(s) for s in lengths], slots, rounds_per_replay=per)
        sr, so = self._steps(program, lengths, steps, slots, context)
        roof, over = roof + sr, over + so
        return WorkloadPrediction(roof, over, self.calibration.predict(roof, over),
                                  sum(new_tokens))

    def predict_ar_run(self, program: Program, prompt_lengths: Sequence[int],
                       new_tokens: Sequence[int], batch: int,
                       graphed: bool = False) -> WorkloadPrediction:
        """Seconds of plain greedy AR with the target of `program` over the workload (`graphed`:
        each step replayed from a CUDA graph, as the strong AR baseline runs on a GPU)."""
        share = graphed_share(self.gpu) if graphed else 1.0
        roof = over = 0.0
        target = program.models.target
        for start in range(0, len(prompt_lengths), batch):
            rows = list(range(start, min(start + batch, len(prompt_lengths))))
            longest = max(prompt_lengths[r] for r in rows)
            r, o = self._prefill(program, "target", len(rows), longest)
            roof, over = roof + r, over + o
            count = max(new_tokens[r] for r in rows) - 1
            context = longest + count // 2
            node = forward_cost("target.decode", "ar_step", target, len(rows), 1, context, self.gpu)
            roof += count * node.roofline_s(self.gpu)
            over += count * share * (node.overhead_s(self.gpu)
                                     + ACCEPT_OPS * self.gpu.launch_overhead_s)
        return WorkloadPrediction(roof, over, self.calibration.predict(roof, over),
                                  sum(new_tokens))

    # ------------------------------------------------------------------ calibration

    def calibrated(self, label: str, measured_s: float,
                   prediction: WorkloadPrediction) -> "CostModel":
        """A model refitted with one more measurement of a predicted run."""
        point = CalibrationPoint(label, measured_s, prediction.roofline_s, prediction.overhead_s)
        return CostModel(self.gpu, self.calibration.with_point(point))
