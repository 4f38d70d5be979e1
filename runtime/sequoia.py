"""Tree shape from measured acceptance: the static tree with the most accepted tokens per cost.

Measurement. Teacher-forcing the drafter on the workload's reference output gives, at every
generated position t, the drafter's rank of the reference token there (`RankTrace`). A step whose
root precedes position s accepts, in a static tree, the longest prefix of the rank path
(rank[s], rank[s+1], ...) that is a node of the tree: exactly, since accepted tokens are the
reference's and the drafter sees the same prefix. `mean_accepted_in_tree` replays that; the
`AcceptanceProfile` condenses it to p[d][r], the probability that the target's token at depth d
is the drafter's rank-r token given that depth d was reached.

Shaping (Sequoia-style dynamic programming). Assuming acceptance at each depth independent of
the path above, a tree's expected accepted drafts are the sum over its nodes of the product of
p along the node's rank path. With V(d, n) the best value of at most n nodes hanging below an
accepted node whose children sit at depth d,

    V(d, n) = H(d, 0, n),   H(d, r, n) = max(0, max_m p[d][r] (1 + V(d+1, m-1)) + H(d, r+1, n-m))

(children are added in rank order, rank r with a subtree of m nodes, so every tree is rank- and
prefix-closed). `shape_tree` then weighs each depth limit and size by a step cost
(verification + drafting) and returns the topology with the most tokens per unit of cost, which
`propose_tree_topology` wraps as a SetTopology record for the topology agent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

from specpilot.ir import Program, SetTopology
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import STATIC_TOPOLOGIES, SparseTree

from .steps import teacher_forced_logits

StepCost = Callable[[int, int], float]   # (tree nodes, tree depth) -> seconds of one step


@dataclass(frozen=True)
class RankTrace:
    """ranks[i][t]: the drafter's rank (0 = its top-1) of request i's reference token t."""
    ranks: Tuple[Tuple[int, ...], ...]


@torch.no_grad()
def measure_rank_trace(drafter, prompts: Sequence[Sequence[int]], reference) -> RankTrace:
    """Teacher-force the drafter on prompt + reference tokens (an ARResult) and rank every
    reference token among the drafter's logits at the position before it."""
    if len(prompts) != len(reference.tokens):
        raise SpecPilotError(f"{len(prompts)} prompts for {len(reference.tokens)} reference "
                             "requests: measure on the prompts the reference was decoded from")
    out = []
    for prompt, ref in zip(prompts, reference.tokens):
        logits = teacher_forced_logits(drafter, (list(prompt) + list(ref))[:-1])
        at = logits[len(prompt) - 1:]                        # predicts reference token t
        want = at.gather(1, torch.tensor(ref, device=at.device)[:, None])
        out.append(tuple((at > want).sum(dim=1).tolist()))
    return RankTrace(tuple(out))


def accepted_in_tree(paths: FrozenSet[Tuple[int, ...]], ranks: Sequence[int], start: int) -> int:
    """Drafts a static tree (its rank paths) accepts in a step whose first draft is position
    `start` of a request with these reference ranks."""
    path: Tuple[int, ...] = ()
    for t in range(start, len(ranks)):
        path = path + (ranks[t],)
        if path not in paths:
            return len(path) - 1
    return len(path)


def tree_paths(topology) -> FrozenSet[Tuple[int, ...]]:
    """The rank paths of a static topology (Chain, Tree or SparseTree)."""
    if not isinstance(topology, STATIC_TOPOLOGIES):
        raise SpecPilotError(f"{topology} has no static shape")
    return frozenset(SparseTree.from_shape(topology.shape()).paths)


def mean_accepted_in_tree(topology, trace: RankTrace) -> float:
    """Mean tokens per step (accepted drafts + 1 bonus) over every start position of the trace."""
    paths = tree_paths(topology)
    counts = [accepted_in_tree(paths, ranks, s) for ranks in trace.ranks for s in range(len(ranks))]
    return 1.0 + sum(counts) / len(counts) if counts else 0.0


@dataclass(frozen=True)
class AcceptanceProfile:
    """p[d-1][r]: P(the target's token at depth d is the drafter's rank-r token | depth d
    reached); reached[d-1]: measured steps that reached depth d."""
    p: Tuple[Tuple[float, ...], ...]
    reached: Tuple[int, ...]

    @property
    def max_depth(self) -> int:
        return len(self.p)

    @property
    def max_rank(self) -> int:
        return len(self.p[0]) if self.p else 0


def profile_from_trace(trace: RankTrace, max_depth: int, max_rank: int) -> AcceptanceProfile:
    """Per-depth, per-rank acceptance: a step starting at every position walks its rank path
    while the ranks stay below `max_rank` (the widest tree considered)."""
    if max_depth < 1 or max_rank < 1:
        raise SpecPilotError(f"max_depth and max_rank must be >= 1, got {max_depth}, {max_rank}")
    hits = [[0] * max_rank for _ in range(max_depth)]
    reached = [0] * max_depth
    for ranks in trace.ranks:
        for s in range(len(ranks)):
            for d in range(max_depth):
                if s + d >= len(ranks):
                    break
                reached[d] += 1
                r = ranks[s + d]
                if r >= max_rank:
                    break
                hits[d][r] += 1
    p = tuple(tuple(h / reached[d] if reached[d] else 0.0 for h in hits[d])
              for d in range(max_depth))
    return AcceptanceProfile(p, tuple(reached))


