"""Programs whose decode rounds run as CUDA graphs (`kernels.capture_graphs` on a CUDA device).

The graphed runtime covers chains, static trees (runtime/graphed_tree.py) and dynamic trees
(runtime/graphed_dynamic.py) with the padded layout and drain or continuous refill
(runtime/graphed_refill.py, runtime/graphed_tree_refill.py), chains with a fixed or an adaptive
draft length, and static trees pruned by the target's own layers before the full target
verifies (runtime/graphed_two_level.py) (`graph_refusal` names what else a Program asks for).
Decoders are kept per (models, batch, round span, length cap, capacity, EOS ids, refill, and
for a speculating Program its topology and pruned verifier), so capture happens once and
repeated runs (warm-up, timed repeats, forcing) replay the same graphs.

Adaptive draft length under a token budget, graphed: the padded batch verifies B x (L + 1)
tokens in a round of chain length L, so the budget caps L at budget // B - 1; within that cap
the batch's length follows its requests' estimated acceptance and the measured round costs
(runtime/batch_length.py), and each round replays the graph of the length chosen two replays
back (runtime/graphed_chain.py). Where the cap is below one draft the budget turns speculation
off for that batch size: the Program decodes with the graphed greedy AR step (speculation never
costs more than plain decoding there).

A Program that does not speculate (`draft.drafter` "none") decodes with that same graphed
greedy AR step at every batch size: the chain decoder with no drafter and chains of 0, the
decoder of the strong AR baseline, or with continuous refill the refill decoder with chains of 0
(the `strong_ar_refill` baseline's).
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import List, NamedTuple, Optional, Sequence

import torch

from specpilot.ir import Program
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.prune import LayerSkipPrune
from specpilot.ir.topology import Chain, DynamicTree, SparseTree, Tree

from .ar import ARResult
from .forcing import ForcingReport, compare_to_reference, resolve_tolerance
from .graphed_chain import GraphedChainDecoder, timing_room
from .graphed_dynamic import GraphedDynamicTreeDecoder, dynamic_span
from .graphed_loop import ar_stats, mean_committed
from .graphed_refill import GraphedRefillDecoder, refill_rounds_per_replay
from .graphed_tree import GraphedTreeDecoder
from .graphed_tree_refill import GraphedDynamicTreeRefillDecoder, GraphedTreeRefillDecoder
from .graphed_two_level import GraphedTwoLevelDecoder
from .speculative import SpecResult
from .steps import check_capacity

# Capacities are rounded up so that prompts of similar length share graphs. Every step's masked
# attention reads all `capacity` slots of every row, so the rounding is paid at each step, most
# at large batches: for the H200 pair (161M target) at batch 64 a slot costs 0.79 MB a step,
# and 256 new tokens' slots 200 MB against 323 MB of weights. So 8, which wastes at most 7
# slots. Rounded up to 64, batches of 64 started off (no drafter run) ran 0.98-0.99x strong AR;
# rounded up to 8, 1.00x, on another trained pair (runs 13 and 14, BENCHMARKS.md, when strong
# AR's cache was exact): not an A/B of the step alone. Strong AR's cache is rounded too since
# the eighteenth set (`plain_capacity`).
CAPACITY_STEP = 8
KEPT_DECODERS = 4        # decoders (each with its own KV caches) kept alive at once


def graph_refusal(program: Program, device) -> Optional[str]:
    """Why `program` cannot run on the graphed runtime on `device` (None if it can)."""
    if not program.kernels.capture_graphs:
        return "kernels.capture_graphs is off"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "CUDA graphs need a CUDA GPU"
    return rounds_refusal(program)


def captures_rounds(program: Program) -> bool:
    """Whether the Program's rounds run as CUDA graphs on a GPU: `kernels.capture_graphs` on and
    rounds the graphed runtime has (`rounds_refusal`); the others run eagerly. What the cost
    model prices a Program's launches and refill schedule by."""
    return program.kernels.capture_graphs and rounds_refusal(program) is None


