"""What every agent shares: the propose interface, the budget, and the legality filter.

An agent is a preference, never a judge of legality (STYLE.md, lesson 3): it may only propose
Transformation records; whether one applies is `ir.check`'s answer, whether the runtime can run
the result is `runtime.decoder.check_runnable`'s, and whether it is lossless is token forcing's.
`refusal` asks the first two so that agents spend their budget on candidates that can run.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple

from specpilot.ir import Program, Transformation, apply, check
from specpilot.ir.errors import SpecPilotError


@dataclass(frozen=True)
class Budget:
    """How many proposals an agent may make this round (its share of the round's candidates)."""
    max_proposals: int


@dataclass(frozen=True)
class Refusal:
    """A proposal that was turned down before it became a candidate, and why."""
    proposal: str
    reason: str


def refusal(program: Program, t: Transformation) -> Optional[str]:
    """Why `t` cannot become a runnable candidate of `program`, or None when it can."""
    reason = check(program, t)
    if reason is not None:
        return reason
    from specpilot.runtime.decoder import check_runnable

    try:
        check_runnable(apply(program, t))
    except SpecPilotError as exc:
        return f"the runtime cannot run the result: {exc}"
    return None


class Agent(ABC):
    """Base of the agents. `direction` names what it changes; `categories` are the gap
    categories (cost/report.py) it addresses, used to rank directions. After `propose`,
    `notes` says what it considered and left out, `refusals` what it turned down and why."""
    direction = ""
    categories: Tuple[str, ...] = ()

    def __init__(self):
        self.notes: List[str] = []
        self.refusals: List[Refusal] = []

    @abstractmethod
    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        """Legal transformations worth trying on `program`, at most `budget.max_proposals`."""

    def _reset(self) -> None:
        self.notes, self.refusals = [], []

    def _legal(self, program: Program, proposals: Iterable[Transformation],
               memory=None) -> List[Transformation]:
        """The proposals that can run, deduplicated, without those memory knows failed forcing
        on this deployment; the others go to `refusals`."""
        out, seen = [], set()
        for t in proposals:
            if t in seen:
                continue
            seen.add(t)
            if memory is not None and memory.failed_forcing(t):
                self.refusals.append(Refusal(str(t), "memory: failed token forcing on this "
                                                     "deployment before"))
                continue
            reason = refusal(program, t)
            if reason is None:
                out.append(t)
            else:
                self.refusals.append(Refusal(str(t), reason))
        return out


def rank_by_prediction(program: Program, proposals: Sequence[Transformation], cost_model,
                       acceptance, batch: int,
                       min_gain: float = 0.0) -> List[Tuple[float, Transformation]]:
    """(predicted relative gain, t) for each proposal the cost model can cost, best first; those
    predicted to gain no more than `min_gain` are dropped."""
    base = cost_model.predicted_tokens_per_s(program, acceptance, batch)
    scored = []
    for t in proposals:
        try:
            tps = cost_model.predicted_tokens_per_s(apply(program, t), acceptance, batch)
        except SpecPilotError:
            continue
        gain = tps / base - 1.0
        if gain > min_gain:
            scored.append((gain, t))
    scored.sort(key=lambda pair: -pair[0])
    return scored


@dataclass
class ProposalSet:
    """Everything one agent returned in a round (kept for the round report)."""
    direction: str
    proposals: List[Transformation] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    refusals: List[Refusal] = field(default_factory=list)
    error: Optional[str] = None
    # The proposals are one path, applied in order (a Program's history), not alternatives.
    in_order: bool = False
