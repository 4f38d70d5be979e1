"""Pricing the Sequoia-shaped trees of a measured rank profile at one batch size, for the
shaped-tree bench systems (shaped_tree_system.py): every shape from
`cost/topologies.shaped_topologies` (the dynamic programme), and the chain of every depth it
lacks (`shapes_and_chains`: the tree must beat a chain to be run), is rated in tokens per second
and the best is kept (`best_shape`). Two ratings: the calibrated cost model's, here (the GPU's
built-in spec calibrated at the batch size as a compile's round zero calibrates it,
`calibrated_model`: greedy AR and the stock chain timed, fitted against the model's
predictions of those runs); and timed probe rounds, Sequoia's own hardware-aware way
(timed_tree_pricing.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from specpilot.ir import Chain, Program, SetTopology, apply
from specpilot.ir.errors import SpecPilotError

# Calibration runs decode this many prompts (at least one full batch) and time the median of
# this many runs after a warm-up.
CALIBRATION_PROMPTS = 8
CALIBRATION_REPEATS = 3
# (the Program with a shape, the shape) -> tokens per second, or None where it cannot be rated
Rating = Callable[[Program, object], Optional[float]]


def with_topology(program: Program, topology) -> Program:
    """`program` with `topology` (a SpecPilotError where its IR refuses the shape)."""
    return program if program.draft.topology == topology else apply(program,
                                                                     SetTopology(topology))


def best_shape(base: Program, acceptance, batch: int, rate: Rating) -> Tuple[object, float]:
    """(topology, its rate) of the shape `rate` rates highest for `base` at `batch`, among the
    profile's shaped trees and chains (`shapes_and_chains`) that Program takes; a
    SpecPilotError where none is rated."""
    sized = replace(base, batch=replace(base.batch, max_batch_size=batch))
    best: Optional[Tuple[float, object]] = None
    for topology in shapes_and_chains(acceptance):
        try:
            tps = rate(with_topology(sized, topology), topology)
        except SpecPilotError:
            continue            # a shape this Program cannot take (refused by the IR)
        if tps is not None and (best is None or tps > best[0]):
            best = (tps, topology)
    if best is None:
        raise SpecPilotError("the measured rank profile gives no tree to rate (no drafted "
                             "token ranked, or no shape priced)")
    return best[1], best[0]


def best_shaped_topology(base: Program, acceptance, batch: int,
                         cost_model) -> Tuple[object, float]:
    """(topology, predicted tokens/s) of the shape `cost_model` ranks first at `batch` (the
    candidates are the timed pricing's: the two pricings differ in their prices only)."""
    return best_shape(base, acceptance, batch, lambda program, _:
                      cost_model.predicted_tokens_per_s(program, acceptance, batch))


def shapes_and_chains(acceptance) -> Tuple[object, ...]:
    """The profile's shaped trees, then every chain of 1 to the programme's deepest level that
    they lack: the timed pricing can always fall back on a chain, which a tree round's dearer
    code may make the best buy, while the programme ranks shapes by acceptance alone (a profile
    that rewards width may give no chain at all, and it gives a 1-node one only where a second
    node would accept nothing). Nothing for a profile without ranks."""
    from specpilot.cost.topologies import MAX_TREE_DEPTH, shaped_topologies

    shaped = tuple(shaped_topologies(acceptance))
    if not shaped:
        return ()           # no ranks: nothing to rate, chains included
    return shaped + tuple(Chain(k) for k in range(1, MAX_TREE_DEPTH + 1)
                          if Chain(k) not in shaped)


def calibrated_model(model, stock: Program, pair, prompts: Sequence[Sequence[int]],
                     max_new_tokens: int, acceptance):
    """`model` calibrated on two timed runs of `prompts` at the stock Program's batch size, as
    a compile's round zero does: greedy AR of the target and the stock Program itself, each on
    the graphed runtime (captured on a GPU, eager elsewhere). `acceptance` must be the rank
    profile of these prompts (first): it gives the stock run's predicted accepted lengths."""
    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.runtime.graphed_program import plain_capacity, release_decoders, run_graphed

    from .step_costs import time_median
    from .workload import batches

    cuda = pair.target.device.type == "cuda"
    batch = stock.batch.max_batch_size
    capacity = plain_capacity(pair.target, prompts, max_new_tokens)   # as strong AR's
    ar = GraphedChainDecoder(pair.target, None, batch, capacity, 0, pair.eos_ids, capture=cuda)
    ar.prepare_prefill(prompts)
    runs: Dict[str, Callable[[], List[List[int]]]] = {
        "ar": lambda: [t for chunk in batches(prompts, batch)
                       for t in ar.generate(chunk, max_new_tokens).tokens],
        "stock": lambda: run_graphed(stock, pair, prompts, max_new_tokens, capture=cuda).tokens}
    decoded, measured = {}, {}
    try:
        for label, run in runs.items():
            # The warm-up (it captures on a GPU) tells what each request decoded.
            decoded[label] = [len(t) for t in run()]
            measured[label] = time_median(run, pair.target.device, 0, CALIBRATION_REPEATS,
                                          host_bound=True)
    finally:
        release_decoders()      # the stock decoder's graphs; the AR one's go with this frame
    lengths = [len(p) for p in prompts]
    # Each run priced at the tokens it decoded (bf16 batches may end a request elsewhere than
    # the profile's reference did); the stock run's rounds from the profile's ranks.
    predictions = {"ar": model.predict_ar_run(stock, lengths, decoded["ar"], batch,
                                              graphed=cuda),
                   "stock": model.predict_speculative_run(stock, acceptance, lengths,
                                                          decoded["stock"])}
    for label, prediction in predictions.items():
        model = model.calibrated(label, measured[label], prediction)
    return model