def rounds_refusal(program: Program) -> Optional[str]:
    """Why the graphed runtime has no rounds for `program` on any device (None if it has)."""
    b = program.batch
    topology = program.draft.topology
    if not program.draft.speculates:
        return None        # greedy AR steps, drained or refilled (padded, nothing pruned)
    if not isinstance(topology, (Chain, Tree, SparseTree, DynamicTree)):
        return f"draft topology {topology} (graphed rounds take chains and trees)"
    if not isinstance(topology, Chain) and program.batch.draft_length_policy != "fixed":
        return "adaptive draft lengths adapt chains only"
    if b.layout != "padded":
        return "graphed rounds need the padded layout"
    if b.refill not in ("drain", "continuous"):
        return f"refill policy {b.refill!r}"
    if b.draft_length_policy not in ("fixed", "per_request_adaptive"):
        return f"draft length policy {b.draft_length_policy!r}"
    prune = program.verify.prune
    if prune is not None:
        if not isinstance(prune, LayerSkipPrune):
            return ("graphed two-level verification prunes with the target's own layers "
                    f"(layer_skip), not {prune}")
        if prune.top_k != 1:
            return ("graphed two-level verification keeps the cheap verifier's greedy path "
                    f"(top_k=1), not the top {prune.top_k}")
        if not isinstance(topology, (Tree, SparseTree)):
            return "graphed two-level verification prunes static trees"
        if b.refill == "continuous":
            return "graphed two-level verification drains its batches (no continuous refill)"
    return None


_decoders: "OrderedDict" = OrderedDict()
_kept = KEPT_DECODERS    # the cache's size now (`kept_decoders` raises it for a block)


def _trim_decoders(most: int) -> None:
    """Drop the least recently used decoders down to `most`."""
    while len(_decoders) > most:
        _decoders.popitem(last=False)


