"""Programs whose decode rounds run as CUDA graphs (`kernels.capture_graphs` on a CUDA device).

The graphed runtime covers the stock mechanisms with a chain topology: padded layout, fixed
draft length, drain refill, no pruned verifier (`graph_refusal` names what else a Program asks
for). Decoders are kept per (models, batch, chain, capacity), so capture happens once and
repeated runs (warm-up, timed repeats, forcing) replay the same graphs.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import List, Optional, Sequence

import torch

from specpilot.ir import Program
from specpilot.ir.topology import Chain

from .ar import ARResult
from .forcing import ForcingReport, compare_to_reference, resolve_tolerance
from .graphed_chain import GraphedChainDecoder
from .speculative import SpecResult

CAPACITY_STEP = 256      # capacities are rounded up so prompts of similar length share graphs
KEPT_DECODERS = 4        # decoders (each with its own KV caches) kept alive at once


def graph_refusal(program: Program, device) -> Optional[str]:
    """Why `program` cannot run on the graphed runtime on `device` (None if it can)."""
    if not program.kernels.capture_graphs:
        return "kernels.capture_graphs is off"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "CUDA graphs need a CUDA GPU"
    b = program.batch
    if not isinstance(program.draft.topology, Chain):
        return f"draft topology {program.draft.topology} (graphed rounds are chains only)"
    if b.layout != "padded" or b.draft_length_policy != "fixed" or b.refill != "drain":
        return "graphed rounds need the padded layout, a fixed draft length and drain refill"
    if program.verify.prune is not None:
        return "graphed rounds do not run a pruned verifier"
    return None


_decoders: "OrderedDict" = OrderedDict()


def decoder_for(program: Program, pair, prompts: Sequence[Sequence[int]],
                max_new_tokens: int, capture: bool = True) -> GraphedChainDecoder:
    """The (cached) decoder that runs `program` on `pair` for prompts like these."""
    k, batch = program.draft.topology.k, program.batch.max_batch_size
    needed = max(len(p) for p in prompts) + max_new_tokens + k + 1
    capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
    capacity = min(capacity, pair.target.config.max_position_embeddings)
    key = (id(pair.target), id(pair.drafter), batch, k, capacity, tuple(pair.eos_ids), capture)
    if key in _decoders:
        _decoders.move_to_end(key)
        return _decoders[key]
    while len(_decoders) >= KEPT_DECODERS:
        _decoders.popitem(last=False)
    decoder = GraphedChainDecoder(pair.target, pair.drafter, batch, capacity, k, pair.eos_ids,
                                  capture=capture)
    _decoders[key] = decoder
    return decoder


def release_decoders() -> None:
    """Drop every cached decoder (and its caches and graphs)."""
    _decoders.clear()


def run_graphed(program: Program, pair, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                capture: bool = True) -> SpecResult:
    """Decode `prompts` in batches of `batch.max_batch_size` with the graphed chain decoder."""
    decoder = decoder_for(program, pair, prompts, max_new_tokens, capture)
    parts: List[SpecResult] = []
    for start in range(0, len(prompts), decoder.batch):
        parts.append(decoder.generate(prompts[start:start + decoder.batch], max_new_tokens))
    accepted = [a for p in parts for a in p.accepted_lengths]
    steps = sum(len(a) for a in accepted)
    return SpecResult(tokens=[t for p in parts for t in p.tokens],
                      target_forwards=sum(p.target_forwards for p in parts),
                      drafter_forwards=sum(p.drafter_forwards for p in parts),
                      accepted_lengths=accepted,
                      mean_accepted=(sum(n + 1 for a in accepted for n in a) / steps
                                     if steps else 0.0))


def force_graphed(program: Program, pair, prompts: Sequence[Sequence[int]], reference: ARResult,
                  tolerance: Optional[float] = None, capture: bool = True) -> ForcingReport:
    """Token-force the graphed decoder of `program` against `reference`."""
    longest = max(len(t) for t in reference.tokens)
    decoder = decoder_for(program, pair, prompts, longest, capture)
    proposals: List[List[int]] = []
    for start in range(0, len(prompts), decoder.batch):
        proposals += decoder.force(prompts[start:start + decoder.batch],
                                   reference.tokens[start:start + decoder.batch])
    return compare_to_reference(proposals, reference,
                                resolve_tolerance(tolerance, pair.target.dtype))
