"""Run a Program's verification structure and batching mechanisms: the one entry point.

`run_program_decode` reads the Program's mechanisms and picks the loop:

  * no speculation (`draft.drafter` "none"): greedy AR of the target (`generate_ar`) on batches
    of `batch.max_batch_size`; forced, the same steps fed the reference (`force_ar_proposals`);
    with `batch.refill` "continuous", the refill loop of runtime/graphed_refill.py with chains
    of 0 and its rounds run eagerly (`_ar_with_refill`), `batch.max_batch_size` slots at a time;
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

import torch

from specpilot.ir import Program
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import STATIC_TOPOLOGIES, Chain, DynamicTree, Tree

from .acceptance import AcceptedPath, greedy_accept
from .adaptive_draft import AdaptiveChainProposer
from .ar import ARResult, generate_ar
from .dynamic_tree import DynamicProposer
from .forcing import ForcingReport, compare_to_reference, resolve_tolerance
from .graphed_loop import ar_stats
from .graphed_refill import GraphedRefillDecoder
from .speculative import SpecResult, speculative_generate
from .step_loop import decode_with_mechanisms
from .steps import append_step, check_capacity
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
    if not program.draft.speculates:
        if program.batch.refill == "continuous":
            return _ar_with_refill(program.batch.max_batch_size, target, list(prompts),
                                   max_new_tokens, eos_ids, force_reference)
        return _ar_in_batches(program.batch.max_batch_size, target, list(prompts),
                              max_new_tokens, eos_ids, force_reference)
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


@torch.no_grad()
def force_ar_proposals(target, prompts: Sequence[Sequence[int]],
                       reference: Sequence[Sequence[int]]) -> List[List[int]]:
    """Greedy AR of `target` (the `generate_ar` steps) fed the reference token at every step:
    the target's own argmax at each reference position (token forcing of plain AR)."""
    longest = max(len(t) for t in reference)
    cache = target.new_cache(len(prompts), check_capacity(target, prompts, longest, slack=1))
    lengths = torch.zeros(len(prompts), dtype=torch.int64, device=target.device)
    logits = append_step(target, cache, lengths, [list(p) for p in prompts])
    lengths += torch.tensor([len(p) for p in prompts], device=target.device)
    proposals = [torch.argmax(logits, dim=-1)]
    for j in range(1, longest):
        # A request whose reference ended is fed a pad; what it proposes there is cut off.
        logits = append_step(target, cache, lengths,
                             [[ref[j - 1] if j - 1 < len(ref) else 0] for ref in reference])
        lengths += 1
        proposals.append(torch.argmax(logits, dim=-1))
    table = torch.stack(proposals, dim=1).tolist()
    return [row[:len(ref)] for row, ref in zip(table, reference)]


def _ar_in_batches(size: int, target, prompts, max_new_tokens, eos_ids,
                   force_reference) -> SpecResult:
    """A Program without a drafter: greedy AR in batches of `size`, as a SpecResult whose every
    step accepted no draft (one token per target forward) and ran no drafter forward."""
    tokens: List[List[int]] = []
    proposals: List[List[int]] = []
    forwards = 0
    for start in range(0, len(prompts), size):
        chunk = prompts[start:start + size]
        if force_reference is None:
            r = generate_ar(target, chunk, max_new_tokens, eos_ids)
            tokens += r.tokens
            forwards += r.target_forwards
            continue
        reference = force_reference.tokens[start:start + len(chunk)]
        proposals += force_ar_proposals(target, chunk, reference)
        tokens += [list(t) for t in reference]
        forwards += max(len(t) for t in reference)
    return _ar_result(tokens, forwards, proposals,
                      {"speculation_off": -(-len(prompts) // size)})  # batches, as graphed


def _ar_result(tokens: List[List[int]], forwards: int, proposals: List[List[int]],
               stats: dict) -> SpecResult:
    """Greedy AR's run as a SpecResult: every step accepted no draft (one token per target
    forward) and no drafter ran. The first token of a request comes from the prefill."""
    accepted = [[0] * max(0, len(t) - 1) for t in tokens]
    steps = sum(len(a) for a in accepted)
    return SpecResult(tokens=tokens, target_forwards=forwards, drafter_forwards=0,
                      accepted_lengths=accepted, mean_accepted=1.0 if steps else 0.0,
                      proposals=proposals, stats=stats)


def _ar_with_refill(size: int, target, prompts, max_new_tokens, eos_ids,
                    force_reference) -> SpecResult:
    """A Program without a drafter whose finished slots are refilled: the graphed runtime's
    refill loop with chains of 0, its rounds run eagerly (runtime/graphed_refill.py)."""
    longest = (max_new_tokens if force_reference is None
               else max(len(t) for t in force_reference.tokens))
    capacity = check_capacity(target, prompts, longest, slack=1)
    decoder = GraphedRefillDecoder(target, None, min(size, len(prompts)), capacity, 0, eos_ids,
                                   capture=False)
    if force_reference is None:
        r = decoder.generate(prompts, max_new_tokens)
        r.stats = ar_stats(r.stats)                 # as the graphed path names them
        return r
    tokens = [list(t) for t in force_reference.tokens]
    # Forced: one verified position per reference token (a forced run is compared, not timed).
    return _ar_result(tokens, sum(len(t) for t in tokens), decoder.force(prompts, tokens), {})


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
