"""Verification-topology agent: the chain length and the static tree shape that the measured
acceptance makes fastest.

Candidates: chains, regular trees, the best irregular (sparse) tree of each size and depth for
the measured ranks (Sequoia-style shaping, runtime/sequoia.py) and dynamic trees of the same
budgets (cost/topologies.py). Each is costed with the deployment's acceptance model: with a
measured rank profile the accepted lengths of a static shape are replayed from the drafter's
per-position ranks, so a tree is credited exactly with what its branches would have caught on
the workload (a dynamic tree is estimated by the best static tree of its budget). The best
predicted shapes are proposed, best first; a large tree is also offered two-level verification
(runtime/two_level.py), which the roofline does not cost and the measurement judges.
"""
from __future__ import annotations

from typing import List

from specpilot.ir import (Chain, LayerSkipPrune, Program, SetDraftLength, SetTopology,
                          SetVerifyPrune, Transformation)

from specpilot.cost.topologies import candidate_topologies, dynamic_variants, shaped_topologies

from .base import Agent, Budget, rank_by_prediction


def topology_transformation(program: Program, topology) -> Transformation:
    """SetDraftLength between chains (the idiomatic record), SetTopology otherwise."""
    if isinstance(topology, Chain) and isinstance(program.draft.topology, Chain):
        return SetDraftLength(topology.k)
    return SetTopology(topology)


# Below this many drafted nodes a pruning pass costs more than the verification it saves.
PRUNE_MIN_NODES = 8


def two_level_proposals(program: Program) -> List[Transformation]:
    """Prune a large tree with the target's first half of layers before the full target
    verifies the survivors (each parent keeps its children among the cheap path's top-2)."""
    layers = program.models.target.num_layers
    if (program.draft.topology.num_nodes < PRUNE_MIN_NODES or layers < 2
            or getattr(program.verify, "prune", None) is not None):
        return []
    return [SetVerifyPrune(LayerSkipPrune(tuple(range(layers // 2)), 2))]


def topology_family(t: Transformation) -> str:
    """The shape family a proposal sets: Chain, Tree, SparseTree or DynamicTree."""
    topology = getattr(t, "topology", None)
    return "Chain" if topology is None else type(topology).__name__


def diverse_best(ranked, n: int) -> List[Transformation]:
    """Up to `n` of `ranked` ((predicted gain, t), best first): the best of each shape family
    first, then the rest by prediction; returned best first. The roofline errs most on shapes
    unlike those measured so far (on the H200 it priced 30-64-node trees above the chain that
    beat them by 21-24 %, because a graphed round costs by its kernel count), so one proposal
    per family lets the measurement correct it instead of spending a round on one family."""
    chosen, families = [], set()
    for pair in ranked:
        family = topology_family(pair[1])
        if family not in families and len(chosen) < n:
            chosen.append(pair)
            families.add(family)
    for pair in ranked:
        if len(chosen) >= n:
            break
        if pair not in chosen:
            chosen.append(pair)
    chosen.sort(key=lambda pair: -pair[0])
    return [t for _, t in chosen]


class TopologyAgent(Agent):
    direction = "topology"
    categories = ("topology", "verification_compute", "drafting")

    def __init__(self, cost_model, acceptance, topologies=None):
        super().__init__()
        self.cost_model, self.acceptance = cost_model, acceptance
        if topologies is None:
            shaped = shaped_topologies(acceptance)
            topologies = candidate_topologies() + shaped + dynamic_variants(shaped)
        self.topologies = tuple(topologies)

    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        self._reset()
        proposals = [topology_transformation(program, t) for t in self.topologies
                     if t != program.draft.topology]
        legal = self._legal(program, proposals, memory)
        ranked = rank_by_prediction(program, legal, self.cost_model, self.acceptance,
                                    program.batch.max_batch_size)
        if not ranked:
            self.notes.append(f"no chain or tree is predicted to beat {program.draft.topology} "
                              f"with {self.acceptance.label}")
        out = diverse_best(ranked, budget.max_proposals)
        # Two-level verification pays when the target verifies many nodes; the roofline does
        # not cost it, so it only takes a slot the shapes left free.
        if len(out) < budget.max_proposals:
            out += self._legal(program, two_level_proposals(program), memory)[
                :budget.max_proposals - len(out)]
        return out
