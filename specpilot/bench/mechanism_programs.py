"""The verification and batching mechanisms as bench systems, each derived from the stock
Program by its own transformations, alone and combined (`specpilot bench --mechanisms`).

  graphed_adaptive    CaptureGraphs + adaptive chain lengths, the token budget at the target's
                      compute ridge for each batch size (speculation off where it leaves no room)
  graphed_tree        CaptureGraphs + a static tree (3, 2, 1): same drafter depth as chain(3),
                      more candidates per level
  graphed_refill      CaptureGraphs + continuous refill: chain(4), a finished request's slot
                      refilled between two replays (differs from stock_graphed only where
                      there are more prompts than slots)
  graphed_adaptive_refill  the two combined in the graphed runtime: adaptive lengths for the
                      batch's tokens per unit of time, slots refilled (turned off where plain
                      steps would serve faster, until a newcomer alone starts the batch anew)
  graphed_dynamic     CaptureGraphs + a dynamic tree of 8 nodes (depth 4, width 2): the tree is
                      data, one graph serves every tree of the budget
  graphed_tree_refill, graphed_dynamic_refill   the two trees with continuous refill, graphed
  graphed_fused_drafter   CaptureGraphs + the drafter in fused layer kernels
                      (runtime/fused_forward.py): stock chain(4), its drafter steps cheaper
  graphed_refill_fused, graphed_adaptive_fused, graphed_adaptive_refill_fused,
  graphed_tree_fused, graphed_tree_refill_fused
                      graphed_refill, graphed_adaptive, graphed_adaptive_refill, graphed_tree
                      and graphed_tree_refill with the fused drafter (the length rule measures
                      the cheaper rounds; a tree's levels run several nodes a request through
                      it)
  graphed_accept, graphed_refill_fused_accept, graphed_adaptive_refill_fused_accept
                      stock_graphed, graphed_refill_fused and graphed_adaptive_refill_fused
                      with each round's end in one generated kernel (SetAcceptKernels("fused"),
                      the chain_commit family) rather than some forty torch ops: speculation's
                      own bookkeeping, so the stock Program is measured with it too
  graphed_attention, graphed_fused_attention, graphed_refill_fused_attention,
  graphed_adaptive_refill_fused_attention, graphed_tree_fused_attention,
  graphed_tree_refill_fused_attention
                      stock_graphed, graphed_fused_drafter, graphed_refill_fused,
                      graphed_adaptive_refill_fused, graphed_tree_fused and
                      graphed_tree_refill_fused with the torch backend's attention by the
                      generated kernel (runtime/generated_attention.py): a kernel choice, not a
                      mechanism, so the stock Program is measured with it too
  graphed_ar_attention   greedy AR of the target (no drafter), graphed, with the generated
                      attention: what strong_ar would run with it
  graphed_layers_attention, graphed_refill_fused_layers_attention,
  graphed_adaptive_refill_fused_layers_attention,
  graphed_adaptive_refill_fused_layers_attention_chain8, graphed_ar_layers_attention
                      graphed_attention, graphed_refill_fused_attention,
                      graphed_adaptive_refill_fused_attention, its chains of up to 8 and
                      graphed_ar_attention with the target (and the model drafter, where one
                      runs) on compiled whole layers (SetFastPath("layers")), the generated
                      attention called from them (runtime/compiled_attention.py): kernel
                      choices again, so the stock Program and greedy AR are measured with them
  graphed_adaptive_refill_fused_depth, graphed_adaptive_refill_fused_attention_depth,
  graphed_adaptive_refill_fused_accept_depth
                      graphed_adaptive_refill_fused, its attention twin and its one-kernel-end
                      twin with the length rule's per-depth estimate
                      (SetLengthEstimator("per_depth"), runtime/depth_acceptance.py): drafts
                      that agree in runs priced as runs
  graphed_adaptive_refill_fused_accept_depth_drain   the last with the throughput drain
                      (SetLengthDrain("throughput")): once the queue is empty the length keeps
                      the batch's time per token, not its makespan (runtime/batch_length.py)
  graphed_adaptive_refill_fused_chain8   the same with chains of up to 8 drafts, not 4: a
                      pair whose drafter agrees well may pay for a fifth draft and more, and the
                      length rule prices each length's round before it picks one
  graphed_adaptive_refill_fused_attention_chain8   the chains of up to 8 with the generated
                      attention
  graphed_adaptive_refill_fused_chain8_depth, graphed_adaptive_refill_fused_attention_chain8_depth
                      the chains of up to 8 with the per-depth estimate: what depths 5-8 accept
                      is learned per request, not extrapolated from one per-draft acceptance
  dynamic_tree        the same dynamic tree, eager
  two_level           a static tree pruned by every other layer of the target first, eager
  graphed_two_level   the same, graphed: the cheap verifier's greedy path (top-1) is what the
                      full target verifies
  ragged              the ragged verification layout, eager
  refill              continuous refill, eager
  ragged_adaptive_refill   the three batching mechanisms combined, eager
  graphed_sequoia     CaptureGraphs + the tree from measured acceptance: at each batch size the
                      Sequoia-shaped tree (or chain) the calibrated cost model ranks first,
                      shaped on held-out prompts (shaped_tree_system.py, tree_pricing.py,
                      timed_tree_pricing.py)
  graphed_sequoia_timed   the same, each shape priced by probe rounds timed at that batch,
                      chains by chains', trees by trees' (Sequoia's hardware-aware pricing)
  graphed_sequoia_timed_fused   the same with the fused drafter, its probes timed with it

The eager mechanisms run their host loops in Python; they are measured as they are, next to the
graphed ones, so that what graph capture would bring them is visible.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

from specpilot.ir import (CaptureGraphs, Chain, DynamicTree, LayerSkipPrune, Program,
                          SetAcceptKernels, SetAttentionKernels, SetBatchLayout, SetDrafter,
                          SetDrafterKernels, SetDraftLengthPolicy, SetFastPath,
                          SetLengthDrain, SetLengthEstimator, SetRefill, SetTopology,
                          SetVerifyPrune, Tree,
                          replay)

from .shaped_tree_system import HeldOutProfile, shaped_tree_systems
from .system_pairs import SystemPairs
from .systems import ProgramSystem


class BudgetedProgramSystem(ProgramSystem):
    """An adaptive-length Program whose token budget is set for each batch size: the target's
    compute ridge on the Program's GPU, between one token per request and a full chain each."""

    def at_batch(self, batch_size: int) -> Program:
        from specpilot.agents.batching import ridge_budget, ridge_capped_budget

        sized = replace(self.program, batch=replace(self.program.batch, max_batch_size=batch_size))
        budget = ridge_capped_budget(batch_size, self.program.draft.topology.k,
                                     ridge_budget(sized))
        return replace(sized, batch=replace(sized.batch, token_budget=budget))


