"""How many candidate evaluations a compile spent, and how many until it first reached its best
Program: the measure of what the memory saves.

A candidate evaluation is one candidate token-forced (and, when forcing passes, timed); its
outcome stops at one of `EVALUATED_STAGES`. Proposals refused before evaluation, lowering and
build failures and the timing of each round's base are not evaluations. The counts are read from
the rounds' records (report.json), so a resumed compile counts exactly the rounds it completed,
the same as one that was never interrupted (a round cut short by a kill is run again and counted
once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

EVALUATED_STAGES = ("forcing", "output", "admitted", "not_admitted")


def round_evaluations(record: dict) -> int:
    """Candidate evaluations of one round's record (its outcomes)."""
    return sum(1 for o in record.get("outcomes") or [] if o.get("stage") in EVALUATED_STAGES)


@dataclass(frozen=True)
class EvaluationCount:
    to_best: int          # evaluations up to the end of the round that first chose the best
    total: int            # evaluations of every completed round
    best_round: int       # the first round whose Program is the best (0: the stock Program)

    def to_json(self) -> dict:
        return {"evaluations_to_best": self.to_best, "evaluations": self.total,
                "best_first_reached_round": self.best_round}

    def summary(self) -> str:
        return f"best reached after {self.to_best} candidate evaluations, of {self.total}"


def count_evaluations(records: Sequence[dict]) -> EvaluationCount:
    """Counts over the records of a compile's completed rounds, in round order (round 0 first).
    The best Program is the last round's (a round keeps its base unless it admits something
    faster); it is reached when a round first chooses it, after all that round's evaluations
    (the round cannot choose before it has evaluated its candidates)."""
    if not records:
        return EvaluationCount(0, 0, 0)
    best_id = records[-1]["program_id"]
    first = next(r for r in records if r["program_id"] == best_id)
    per_round = [(r["round"], round_evaluations(r)) for r in records]
    return EvaluationCount(sum(n for k, n in per_round if k <= first["round"]),
                           sum(n for _, n in per_round), first["round"])
