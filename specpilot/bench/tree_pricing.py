"""Pricing the Sequoia-shaped trees of a measured rank profile at one batch size, for the
shaped-tree bench systems (shaped_tree_system.py): every shape from
`cost/topologies.shaped_topologies` (the dynamic programme) is rated in tokens per second and
the best is kept (`best_shape`). Two ratings:

  - calibrated: the cost model's predicted tokens/s, the model being the GPU's built-in spec
    calibrated at the batch size as a compile's round zero calibrates it (`calibrated_model`:
    greedy AR and the stock chain timed, fitted against the model's predictions of those runs);
  - timed, Sequoia's own hardware-aware way: a few probe trees' rounds are timed at the batch
    size (`time_probes`) and a round's cost fitted as base + a cost per verified token + a cost
    per drafter level (`fit_linear_cost`, priced by `sequoia.linear_step_cost`); a shape's rate
    is its expected tokens a round (accepted drafts replayed over the ranks, plus the bonus)
    over that cost, for full rows.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from specpilot.ir import Chain, Program, SetTopology, Tree, apply
from specpilot.ir.errors import SpecPilotError

# Calibration runs decode this many prompts (at least one full batch) and time the median of
# this many runs after a warm-up.
CALIBRATION_PROMPTS = 8
CALIBRATION_REPEATS = 3
# Probe trees whose rounds the timed pricing measures: 1 to 64 drafted nodes, 1 to 6 levels, so
# that the fit's three costs (base, per verified token, per drafter level) are told apart.
PROBES = (Chain(1), Chain(6), Tree((8,)), Tree((4, 4)), Tree((4, 3, 2, 1)),
          Tree((2, 2, 2, 2, 1, 1)))
PROBE_WARMUP, PROBE_REPEATS = 2, 5

# (the Program with a shape, the shape) -> tokens per second, or None where it cannot be rated
Rating = Callable[[Program, object], Optional[float]]


def with_topology(program: Program, topology) -> Program:
    """`program` with `topology` (a SpecPilotError where its IR refuses the shape)."""
    return program if program.draft.topology == topology else apply(program,
                                                                     SetTopology(topology))


def best_shape(base: Program, acceptance, batch: int, rate: Rating) -> Tuple[object, float]:
    """(topology, its rate) of the shaped tree `rate` rates highest for `base` at `batch`,
    among the shapes that Program takes; a SpecPilotError where none is rated."""
    from specpilot.cost.topologies import shaped_topologies

    sized = replace(base, batch=replace(base.batch, max_batch_size=batch))
    best: Optional[Tuple[float, object]] = None
    for topology in shaped_topologies(acceptance):
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
    """(topology, predicted tokens/s) of the shaped tree `cost_model` ranks first at `batch`."""
    return best_shape(base, acceptance, batch, lambda program, _:
                      cost_model.predicted_tokens_per_s(program, acceptance, batch))


def best_timed_topology(base: Program, acceptance, batch: int,
                        fit: Tuple[float, float, float]) -> Tuple[object, float]:
    """(topology, expected tokens/s of full rows) of the shaped tree with the most expected
    tokens a round per second of a round priced by `fit` (base, per token, per level)."""
    from specpilot.runtime.sequoia import linear_step_cost

    cost = linear_step_cost(*fit)

    def rate(_, topology) -> Optional[float]:
        seconds = cost(topology.num_nodes, topology.depth)
        if seconds <= 0:
            return None         # outside what the fit can price
        return batch * (1.0 + acceptance.mean_accepted(topology)) / seconds

    return best_shape(base, acceptance, batch, rate)


def fit_linear_cost(probes: Sequence[Tuple[object, float]]) -> Tuple[float, float, float]:
    """(base, per verified token, per drafter level) fitted by least squares to `probes`'
    (topology, round seconds), none negative: where the free fit makes a cost negative (timing
    noise where a term barely matters), the best fit with that cost held at 0 is taken, so no
    tree is priced cheaper for being larger. A SpecPilotError where the probes cannot tell the
    three apart."""
    import numpy as np

    rows = np.array([[1.0, t.num_nodes + 1, t.depth] for t, _ in probes])
    seconds = np.array([s for _, s in probes])
    if np.linalg.matrix_rank(rows) < 3:
        raise SpecPilotError("the probe trees must differ in size and depth independently")
    best = None
    for kept in ((0, 1, 2), (0, 1), (0, 2), (0,)):      # base always; then fewer terms
        coef = np.zeros(3)
        coef[list(kept)] = np.linalg.lstsq(rows[:, kept], seconds, rcond=None)[0]
        if (coef < 0).any():
            continue
        residual = float(((rows @ coef - seconds) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, coef)
    if best is None:
        raise SpecPilotError("the probe rounds fit no non-negative cost")
    base, per_token, per_depth = best[1]
    return float(base), float(per_token), float(per_depth)


def time_probes(pair, batch: int, context: int, graphed: bool,
                probes: Sequence[object] = PROBES) -> List[Tuple[object, float]]:
    """(probe, median seconds of one of its rounds) at `batch`, every row active after `context`
    positions (captured on a GPU; eager elsewhere, where only a script's check is timed)."""
    import torch

    from .step_costs import measure_round

    warmup, repeats = (PROBE_WARMUP, PROBE_REPEATS) if graphed else (0, 1)
    out = []
    for probe in probes:
        # measure_round's cache holds the context and every timed round's span after it: kept
        # within the target's positions.
        span = (warmup + repeats + 3) * (probe.num_nodes + 1)
        at = max(1, min(context, pair.target.config.max_position_embeddings - span))
        out.append((probe, measure_round(pair.target, pair.drafter, batch, probe, at,
                                         graphed, warmup, repeats)))
        if graphed:
            torch.cuda.empty_cache()        # the probe's caches and graph
    return out


def calibrated_model(model, stock: Program, pair, prompts: Sequence[Sequence[int]],
                     max_new_tokens: int, acceptance):
    """`model` calibrated on two timed runs of `prompts` at the stock Program's batch size, as
    a compile's round zero does: greedy AR of the target and the stock Program itself, each on
    the graphed runtime (captured on a GPU, eager elsewhere). `acceptance` must be the rank
    profile of these prompts (first): it gives the stock run's predicted accepted lengths."""
    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.runtime.graphed_program import release_decoders, run_graphed
    from specpilot.runtime.steps import check_capacity

    from .step_costs import time_median
    from .workload import batches

    cuda = pair.target.device.type == "cuda"
    batch = stock.batch.max_batch_size
    capacity = check_capacity(pair.target, prompts, max_new_tokens, slack=1)
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