def length_cap(program: Program) -> Optional[int]:
    """The longest chain the Program may draft at its batch size: k for a fixed length, the
    token budget's share (budget // batch - 1, at most k) for an adaptive one; 0 means the
    budget leaves no room for drafts, or the Program does not speculate."""
    if not program.draft.speculates:
        return 0
    k, b = program.draft.topology.num_nodes, program.batch
    if b.draft_length_policy != "per_request_adaptive":
        return k
    return max(0, min(k, b.token_budget // b.max_batch_size - 1))


def rounded_capacity(needed: int) -> int:
    """`needed` cache slots rounded up to a multiple of CAPACITY_STEP."""
    return -(-needed // CAPACITY_STEP) * CAPACITY_STEP


def decode_capacity(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    span: int) -> int:
    """The cache of a graphed decoder whose rounds write `span` slots past the last committed
    token, for these prompts: the longest prompt, the new tokens, the span and one slot,
    rounded up to CAPACITY_STEP, within the model's positions. A CapacityError naming the fix
    where the prompts and new tokens do not fit the model."""
    needed = check_capacity(model, prompts, max_new_tokens, slack=span + 1)
    return min(rounded_capacity(needed), model.config.max_position_embeddings)


def plain_capacity(model, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
    """The cache of a graphed plain-AR decoder (chains of 0): `decode_capacity` with no span,
    so that a baseline never reads a cache of another shape class than the speculative
    decoders it is compared with (`decoder_for`)."""
    return decode_capacity(model, prompts, max_new_tokens, 0)


def round_span(topology) -> int:
    """Cache slots one graphed round of `topology` writes past the last committed token."""
    return dynamic_span(topology) if isinstance(topology, DynamicTree) else topology.num_nodes


def timing_capacity(context: int, topology, rounds: int) -> int:
    """Cache slots for timing `rounds` rounds of `topology` (`timing_round`) from `context`:
    a round commits at most its depth and the bonus token, and the last writes its span past
    them; at least two rounds' spans (what `timing_round` asks); rounded up to CAPACITY_STEP,
    as a decode's capacity is (`decoder_for`). Not a span a round for every round: an
    attention that walks the whole cache would then time a wide tree over a cache several
    times a chain's, which no decode of the same prompts allocates."""
    span = round_span(topology)
    needed = context + max(rounds * (topology.depth + 1) + span + 1, timing_room(span))
    # Rounded as decodes are: on the H200, cuDNN's masked attention in chain(4)'s round took
    # 438 µs over 337 slots against 253 µs over 332 (two calls, not an A/B of the slot count
    # alone; BENCHMARKS.md, eighteenth set).
    return rounded_capacity(needed)


def graphed_decoder(target, drafter, batch: int, capacity: int, topology, eos_ids=(),
                    capture: bool = True, refill: bool = False,
                    rounds_per_replay: Optional[int] = None, **chain_options):
    """The graphed decoder of `topology`: chain, static tree or dynamic tree, padded or (with
    `refill`) refilling slots from a queue. `chain_options`, such as adaptive lengths and the
    accept kernels, go to chain decoders only (tree lengths do not adapt; a tree's round end
    walks its nodes)."""
    if isinstance(topology, DynamicTree):
        cls = GraphedDynamicTreeRefillDecoder if refill else GraphedDynamicTreeDecoder
        return cls(target, drafter, batch, capacity, topology, eos_ids, capture=capture,
                   rounds_per_replay=rounds_per_replay)
    if not isinstance(topology, Chain):
        cls = GraphedTreeRefillDecoder if refill else GraphedTreeDecoder
        return cls(target, drafter, batch, capacity, topology.shape(), eos_ids,
                   capture=capture, rounds_per_replay=rounds_per_replay)
    cls = GraphedRefillDecoder if refill else GraphedChainDecoder
    return cls(target, drafter, batch, capacity, topology.k, eos_ids, capture=capture,
               rounds_per_replay=rounds_per_replay, **chain_options)


class DecoderKey(NamedTuple):
    """What a kept decoder is kept for: everything its graphs depend on."""
    target: int
    drafter: Optional[int]           # None: no drafter runs in plain greedy steps
    batch: int
    span: int
    length_cap: int
    adaptive: bool
    capacity: int
    eos_ids: tuple
    capture: bool
    refill: bool
    estimator: str                   # batch.length_estimator ("geometric" unless adaptive)
    topology: object                 # the next two only where drafts run (cap > 0): plain
    prune: object                    # greedy steps keep an unused topology, yet share decoders
    rounds: Optional[int] = None     # a captured refill decoder's rounds a replay (settable)
    accept: str = "ops"              # kernels.accept_kernels: how a chain round ends
    drain: str = "makespan"          # batch.length_drain (adaptive lengths with refill)


def decoder_for(program: Program, pair, prompts: Sequence[Sequence[int]],
                max_new_tokens: int, capture: bool = True, reuse_larger_cache: bool = False):
    """The (cached) decoder that runs `program` on `pair` for prompts like these (with no
    drafter and chains of 0, i.e. plain greedy steps, where the Program does not speculate or
    the budget leaves no room for drafts). `reuse_larger_cache`: a kept decoder of the Program
    with a larger cache serves too (the smallest such), rather than one built for this
    capacity. A SpecPilotError where the graphed runtime has no rounds for the Program."""
    refusal = rounds_refusal(program)
    if refusal is not None:
        raise SpecPilotError(f"no graphed rounds for this Program: {refusal}")
    topology, batch = program.draft.topology, program.batch.max_batch_size
    cap = length_cap(program)
    k = round_span(topology) if program.draft.speculates else 0
    adaptive = program.batch.draft_length_policy == "per_request_adaptive"
    capacity = decode_capacity(pair.target, prompts, max_new_tokens, k)
    drafter_key = id(pair.drafter) if cap else None     # no drafter runs in plain greedy steps
    refill = refills(program)
    estimator = program.batch.length_estimator
    key = DecoderKey(id(pair.target), drafter_key, batch, k, cap, adaptive, capacity,
                     tuple(pair.eos_ids), capture, refill, estimator, topology if cap else None,
                     program.verify.prune if cap else None,
                     refill_rounds_per_replay() if refill and capture else None,
                     program.kernels.accept_kernels, program.batch.length_drain)
    if reuse_larger_cache and key not in _decoders:
        larger = [kept for kept in _decoders if kept.capacity > capacity
                  and kept._replace(capacity=capacity) == key]
        key = min(larger, key=lambda kept: kept.capacity, default=key)
    if key in _decoders:
        _decoders.move_to_end(key)
        _decoders[key].prepare_prefill(prompts)
        return _decoders[key]
    _trim_decoders(_kept - 1)                # room for the one built now
    accept = program.kernels.accept_kernels
    if cap == 0:                # plain greedy steps, drained or refilled
        plain = GraphedRefillDecoder if refill else GraphedChainDecoder
        decoder = plain(pair.target, None, batch, capacity, 0, pair.eos_ids, capture=capture,
                        accept_kernels=accept)
    elif program.verify.prune is not None:     # static trees, layer_skip at top-1, drained
        decoder = GraphedTwoLevelDecoder(pair.target, pair.drafter, batch, capacity,
                                         topology.shape(), program.verify.prune.keep_layers,
                                         pair.eos_ids, capture)
    else:   # chains (fixed or adaptive) and trees (fixed: `rounds_refusal`), drained or refilled
        decoder = graphed_decoder(pair.target, pair.drafter, batch, capacity, topology,
                                  pair.eos_ids, capture, refill=refill, adaptive=adaptive,
                                  length_cap=cap, length_estimator=estimator,
                                  accept_kernels=accept,
                                  length_drain=program.batch.length_drain)
    _decoders[key] = decoder
    decoder.prepare_prefill(prompts)
    return decoder


def refills(program: Program) -> bool:
    """Whether the Program's graphed decoder refills slots (`batch.refill` "continuous"): it
    then takes every prompt at once, not a batch at a time."""
    return program.batch.refill == "continuous"


def _batches(decoder, items: Sequence) -> List[Sequence]:
    """What one call of `decoder` takes: everything with refill, else a batch at a time."""
    if isinstance(decoder, GraphedRefillDecoder):
        return [items]
    return [items[start:start + decoder.batch] for start in range(0, len(items), decoder.batch)]


def _generate(decoder, prompts, max_new_tokens: int) -> SpecResult:
    r = decoder.generate(prompts, max_new_tokens)
    if decoder.k == 0:                       # plain greedy steps, named as the eager path does
        r.stats = ar_stats(r.stats)
    return r


def release_decoders() -> None:
    """Drop every cached decoder (and its caches and graphs)."""
    _decoders.clear()


@contextmanager
def kept_decoders(count: int):
    """Keep up to `count` decoders alive at once inside the block (at least KEPT_DECODERS):
    systems timed side by side each hold theirs between passes (specpilot/bench/interleave.py).
    After the block the least recently used are dropped down to KEPT_DECODERS again."""
    global _kept
    if count < 1:
        raise SpecPilotError(f"kept decoders must be at least 1, got {count}")
    _kept = max(KEPT_DECODERS, count)
    try:
        yield
    finally:
        _kept = KEPT_DECODERS
        _trim_decoders(KEPT_DECODERS)


def run_graphed(program: Program, pair, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                capture: bool = True) -> SpecResult:
    """Decode `prompts` with the Program's graphed decoder: in batches of
    `batch.max_batch_size`, or all at once with continuous refill."""
    decoder = decoder_for(program, pair, prompts, max_new_tokens, capture)
    parts = [_generate(decoder, chunk, max_new_tokens) for chunk in _batches(decoder, prompts)]
    accepted = [a for p in parts for a in p.accepted_lengths]
    stats: dict = {}
    for p in parts:
        for name, value in p.stats.items():
            stats[name] = stats.get(name, 0) + value
    return SpecResult(tokens=[t for p in parts for t in p.tokens],
                      target_forwards=sum(p.target_forwards for p in parts),
                      drafter_forwards=sum(p.drafter_forwards for p in parts),
                      accepted_lengths=accepted, mean_accepted=mean_committed(accepted),
                      stats=stats,
                      # one call with refill, so one length rule: a refill decoder's own
                      length_rule=parts[0].length_rule if len(parts) == 1 else {})


def force_graphed(program: Program, pair, prompts: Sequence[Sequence[int]], reference: ARResult,
                  tolerance: Optional[float] = None, capture: bool = True) -> ForcingReport:
    """Token-force the graphed decoder of `program` against `reference`: the one its timed runs
    used where it is kept (references that all stopped early need a smaller cache, and with
    capacities rounded to 8 slots would otherwise capture a decoder of their own)."""
    longest = max(len(t) for t in reference.tokens)
    decoder = decoder_for(program, pair, prompts, longest, capture, reuse_larger_cache=True)
    proposals: List[List[int]] = []
    pairs = list(zip(prompts, reference.tokens))
    for chunk in _batches(decoder, pairs):
        proposals += decoder.force([p for p, _ in chunk], [t for _, t in chunk])
    return compare_to_reference(proposals, reference,
                                resolve_tolerance(tolerance, pair.target.dtype))
