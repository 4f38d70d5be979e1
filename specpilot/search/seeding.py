"""Composing transformations into one candidate, and the memory's seeds and seeded candidate.

Two places put several mechanisms into one Program: the memory's seeds at the start of a compile
(mechanisms validated on alike deployments, evaluated first, together) and the round's winners
(stacked one at a time after they were evaluated alone, stacking.py). Both keep only mechanisms
that change attributes no earlier one changed, so that a composition never silently overrides a
part of another.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from specpilot.agents import ProposalSet, refusal
from specpilot.ir import Program, Transformation, diff
from specpilot.ir.errors import SpecPilotError

from .candidates import Candidate, make_candidate

MEMORY = "memory"


def changed_paths(base: Program, program: Program) -> set:
    """The attribute paths `program` changes against `base` (its history left out)."""
    return {c.path for c in diff(base, program) if not c.path.startswith("history")}


def compose(base: Program, groups: Sequence[Tuple[Transformation, ...]]
            ) -> Tuple[Program, List[Tuple[Transformation, ...]]]:
    """`base` with each group of transformations applied in order, skipping a group that the
    Program so far refuses, that changes nothing, or that changes an attribute an earlier group
    changed. Returns (the Program, the groups applied)."""
    program, applied, used = base, [], set()
    for group in groups:
        try:
            alone = make_candidate(base, group, "compose").program
            paths = changed_paths(base, alone)
            if not paths or paths & used:
                continue
            composed, reason = _apply_path(program, group)
        except SpecPilotError:      # refused part-way through the group: leave the group out
            continue
        if reason is not None:
            continue
        program = composed
        applied.append(tuple(group))
        used |= paths
    return program, applied


def _apply_path(program: Program, path: Sequence[Transformation]
                ) -> Tuple[Program, Optional[str]]:
    """(`program` with `path` applied in order, None) when every step is a runnable candidate
    of the Program the steps before it made; else (`program`, why the first step that is not
    cannot be)."""
    start = program
    for t in path:
        reason = refusal(program, t)
        if reason is not None:
            return start, f"{t}: {reason}"
        program = make_candidate(program, (t,), "check").program
    return program, None


def path_refusal(program: Program, path: Sequence[Transformation]) -> Optional[str]:
    """Why `path`, applied in order from `program`, cannot become a runnable candidate (each
    step checked on the Program the steps before it made), or None when it can."""
    return _apply_path(program, path)[1]


def memory_proposals(base: Program, memory, limit: int) -> ProposalSet:
    """The memory's seeds for a compile's first round from `base`: an alike compile's chosen
    path, whole or (refused somewhere) not at all, or else up to `limit` admitted mechanisms,
    each kept only if `base` accepts it. Refusals become notes."""
    steps, in_order = memory.seed_transformations(limit)
    seeds = ProposalSet(MEMORY, in_order=in_order)
    if in_order:
        reason = path_refusal(base, steps)
        if reason is None:
            seeds.proposals = list(steps)
        else:
            seeds.notes.append(f"an alike compile's chosen path, refused here at {reason}")
        return seeds
    for t in steps:
        reason = refusal(base, t)
        if reason is None:
            seeds.proposals.append(t)
        else:
            seeds.notes.append(f"{t}: {reason}")
    return seeds


def seeded_candidate(base: Program, proposal_sets) -> Optional[Candidate]:
    """One candidate of the memory's seeds that compose on `base`: an earlier compile's chosen
    path applied in order, whole (or not at all), or separate mechanisms, best first, each
    kept only if it composes; None when the memory offered none that applies."""
    memory = [s for s in proposal_sets if s.direction == MEMORY and s.proposals]
    if not memory:
        return None
    seeds = memory[0].proposals
    groups = [tuple(seeds)] if memory[0].in_order else [(t,) for t in seeds]
    program, applied = compose(base, groups)
    if not applied:
        return None
    return Candidate(tuple(t for group in applied for t in group), program, MEMORY)
