"""Programs with CaptureGraphs run on the graphed runtime with the decoder their topology needs
(chain, static tree, dynamic tree), decode exactly as greedy AR and pass forcing (rounds run
eagerly on CPU)."""
from dataclasses import replace

import pytest

from specpilot.deploy import build_deployment
from specpilot.ir import CaptureGraphs, SetTopology, apply, stock_program
from specpilot.ir.topology import Chain, DynamicTree, Tree
from specpilot.runtime.decoder import ModelPair
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_dynamic import GraphedDynamicTreeDecoder
from specpilot.runtime.graphed_program import (decoder_for, force_graphed, release_decoders,
                                               run_graphed)
from specpilot.runtime.graphed_tree import GraphedTreeDecoder

from mechanism_setup import MAX_NEW, assert_clean, pair_setup


@pytest.mark.parametrize("topology,decoder_class,batch", [
    (Chain(3), GraphedChainDecoder, 2),
    (Tree((2, 2)), GraphedTreeDecoder, 3),
    (DynamicTree(budget=6, depth=3, width=2), GraphedDynamicTreeDecoder, 4),
], ids=str)
def test_each_topology_runs_and_forces_on_its_graphed_decoder(topology, decoder_class, batch):
    s = pair_setup(11)
    stock = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    program = apply(stock, CaptureGraphs(True))
    if topology != program.draft.topology:
        program = apply(program, SetTopology(topology))
    program = replace(program, batch=replace(program.batch, max_batch_size=batch))
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    release_decoders()
    assert type(decoder_for(program, pair, s["prompts"], MAX_NEW, capture=False)) is decoder_class
    r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert r.tokens == s["reference"].tokens and r.mean_accepted > 1.0
    assert_clean(force_graphed(program, pair, s["prompts"], s["reference"], capture=False),
                 s["reference"])
