"""Stacking a round's winners greedily, one at a time, each kept only if it pays on the stack.

Every winner of a round was measured alone against the round's base. A mechanism that pays
there may not pay once another one is in place (measured on an H200: a large sparse tree gains a
third over the eager base, and loses once the rounds are captured as CUDA graphs), so the
winners are not all applied at once. From the best winner alone, each next winner in the order
of its gain is added to the stack and the stack is evaluated again; the addition stays only if
the stack is admitted and gains more than the noise beyond the stack without it.

The evaluation is passed in (`trial`), so this module decides what to try and what to keep and
the round decides how a candidate is built, evaluated and reported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from specpilot.ir import Program, Transformation

from .candidates import Candidate, Outcome
from .seeding import compose

STACKED = "combined"        # the direction of a stack's candidate, as reports show it

# (the stacked candidate, "A + B" saying which stack and which winner) -> its Outcome, or None
# when it was not evaluated (a build failure, or a Program not worth evaluating again)
Trial = Callable[[Candidate, str], Optional[Outcome]]


@dataclass
class Stack:
    """Winners applied together to the round's base: their transformation groups in the order
    they were stacked, the Program they make and its evaluation."""
    groups: List[Tuple[Transformation, ...]]
    program: Program
    outcome: Outcome

    @property
    def transformations(self) -> Tuple[Transformation, ...]:
        return tuple(t for group in self.groups for t in group)

    @property
    def label(self) -> str:
        return " + ".join(str(t) for t in self.transformations)


def ranked_winners(evaluated: Sequence[Outcome]) -> List[Outcome]:
    """The admitted outcomes, largest gain first (ties keep their evaluation order)."""
    return sorted((o for o in evaluated if o.admitted), key=lambda o: -o.gain)


def stack_winners(base: Program, ranked: Sequence[Outcome], best_program: Program,
                  trial: Trial, threshold: float) -> Stack:
    """Greedy stacking of `ranked` (admitted outcomes, best first; `best_program` is the first
    one's Program). Each next winner is composed onto the stack (`compose`: a winner that
    touches an attribute the stack already sets, or that the stack refuses, adds nothing and is
    passed over without an evaluation) and the result goes to `trial`; it is kept when that
    outcome is admitted and its gain exceeds the stack's by more than `threshold`. Returns the
    final stack (the best winner alone when nothing stacked)."""
    best = ranked[0]
    stack = Stack([tuple(best.transformations)], best_program, best)
    for winner in ranked[1:]:
        group = tuple(winner.transformations)
        program, applied = compose(base, stack.groups + [group])
        if applied != stack.groups + [group]:
            continue
        candidate = Candidate(stack.transformations + group, program, STACKED)
        outcome = trial(candidate, f"{stack.label} + {winner.label}")
        if (outcome is not None and outcome.admitted
                and outcome.gain - stack.outcome.gain > threshold):
            stack = Stack(stack.groups + [group], program, outcome)
    return stack
