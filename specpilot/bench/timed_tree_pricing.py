"""Sequoia's hardware-aware pricing of the shaped trees at one batch size, for the shaped-tree
bench systems (shaped_tree_system.py): a few probe chains' and trees' rounds are timed at the
batch size (`time_probes`) and a shape's rate is its expected tokens a round (accepted drafts
replayed over the ranks, plus the bonus) over its round's fitted cost, for full rows
(`best_timed_topology`). The candidates are tree_pricing.py's (`shapes_and_chains`); the
calibrated cost model's rating is there too.

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

from typing import List, Optional, Sequence, Tuple

from specpilot.ir import Chain, Program, Tree
from specpilot.ir.errors import SpecPilotError

from .tree_pricing import best_shape

# Probe topologies whose rounds the timed pricing measures. Chains of 1, 3 and 6 levels for the
# chain fit (base, per level: three depths, so no one slow round alone sets the line); trees of
# 8 to 64 drafted nodes and 1 to 6 levels for the tree fit, so that its three costs (base, per
# verified token, per drafter level) are told apart.
PROBES = (Chain(1), Chain(3), Chain(6), Tree((8,)), Tree((4, 4)), Tree((4, 3, 2, 1)),
          Tree((2, 2, 2, 2, 1, 1)))
PROBE_WARMUP, PROBE_REPEATS = 2, 5


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