Paths = Tuple[Tuple[int, ...], ...]


def optimal_trees(profile: AcceptanceProfile, max_nodes: int,
                  max_depth: Optional[int] = None) -> List[Tuple[float, Paths]]:
    """For n = 0..max_nodes: (expected accepted drafts, rank paths) of the best tree of at most n
    nodes and depth at most `max_depth` (default: the profile's), by the recurrence above."""
    depth = min(max_depth or profile.max_depth, profile.max_depth)
    ranks = profile.max_rank
    value = [[0.0] * (max_nodes + 1) for _ in range(depth + 2)]
    # choice[d][r][n]: nodes given to the rank-r child's subtree (0: no rank-r child)
    choice: Dict[int, List[List[int]]] = {}
    for d in range(depth, 0, -1):
        h = [[0.0] * (max_nodes + 1) for _ in range(ranks + 1)]
        pick = [[0] * (max_nodes + 1) for _ in range(ranks)]
        for r in range(ranks - 1, -1, -1):
            p = profile.p[d - 1][r]
            for n in range(1, max_nodes + 1):
                best, best_m = 0.0, 0
                for m in range(1, n + 1):
                    v = p * (1.0 + value[d + 1][m - 1]) + h[r + 1][n - m]
                    if v > best:
                        best, best_m = v, m
                h[r][n], pick[r][n] = best, best_m
        value[d] = h[0]
        choice[d] = pick
    out = []
    for n in range(max_nodes + 1):
        paths: List[Tuple[int, ...]] = []
        _rebuild(choice, 1, n, (), paths, depth, ranks)
        out.append((value[1][n], tuple(paths)))
    return out


def _rebuild(choice, d: int, n: int, prefix: Tuple[int, ...], paths: list, depth: int,
             ranks: int) -> None:
    if d > depth:
        return
    for r in range(ranks):
        m = choice[d][r][n]
        if m == 0:
            return
        paths.append(prefix + (r,))
        _rebuild(choice, d + 1, m - 1, prefix + (r,), paths, depth, ranks)
        n -= m


def expected_accepted(profile: AcceptanceProfile, paths) -> float:
    """Expected accepted drafts of a tree under the profile (sum over nodes of path products)."""
    total = 0.0
    for q in paths:
        prob = 1.0
        for d, r in enumerate(q):
            prob *= profile.p[d][r] if d < profile.max_depth and r < profile.max_rank else 0.0
        total += prob
    return total


def linear_step_cost(base: float, per_token: float, per_depth: float) -> StepCost:
    """A step cost of `base` + `per_token` per verified token (nodes + root) + `per_depth` per
    drafter level; calibrate the three from measured step costs."""
    return lambda nodes, depth: base + per_token * (nodes + 1) + per_depth * depth


def shape_tree(profile: AcceptanceProfile, step_cost: StepCost, max_nodes: int,
               max_depth: Optional[int] = None):
    """(topology, expected tokens per step, step cost) of the static tree with the most expected
    tokens (accepted drafts + bonus) per unit of `step_cost`, over every depth limit and size.
    The topology is a Chain or Tree when the best shape is regular, else a SparseTree."""
    best = best_tree(profile, lambda t: step_cost(t.num_nodes, t.depth), max_nodes, max_depth)
    if best is None:
        raise SpecPilotError("the profile accepts nothing at any depth: no tree beats plain "
                             "decoding (keep the current topology)")
    return best


def best_tree(profile: AcceptanceProfile, cost_of: Callable[[object], float], max_nodes: int,
              max_depth: Optional[int] = None):
    """`shape_tree` with the cost of a whole topology (`cost_of`), for costs that depend on
    more than its size and depth (e.g. each drafter level's width); None where the profile
    accepts nothing at any depth."""
    if max_nodes < 1:
        raise SpecPilotError(f"max_nodes must be >= 1, got {max_nodes}")
    best = None
    for depth in range(1, min(max_depth or profile.max_depth, profile.max_depth) + 1):
        for value, paths in optimal_trees(profile, max_nodes, depth)[1:]:
            if not paths:
                continue
            tree = SparseTree(paths)
            topology = tree.regular() or tree
            cost = cost_of(topology)
            if cost <= 0:
                raise SpecPilotError(f"step cost of {topology} is {cost}: costs must be positive")
            score = (1.0 + value) / cost
            if best is None or score > best[0] + 1e-12:
                best = (score, topology, 1.0 + value, cost)
    return None if best is None else best[1:]


def propose_tree_topology(program: Program, profile: AcceptanceProfile, step_cost: StepCost,
                          max_nodes: int, max_depth: Optional[int] = None) -> Optional[SetTopology]:
    """A SetTopology to the best static tree for this profile and cost, or None when the
    Program already drafts it. `apply` judges legality; forcing judges the result."""
    topology, _, _ = shape_tree(profile, step_cost, max_nodes, max_depth)
    return None if topology == program.draft.topology else SetTopology(topology)
