"""Pricing the Sequoia-shaped trees of a measured rank profile at one batch size, for the
shaped-tree bench systems (shaped_tree_system.py): every shape from
`cost/topologies.shaped_topologies` (the dynamic programme), and the chain of every depth it
lacks (`shapes_and_chains`: the tree must beat a chain to be run), is rated in tokens per second
and the best is kept (`best_shape`). Two ratings:

  - calibrated: the cost model's predicted tokens/s, the model being the GPU's built-in spec
    calibrated at the batch size as a compile's round zero calibrates it (`calibrated_model`:
    greedy AR and the stock chain timed, fitted against the model's predictions of those runs);
  - timed, Sequoia's own hardware-aware way: a few probe chains' and trees' rounds are timed at
    the batch size (`time_probes`) and a shape's rate is its expected tokens a round (accepted
    drafts replayed over the ranks, plus the bonus) over its round's fitted cost, for full rows
    (`best_timed_topology`).

The timed rounds are fitted twice, one fit per kind of round, because a chain round and a tree
round run different runtime code: a chain needs no tree mask, top-k, acceptance walk or cache
compaction. A chain is priced by the chain probes alone as base + a cost per drafter level
(`fit_chain_cost`; its verified tokens are its depth + 1, so a token and a level are one term);
every other shape by the tree probes alone as base + a cost per verified token + a cost per
drafter level (`fit_tree_cost`). Measured on an H200 at batch 1 (run 34), a chain cost about
0.24 ms a level (chain(1) 1.36 ms, chain(6) 2.56 ms) and a tree about 0.45 ms (tree([8]) 1.58
ms to tree([2, 2, 2, 2, 1, 1]) 4.40 ms): one fit over both (0.23 ms a level) priced trees as
chains, and chose a 5-node depth-4 sparse tree slower than the stock chain(4).
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
# Probe topologies whose rounds the timed pricing measures. Chains of 1, 3 and 6 levels for the
# chain fit (base, per level: three depths, so no one slow round alone sets the line); trees of
# 8 to 64 drafted nodes and 1 to 6 levels for the tree fit, so that its three costs (base, per
# verified token, per drafter level) are told apart.
PROBES = (Chain(1), Chain(3), Chain(6), Tree((8,)), Tree((4, 4)), Tree((4, 3, 2, 1)),
          Tree((2, 2, 2, 2, 1, 1)))
PROBE_WARMUP, PROBE_REPEATS = 2, 5

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


def best_timed_topology(base: Program, acceptance, batch: int, chain_fit: Tuple[float, float],
                        tree_fit: Tuple[float, float, float]) -> Tuple[object, float]:
    """(topology, expected tokens/s of full rows) of the shape with the most expected tokens a
    round per second of a round, among the shaped trees and the chains (`shapes_and_chains`): a
    chain's round priced by `chain_fit` (base, per level; `fit_chain_cost`), any other shape's
    by `tree_fit` (base, per token, per level; `fit_tree_cost`)."""
    from specpilot.runtime.sequoia import linear_step_cost

    # A chain's tokens are its levels + 1: its per-level term prices both, so no token term.
    chain_cost = linear_step_cost(chain_fit[0], 0.0, chain_fit[1])
    tree_cost = linear_step_cost(*tree_fit)

    def rate(_, topology) -> Optional[float]:
        cost = chain_cost if isinstance(topology, Chain) else tree_cost
        seconds = cost(topology.num_nodes, topology.depth)
        if seconds <= 0:
            return None         # outside what the fit can price
        return batch * (1.0 + acceptance.mean_accepted(topology)) / seconds

    return best_shape(base, acceptance, batch, rate)


def fit_chain_cost(probes: Sequence[Tuple[object, float]]) -> Tuple[float, float]:
    """(base, per drafter level) of a chain round, fitted by least squares to the chains among
    `probes`' (topology, round seconds) (the others are ignored: a tree round runs other code),
    neither negative: where the free fit makes the level cost negative, the best fit with it
    held at 0 is taken. A SpecPilotError where the chains probed are of fewer than two depths.
    (A chain's verified tokens are its depth + 1: its token cost is within the level cost.)"""
    import numpy as np

    chains = [(t, s) for t, s in probes if isinstance(t, Chain)]
    if len({t.depth for t, _ in chains}) < 2:
        raise SpecPilotError(f"the chain fit needs chain probes of at least two depths, got "
                             f"{[str(t) for t, _ in chains]}")
    rows = np.array([[1.0, t.depth] for t, _ in chains])
    base, per_depth = _non_negative_fit(rows, np.array([s for _, s in chains]), ((0, 1), (0,)))
    return float(base), float(per_depth)


def fit_tree_cost(probes: Sequence[Tuple[object, float]]) -> Tuple[float, float, float]:
    """(base, per verified token, per drafter level) of a tree round, fitted by least squares
    to the probes in `probes`' (topology, round seconds) that are not chains (a chain round
    runs other code: `fit_chain_cost`), none negative: where the free fit makes a cost negative
    (timing noise where a term barely matters), the best fit with that cost held at 0 is taken,
    so no tree is priced cheaper for being larger. A SpecPilotError where the tree probes
    cannot tell the three apart."""
    import numpy as np

    trees = [(t, s) for t, s in probes if not isinstance(t, Chain)]
    rows = np.array([[1.0, t.num_nodes + 1, t.depth] for t, _ in trees]).reshape(-1, 3)
    if np.linalg.matrix_rank(rows) < 3:
        raise SpecPilotError(f"the tree fit needs tree probes that differ in size and depth "
                             f"independently, got {[str(t) for t, _ in trees]}")
    # Base always; then fewer terms.
    base, per_token, per_depth = _non_negative_fit(rows, np.array([s for _, s in trees]),
                                                   ((0, 1, 2), (0, 1), (0, 2), (0,)))
    return float(base), float(per_token), float(per_depth)


def _non_negative_fit(rows, seconds, subsets):
    """The least-squares coefficients of `rows` for `seconds` with the smallest residual among
    those that fit only one of `subsets` of the columns (the others held at 0) and have no
    negative coefficient; a SpecPilotError where every subset's fit has one."""
    import numpy as np

    best = None
    for kept in subsets:
        coef = np.zeros(rows.shape[1])
        coef[list(kept)] = np.linalg.lstsq(rows[:, kept], seconds, rcond=None)[0]
        if (coef < 0).any():
            continue
        residual = float(((rows @ coef - seconds) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, coef)
    if best is None:
        raise SpecPilotError("the probe rounds fit no non-negative cost")
    return best[1]


def time_probes(pair, batch: int, context: int, graphed: bool,
                probes: Sequence[object] = PROBES) -> List[Tuple[object, float]]:
    """(probe, median seconds of one of its rounds) at `batch`, every row active after `context`
    positions (captured on a GPU; eager elsewhere, where only a script's check is timed)."""
    import torch

    from .step_costs import measure_round, round_timing_context

    warmup, repeats = (PROBE_WARMUP, PROBE_REPEATS) if graphed else (0, 1)
    out = []
    for probe in probes:
        at = round_timing_context(pair.target, context, probe, warmup, repeats)
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