def mechanism_programs(stock: Program) -> Dict[str, Program]:
    """name → Program, every one built from `stock` by transformations (so `history` says how)."""
    layers = stock.models.target.num_layers
    half = tuple(range(0, layers, 2))
    k = stock.draft.topology.k
    dynamic = SetTopology(DynamicTree(budget=8, depth=4, width=2))
    tree, pruned_tree = SetTopology(Tree((3, 2, 1))), SetTopology(Tree((2, 2, 1)))
    prune = SetVerifyPrune(LayerSkipPrune(keep_layers=half, top_k=1))

    def adaptive_up_to(longest: int) -> SetDraftLengthPolicy:
        """Adaptive lengths, the budget a full chain(longest) each (BudgetedProgramSystem then
        sets it per batch size from the Program's own k)."""
        return SetDraftLengthPolicy("per_request_adaptive",
                                    stock.batch.max_batch_size * (longest + 1))

    adaptive = adaptive_up_to(k)
    long_chain = [SetTopology(Chain(8)), adaptive_up_to(8)]         # chains of up to 8 drafts
    graphs, refill = CaptureGraphs(True), SetRefill("continuous")
    fused, attention = SetDrafterKernels("fused"), SetAttentionKernels("generated")
    layers = SetFastPath("layers")
    depth = SetLengthEstimator("per_depth")
    throughput_drain = SetLengthDrain("throughput")
    accept = SetAcceptKernels("fused")
    return {name: replay(stock, steps) for name, steps in {
        "graphed_adaptive": [graphs, adaptive],
        "graphed_refill": [graphs, refill],
        "graphed_adaptive_refill": [graphs, adaptive, refill],
        "graphed_tree": [graphs, tree],
        "graphed_dynamic": [graphs, dynamic],
        "graphed_tree_refill": [graphs, tree, refill],
        "graphed_dynamic_refill": [graphs, dynamic, refill],
        "graphed_fused_drafter": [graphs, fused],
        "graphed_tree_fused": [graphs, tree, fused],
        "graphed_tree_refill_fused": [graphs, tree, refill, fused],
        "graphed_refill_fused": [graphs, refill, fused],
        "graphed_adaptive_fused": [graphs, adaptive, fused],
        "graphed_adaptive_refill_fused": [graphs, adaptive, refill, fused],
        "graphed_adaptive_refill_fused_chain8": [graphs, *long_chain, refill, fused],
        "graphed_adaptive_refill_fused_depth": [graphs, adaptive, refill, fused, depth],
        "graphed_adaptive_refill_fused_chain8_depth": [graphs, *long_chain, refill, fused,
                                                       depth],
        "graphed_adaptive_refill_fused_attention_chain8": [graphs, *long_chain, refill, fused,
                                                           attention],
        "graphed_adaptive_refill_fused_attention_chain8_depth": [graphs, *long_chain, refill,
                                                                 fused, attention, depth],
        "graphed_adaptive_refill_fused_attention_depth": [graphs, adaptive, refill, fused,
                                                          attention, depth],
        "graphed_accept": [graphs, accept],
        "graphed_refill_fused_accept": [graphs, refill, fused, accept],
        "graphed_adaptive_refill_fused_accept": [graphs, adaptive, refill, fused, accept],
        "graphed_adaptive_refill_fused_accept_depth": [graphs, adaptive, refill, fused, accept,
                                                       depth],
        "graphed_adaptive_refill_fused_accept_depth_drain": [graphs, adaptive, refill, fused,
                                                             accept, depth, throughput_drain],
        "graphed_attention": [graphs, attention],
        "graphed_fused_attention": [graphs, fused, attention],
        "graphed_refill_fused_attention": [graphs, refill, fused, attention],
        "graphed_adaptive_refill_fused_attention": [graphs, adaptive, refill, fused, attention],
        "graphed_tree_fused_attention": [graphs, tree, fused, attention],
        "graphed_tree_refill_fused_attention": [graphs, tree, refill, fused, attention],
        "graphed_ar_attention": [SetDrafter("none"), graphs, attention],
        "graphed_layers_attention": [graphs, layers, attention],
        "graphed_refill_fused_layers_attention": [graphs, refill, fused, layers, attention],
        "graphed_adaptive_refill_fused_layers_attention": [graphs, adaptive, refill, fused,
                                                           layers, attention],
        "graphed_adaptive_refill_fused_layers_attention_chain8": [graphs, *long_chain, refill,
                                                                  fused, layers, attention],
        "graphed_ar_layers_attention": [SetDrafter("none"), graphs, layers, attention],
        "dynamic_tree": [dynamic],
        "two_level": [pruned_tree, prune],
        "graphed_two_level": [graphs, pruned_tree, prune],
        "ragged": [SetBatchLayout("ragged")],
        "refill": [refill],
        "ragged_adaptive_refill": [SetBatchLayout("ragged"), adaptive, refill],
    }.items()}


def mechanism_systems(stock: Program, pair,
                      profile: Optional[HeldOutProfile] = None) -> List[ProgramSystem]:
    """Every mechanism Program as a system; with a held-out rank `profile` (None: they are left
    out) also the tree from measured acceptance, shaped on it (shaped_tree_system.py)."""
    out: List[ProgramSystem] = []
    pair_for = SystemPairs(pair).for_program    # one pair of each kind for the systems that ask
    for name, program in mechanism_programs(stock).items():
        steps = ", ".join(str(t) for t in program.history)
        cls = BudgetedProgramSystem if program.batch.draft_length_policy != "fixed" else ProgramSystem
        own, refusal = pair_for(program)
        system = cls(f"mech:{name}", program, own, f"stock + {steps}",
                     graphs_only=program.kernels.capture_graphs)
        system.refusal = refusal or system.refusal
        out.append(system)
    if profile is not None:
        out += shaped_tree_systems(stock, pair, profile, pair_for)
    return out
