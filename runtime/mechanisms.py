"""Run a Program's verification structure and batching mechanisms: the one entry point.

`run_program_decode` reads the Program's mechanisms and picks the loop:

  * stock mechanisms (a chain or tree topology, padded layout, fixed draft length, drain refill,
    no pruning): `speculative_generate` on batches of `batch.max_batch_size`, exactly as before;
  * anything else: `decode_with_mechanisms` (runtime/step_loop.py) with
      draft.topology        Chain / Tree / SparseTree → StaticProposer,
                            DynamicTree → DynamicProposer
      batch.draft_length_policy per_request_adaptive → AdaptiveChainProposer(batch.token_budget)
      verify.prune          → a TreePruner over the target's cheap path (runtime/two_level.py)
      batch.layout          padded | ragged
      batch.refill          drain | continuous

`force_program_decode` runs the same thing forced and returns the ForcingReport.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from specpilot.ir import Program
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import STATIC_TOPOLOGIES, Chain, DynamicTree, Tree

from .acceptance import AcceptedPath, greedy_accept
from .adaptive_draft import AdaptiveChainProposer
from .ar import ARResult
from .dynamic_tree import DynamicProposer
from .forcing import ForcingReport, compare_to_reference, resolve_tolerance
from .speculative import SpecResult, speculative_generate
from .step_loop import decode_with_mechanisms
from .tree_drafting import StaticProposer
from .two_level import TreePruner, cheap_verifier


def uses_mechanisms(program: Program) -> bool:
    """Whether the Program needs the mechanism loop (anything but the stock mechanisms)."""
    b = program.batch
    return (not isinstance(program.draft.topology, (Chain, Tree)) or b.layout != "padded"
            or b.draft_length_policy != "fixed" or b.refill != "drain"
            or program.verify.prune is not None)


def proposer_for(program: Program):
    """The drafter-side proposer of the Program's topology and draft length policy."""
    topo = program.draft.topology
    if program.batch.draft_length_policy == "per_request_adaptive":
        return AdaptiveChainProposer(topo, program.batch.token_budget)
    if isinstance(topo, DynamicTree):
        return DynamicProposer(topo)
    if isinstance(topo, STATIC_TOPOLOGIES):
        return StaticProposer(topo)
    raise SpecPilotError(f"draft.topology {topo}: no proposer for this topology")


def pruner_factory_for(program: Program, target) -> Optional[Callable[[int, int], TreePruner]]:
    """Builds the two-level pruner for `verify.prune` (None without pruning)."""
    prune = program.verify.prune
    if prune is None:
        return None
    cheap = cheap_verifier(target, prune)
    return lambda batch, capacity: TreePruner(cheap, prune.top_k, batch, capacity)


def run_program_decode(program: Program, target, drafter, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int, eos_ids: Sequence[int] = (), force_reference=None,
                       acceptance: Callable[..., AcceptedPath] = greedy_accept) -> SpecResult:
    """Decode `prompts` the way `program` says (see the module docstring).

    With greedy acceptance the tokens equal plain greedy AR decoding of the target. With
    `force_reference` (an ARResult of the same prompts) the run is forced and `proposals` holds
    what the candidate proposed at every reference position.
    """
    if program.verify.acceptance != "greedy":
        raise SpecPilotError(f"verify.acceptance {program.verify.acceptance!r}: only 'greedy' "
                             "is implemented")
    if drafter is None:
        raise SpecPilotError("this Program speculates: give a drafter model")
    if uses_mechanisms(program):
        return decode_with_mechanisms(
            target, drafter, prompts, max_new_tokens, proposer_for(program), eos_ids,
            layout=program.batch.layout, refill=program.batch.refill,
            max_batch_size=program.batch.max_batch_size,
            pruner_factory=pruner_factory_for(program, target), acceptance=acceptance,
            force_reference=force_reference)
    return _stock_in_batches(program, target, drafter, list(prompts), max_new_tokens, eos_ids,
                             force_reference, acceptance)


def _stock_in_batches(program, target, drafter, prompts, max_new_tokens, eos_ids,
                      force_reference, acceptance) -> SpecResult:
    size = program.batch.max_batch_size
    parts: List[SpecResult] = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start:start + size]
        ref = None
        if force_reference is not None:
            ref = ARResult(force_reference.tokens[start:start + len(chunk)],
                           list(force_reference.margins[start:start + len(chunk)]))
        parts.append(speculative_generate(target, drafter, chunk, max_new_tokens,
                                          program.draft.topology, eos_ids, acceptance=acceptance,
                                          force_reference=ref))
    steps = [n + 1 for p in parts for a in p.accepted_lengths for n in a]
    return SpecResult(tokens=[t for p in parts for t in p.tokens],
                      target_forwards=sum(p.target_forwards for p in parts),
                      drafter_forwards=sum(p.drafter_forwards for p in parts),
                      accepted_lengths=[a for p in parts for a in p.accepted_lengths],
                      mean_accepted=sum(steps) / len(steps) if steps else 0.0,
                      compactions=sum(p.compactions for p in parts),
                      proposals=[q for p in parts for q in p.proposals])


def force_program_decode(program: Program, target, drafter, prompts: Sequence[Sequence[int]],
                         reference: ARResult, tolerance: Optional[float] = None,
                         acceptance: Callable[..., AcceptedPath] = greedy_accept) -> ForcingReport:
    """Token-force the Program's mechanisms against `reference` (runtime/forcing.py): every
    reference position of every prompt is proposed once and compared."""
    tolerance = resolve_tolerance(tolerance, target.dtype)
    longest = max((len(t) for t in reference.tokens), default=0)
    forced = run_program_decode(program, target, drafter, prompts, longest,
                                force_reference=reference, acceptance=acceptance)
    return compare_to_reference(forced.proposals, reference, tolerance)
