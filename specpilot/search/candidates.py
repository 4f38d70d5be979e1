"""Candidates of a round: proposals turned into Programs, lowered and built in parallel.

Lowering (Program -> KernelPlan) is pure Python and runs in a thread pool. Kernels are built only
for Programs that run generated kernels, in a pool of processes (nvcc and Triton compile work
outside the interpreter lock), into the run's content-addressed kernel cache, so the evaluation
that follows finds them built. A Program that fails either step becomes a recorded failure.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from specpilot.ir import Program, Transformation, apply, program_id
from specpilot.ir.errors import SpecPilotError


@dataclass
class Candidate:
    """A Program to evaluate: the round's base with `transformations` applied in order."""
    transformations: Tuple[Transformation, ...]
    program: Program
    direction: str
    plan: object = None                   # KernelPlan, once lowered
    notes: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " + ".join(str(t) for t in self.transformations)

    @property
    def id(self) -> str:
        return program_id(self.program)


@dataclass
class Outcome:
    """What became of one proposal or candidate. `stage` is where it stopped: proposal,
    lowering, build, forcing, output, admitted, not_admitted."""
    label: str
    direction: str
    stage: str
    reason: Optional[str] = None
    program_id: Optional[str] = None
    forcing: Optional[dict] = None
    timing: Optional[dict] = None
    output: Optional[dict] = None         # OutputCheck.to_json() of the unforced run
    gain: Optional[float] = None
    predicted_tokens_per_s: Optional[float] = None
    prediction_error: Optional[float] = None
    transformations: Tuple[Transformation, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.stage == "admitted"

    @property
    def tokens_per_s(self) -> Optional[float]:
        return self.timing["median_tokens_per_s"] if self.timing else None

    def to_json(self) -> dict:
        from specpilot.ir import transformation_to_obj
        return {"label": self.label, "direction": self.direction, "stage": self.stage,
                "admitted": self.admitted, "reason": self.reason, "program_id": self.program_id,
                "forcing": self.forcing, "timing": self.timing, "output": self.output,
                "gain": self.gain,
                "predicted_tokens_per_s": self.predicted_tokens_per_s,
                "prediction_error": self.prediction_error,
                "transformations": [transformation_to_obj(t) for t in self.transformations]}


def make_candidate(base: Program, transformations: Sequence[Transformation],
                   direction: str) -> Candidate:
    program = base
    for t in transformations:
        program = apply(program, t)
    return Candidate(tuple(transformations), program, direction)


def _lower(candidate: Candidate) -> Optional[str]:
    from specpilot.codegen.lower import lower_program
    try:
        candidate.plan = lower_program(candidate.program)
    except SpecPilotError as exc:
        if candidate.program.kernels.backend == "generated":
            return str(exc)
        candidate.notes.append(f"lowering (not needed by the torch backend) failed: {exc}")
    return None


def _build_worker(plan_json: str, cache_dir: str) -> List[str]:
    """Build every kernel of a plan into `cache_dir`; the failures' messages (process pool)."""
    from specpilot.codegen.cache import KernelCache
    from specpilot.codegen.plan import build_plan, plan_from_json

    built = build_plan(plan_from_json(plan_json), KernelCache(cache_dir))
    return [str(e) for e in built.errors]


def prepare(candidates: Sequence[Candidate], cache_dir: str,
            workers: int) -> Tuple[List[Candidate], List[Outcome]]:
    """Lower every candidate and build the kernels of those that run generated kernels.
    Returns (ready candidates, in the given order; failures)."""
    failures: List[Outcome] = []
    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        errors = list(pool.map(_lower, candidates))
    lowered = []
    for candidate, error in zip(candidates, errors):
        if error is None:
            lowered.append(candidate)
        else:
            failures.append(Outcome(candidate.label, candidate.direction, "lowering", error,
                                    candidate.id, transformations=candidate.transformations))
    to_build = [c for c in lowered if c.program.kernels.backend == "generated"]
    if not to_build:
        return lowered, failures
    from specpilot.codegen.plan import plan_to_json

    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=max(1, workers), mp_context=context) as pool:
        futures = {id(c): pool.submit(_build_worker, plan_to_json(c.plan), cache_dir)
                   for c in to_build}
        build_errors = {}
        for c in to_build:
            try:
                build_errors[id(c)] = futures[id(c)].result()
            except Exception as exc:   # a crashed worker is this candidate's failure
                build_errors[id(c)] = [f"build worker failed: {type(exc).__name__}: {exc}"]
    ready = []
    for c in lowered:
        problems = build_errors.get(id(c), [])
        if problems:
            failures.append(Outcome(c.label, c.direction, "build", "; ".join(problems)[:2000],
                                    c.id, transformations=c.transformations))
        else:
            ready.append(c)
    return ready, failures
