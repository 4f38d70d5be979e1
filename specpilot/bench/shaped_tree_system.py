"""The tree from measured acceptance as bench systems of its own (`mech:graphed_sequoia`,
`mech:graphed_sequoia_timed`, and `mech:graphed_sequoia_timed_fused` with the drafter in fused
kernels).

The topology agent proposes Sequoia-shaped trees inside a compile (runtime/sequoia.py), where
they compete with every other transformation; these systems measure the mechanism alone. At
each batch size they run the stock Program (graphed) with the shaped static tree that serves
the most tokens per second at that batch:

  1. the drafter's rank profile is measured on held-out prompts of the same workload (prompts
     the bench does not time, decoded by greedy AR of the target), so the shape is not fitted
     to the prompts it is timed on (`HeldOutProfile`, measured once for all of them); with no
     held-out prompt it falls back to the benched ones and the systems say so in their notes;
  2. every shape the dynamic programme gives for that profile, and the chain of every depth, is
     priced at the batch size and the best is the row's Program (tree_pricing.py,
     timed_tree_pricing.py):
     `mech:graphed_sequoia` by the cost model calibrated at that batch,
     `mech:graphed_sequoia_timed` by probe chains' and trees' rounds timed there, each kind
     fitted on its own probes (a chain and a tree round run different code). On an H200 (run 33's
     pair) the calibrated model chose 64-node trees at batch 1 and 4 that ran 0.80x and 0.86x
     the stock chain: it priced them far below what their rounds cost (BENCHMARKS.md, sixteenth
     set). In run 34 the timed pricing, then one fit over chain and tree probes, priced a
     tree's level like a chain's (0.23 ms against a tree's 0.45 ms at batch 1) and chose a
     5-node depth-4 sparse tree slower than the stock chain(4). With the two fits (run 36's
     pair, batch 1) it chose chain(3), 1.28x strong AR against the stock chain(4)'s 1.29x.

Each row says which tree it ran and how it was priced (`shaped_tree`).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from specpilot.ir import Program
from specpilot.ir.errors import SpecPilotError

from .systems import ProgramSystem
from .timed_tree_pricing import best_timed_topology, fit_chain_cost, fit_tree_cost, time_probes
from .tree_pricing import (CALIBRATION_PROMPTS, best_shaped_topology, calibrated_model,
                           with_topology)

# Held-out prompts profiled (the bench's first prompts are the timed ones): a full batch 64 for
# the calibration runs, and enough ranks per depth for the dynamic programme; decoding them
# takes a few seconds on a GPU.
HELD_OUT_PROMPTS = 64


def held_out_prompts(all_prompts: Sequence[Sequence[int]], benched: int,
                     count: int = HELD_OUT_PROMPTS) -> List[List[int]]:
    """Up to `count` prompts of the workload after the first `benched` (the timed ones)."""
    return [list(p) for p in all_prompts[benched:benched + count]]


class HeldOutProfile:
    """The drafter's rank profile on `prompts` decoded to `max_new_tokens` by greedy AR of the
    target, measured the first time a system asks (`acceptance`) and shared by every system
    given it. `benched`: the prompts are the benched ones (the workload had no others)."""

    def __init__(self, pair, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 benched: bool = False):
        if not prompts:
            raise SpecPilotError("no prompts to measure the drafter's ranks on")
        self.pair, self.prompts = pair, [list(p) for p in prompts]
        self.max_new_tokens, self.benched = max_new_tokens, benched
        self._acceptance = None

    def acceptance(self):
        if self._acceptance is None:
            from specpilot.cost.acceptance import measure_rank_profile
            from specpilot.runtime.ar import generate_ar

            reference = generate_ar(self.pair.target, self.prompts, self.max_new_tokens,
                                    self.pair.eos_ids)
            self._acceptance = measure_rank_profile(
                self.pair.drafter, self.prompts, reference.tokens,
                {"prompts": len(self.prompts), "max_new_tokens": self.max_new_tokens,
                 "held_out": not self.benched})
        return self._acceptance

    def context(self) -> int:
        """Where a call's rounds are on average: the prompts' mean length plus half the tokens
        each decodes."""
        return sum(len(p) for p in self.prompts) // len(self.prompts) + self.max_new_tokens // 2


class ShapedTreeSystem(ProgramSystem):
    """`base` (the stock Program, graphed) with, at each batch size, the shaped tree with the
    most tokens per second for `profile`'s ranks. `pricing` "calibrated": the cost model's
    predicted tokens/s (`cost_model`, default the GPU's spec calibrated at the batch size);
    "timed": probe chains' and trees' rounds timed at the batch size, a fit for each kind."""

    PRICINGS = ("calibrated", "timed")

    def __init__(self, name: str, base: Program, pair, profile: HeldOutProfile,
                 cost_model=None, graphs_only: bool = True, pricing: str = "calibrated"):
        if pricing not in self.PRICINGS:
            raise SpecPilotError(f"pricing {pricing!r}: expected one of {self.PRICINGS}")
        super().__init__(name, base, pair, (
            "stock + CaptureGraphs + the tree from measured acceptance: at each batch size the "
            "Sequoia-shaped tree (or the chain) with the most tokens per second, for the "
            "drafter's ranks on held-out prompts, priced by " + (
                "the cost model calibrated at that batch" if pricing == "calibrated" else
                "probe chains' and trees' rounds timed at that batch") + (
                "; the drafter in fused kernels" if base.kernels.drafter_kernels == "fused"
                else "")),
            graphs_only=graphs_only)
        if profile.benched:
            self.notes.append("the workload has no prompt beyond the benched ones: the tree is "
                              "shaped on the prompts it is timed on")
        self.profile, self.pricing = profile, pricing
        self._cost_model = cost_model
        self._chosen: Dict[int, Tuple[object, dict]] = {}
        self._programs: Dict[int, Program] = {}
        self.models: Dict[int, object] = {}      # batch size -> the model that chose there

    def cost_model(self, batch_size: int):
        """The model that prices the shapes at `batch_size`: the one given, else the GPU's
        spec calibrated at that batch on the profile's prompts (`calibrated_model`)."""
        if self._cost_model is not None:
            return self._cost_model
        from specpilot.cost import CostModel
        from specpilot.cost.gpu_specs import gpu_spec

        prompts = self.profile.prompts[:max(batch_size, CALIBRATION_PROMPTS)]
        return calibrated_model(CostModel(gpu_spec(self.program.gpu)),
                                ProgramSystem.at_batch(self, batch_size), self.pair, prompts,
                                self.profile.max_new_tokens, self.profile.acceptance())

    def chosen(self, batch_size: int) -> Tuple[object, dict]:
        """(topology, how it was priced) at `batch_size` (chosen once per batch size)."""
        if batch_size not in self._chosen:
            acceptance = self.profile.acceptance()
            if self.pricing == "calibrated":
                model = self.models[batch_size] = self.cost_model(batch_size)
                topology, tps = best_shaped_topology(self.program, acceptance, batch_size,
                                                     model)
                priced = {"predicted_tokens_per_s": tps,
                          "calibration": model.calibration.to_json()}
            else:
                probes = time_probes(self.pair, batch_size, self.profile.context(),
                                     self.graphed)
                # A chain round runs other code than a tree round: each kind its own fit.
                chain_fit, tree_fit = fit_chain_cost(probes), fit_tree_cost(probes)
                topology, tps = best_timed_topology(self.program, acceptance, batch_size,
                                                    chain_fit, tree_fit)
                # Full rows, no idle slots: unlike the calibrated model's figure.
                priced = {"expected_tokens_per_s_full_rows": tps,
                          "probes": {str(t): seconds for t, seconds in probes},
                          "fit_seconds": {
                              "chain": dict(zip(("base", "per_depth"), chain_fit)),
                              "tree": dict(zip(("base", "per_token", "per_depth"), tree_fit))}}
            self._chosen[batch_size] = (topology, dict(priced, pricing=self.pricing))
            # Built once per batch size: the bench asks for it in every timed run.
            self._programs[batch_size] = with_topology(ProgramSystem.at_batch(self, batch_size),
                                                       topology)
        return self._chosen[batch_size]

    def setup(self, batch_size, prompts, max_new_tokens):
        self.chosen(batch_size)         # profiled and priced before anything is timed
        super().setup(batch_size, prompts, max_new_tokens)

    def at_batch(self, batch_size: int) -> Program:
        self.chosen(batch_size)
        return self._programs[batch_size]

    def check(self, prompts, batch_size, reference, output):
        checks = super().check(prompts, batch_size, reference, output)
        topology, priced = self.chosen(batch_size)
        checks["shaped_tree"] = {"topology": str(topology),
                                 "drafted_nodes": topology.num_nodes,
                                 "depth": topology.depth,
                                 "predicted_mean_accepted":
                                     self.profile.acceptance().mean_accepted(topology),
                                 "profiled_prompts": len(self.profile.prompts), **priced}
        return checks


def shaped_tree_systems(stock: Program, pair, profile: HeldOutProfile,
                        pair_for=None) -> List[ShapedTreeSystem]:
    """Both pricings of the graphed stock Program's shaped tree, sharing `profile`, and, given
    `pair_for` (a Program -> (its pair, why it cannot run or None), as
    system_pairs.SystemPairs.for_program answers), the timed one with the drafter in fused
    kernels.
    The profile's acceptance serves both drafters: the fused one drafts the same tokens up to
    rounding (tests/runtime/test_fused_forward.py)."""
    from specpilot.ir import CaptureGraphs, SetDrafterKernels, apply

    graphed = apply(stock, CaptureGraphs(True))
    out = [ShapedTreeSystem("mech:graphed_sequoia", graphed, pair, profile),
           ShapedTreeSystem("mech:graphed_sequoia_timed", graphed, pair, profile,
                            pricing="timed")]
    if pair_for is not None:
        program = apply(graphed, SetDrafterKernels("fused"))
        own, refusal = pair_for(program)
        fused = ShapedTreeSystem("mech:graphed_sequoia_timed_fused", program, own, profile,
                                 pricing="timed")
        fused.refusal = refusal or fused.refusal
        out.append(fused)
    return out
