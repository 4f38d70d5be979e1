"""Programs with CaptureGraphs run on the graphed runtime with the decoder their topology needs
(chain, static tree, dynamic tree; each with continuous refill too, and adaptive lengths on
chains), decode exactly as greedy AR and pass forcing, and forcing reuses the decoder the timed
runs used (rounds run eagerly on CPU)."""
import pytest

from specpilot.ir import (CaptureGraphs, SetAcceptKernels, SetDraftLengthPolicy,
                          SetLengthEstimator, SetRefill, SetTopology)
from specpilot.ir.topology import Chain, DynamicTree, Tree
from specpilot.runtime.decoder import ModelPair
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_dynamic import GraphedDynamicTreeDecoder
from specpilot.runtime.graphed_program import (decoder_for, force_graphed, release_decoders,
                                               rounds_refusal, run_graphed)
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.graphed_tree import GraphedTreeDecoder
from specpilot.runtime.graphed_tree_refill import (GraphedDynamicTreeRefillDecoder,
                                                   GraphedTreeRefillDecoder)

from mechanism_setup import MAX_NEW, assert_clean, pair_setup, program_of, run_program_graphed


@pytest.mark.parametrize("topology,decoder_class,batch", [
    (Chain(3), GraphedChainDecoder, 2),
    (Tree((2, 2)), GraphedTreeDecoder, 3),
    (DynamicTree(budget=6, depth=3, width=2), GraphedDynamicTreeDecoder, 4),
], ids=str)
def test_each_topology_runs_and_forces_on_its_graphed_decoder(topology, decoder_class, batch):
    s = pair_setup(11)
    # none of these is the stock chain(4): each is set by the transformation
    program = program_of(s, CaptureGraphs(True), SetTopology(topology), batch=batch)
    assert program.draft.topology == topology
    _, r = run_program_graphed(s, program, decoder_class)
    assert r.mean_accepted > 1.0


@pytest.mark.parametrize("topology,decoder_class", [
    (None, GraphedRefillDecoder),                                   # the stock chain(4)
    (Tree((2, 1)), GraphedTreeRefillDecoder),
    (DynamicTree(budget=5, depth=3, width=2), GraphedDynamicTreeRefillDecoder),
], ids=str)
def test_a_refill_program_runs_every_request_on_the_refill_decoder_of_its_topology(
        topology, decoder_class):
    s = pair_setup(4)
    steps = [CaptureGraphs(True), SetRefill("continuous")]
    steps += [SetTopology(topology)] if topology is not None else []
    program = program_of(s, *steps, batch=2)
    assert rounds_refusal(program) is None
    _, r = run_program_graphed(s, program, decoder_class)
    assert r.mean_accepted > 1.0
    assert r.stats["refills"] == len(s["prompts"]) - 2     # one call: the slots were refilled


def test_an_adaptive_refill_program_runs_adaptive_lengths_on_the_refill_decoder():
    s = pair_setup(11)
    program = program_of(s, CaptureGraphs(True), SetRefill("continuous"),
                         SetDraftLengthPolicy("per_request_adaptive", token_budget=8), batch=2)
    assert rounds_refusal(program) is None
    decoder, r = run_program_graphed(s, program, GraphedRefillDecoder)
    # the budget of 8 tokens on 2 slots leaves chains of up to 3 drafts
    assert decoder.adaptive and decoder.length_cap == 3
    assert decoder.policy.objective == "throughput"
    assert r.stats["refills"] == len(s["prompts"]) - 2
    # The call says what its length rule decided by, through run_graphed: the decoder's prices
    assert r.length_rule["prices"] == [round(float(c), 4) for c in decoder.policy.round_cost_host]


@pytest.mark.parametrize("refill", [False, True])
def test_the_per_depth_estimator_runs_in_the_adaptive_decoder_and_keeps_the_output(refill):
    s = pair_setup(7)
    steps = [CaptureGraphs(True), *([SetRefill("continuous")] if refill else []),
             SetDraftLengthPolicy("per_request_adaptive", token_budget=8)]
    program = program_of(s, *steps, SetLengthEstimator("per_depth"), batch=2)
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    release_decoders()
    decoder = decoder_for(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert type(decoder) is (GraphedRefillDecoder if refill else GraphedChainDecoder)
    assert decoder.policy.estimator == "per_depth" and decoder.policy.depth is not None
    # Every round's update takes the per-depth state (its four tensors after the others).
    seen, inner = [], decoder.policy._round

    def round_spy(*args):
        seen.append(args[-4:])
        return inner(*args)

    decoder.policy._round = round_spy
    r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert r.tokens == s["reference"].tokens
    depth = decoder.policy.depth
    assert seen and all(a[0] is depth.rates and a[3] is depth.workload for a in seen)
    assert_clean(force_graphed(program, pair, s["prompts"], s["reference"], capture=False),
                 s["reference"])
    # A Program with the other estimator gets a decoder of its own.
    geometric = program_of(s, *steps, batch=2)
    other = decoder_for(geometric, pair, s["prompts"], MAX_NEW, capture=False)
    assert other is not decoder and other.policy.depth is None
    release_decoders()


def test_forcing_checks_the_decoder_the_timed_runs_used_when_references_stop_early():
    from specpilot.runtime import graphed_program
    from specpilot.runtime.ar import ARResult

    s = pair_setup(11)
    program = program_of(s, CaptureGraphs(True), batch=2)
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    release_decoders()
    run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    timed = dict(graphed_program._decoders)
    # Every reference cut to 4 tokens: they need 12 slots fewer, a smaller capacity bucket.
    ref = s["reference"]
    short = ARResult([t[:4] for t in ref.tokens], [m[:4] for m in ref.margins])
    smaller = decoder_for(program, pair, s["prompts"], 4, capture=False)
    assert smaller.capacity < next(iter(timed.values())).capacity
    release_decoders()
    graphed_program._decoders.update(timed)
    assert_clean(force_graphed(program, pair, s["prompts"], short, capture=False), short)
    assert graphed_program._decoders == timed          # no decoder of its own was built


@pytest.mark.parametrize("refill,adaptive", [(False, False), (True, False), (True, True)])
def test_a_fused_accept_program_ends_its_rounds_in_one_kernel_and_keeps_the_output(refill,
                                                                                  adaptive):
    s = pair_setup(4)
    steps = [CaptureGraphs(True), *([SetRefill("continuous")] if refill else []),
             *([SetDraftLengthPolicy("per_request_adaptive", token_budget=8)] if adaptive
               else []), SetAcceptKernels("fused")]
    program = program_of(s, *steps, batch=2)
    decoder, r = run_program_graphed(s, program, GraphedRefillDecoder if refill
                                     else GraphedChainDecoder)
    assert decoder._commit_kernels is not None and decoder.adaptive == adaptive
    ops = program_of(s, *steps[:-1], batch=2)      # kept decoders are kept per accept kernels
    other = decoder_for(ops, ModelPair(s["target"], s["drafter"], None, s["eos"]), s["prompts"],
                        MAX_NEW, capture=False)
    assert other._commit_kernels is None and other is not decoder
    assert run_graphed(ops, ModelPair(s["target"], s["drafter"], None, s["eos"]), s["prompts"],
                       MAX_NEW, capture=False).accepted_lengths == r.accepted_lengths
