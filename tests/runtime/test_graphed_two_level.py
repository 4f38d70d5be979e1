"""Two-level verification in the graphed runtime (runtime/graphed_two_level.py), rounds run
eagerly on CPU in float32: greedy AR output whatever the cheap verifier keeps; with every layer
kept the cheap verifier is the target, so each round accepts exactly what the static tree
decoder accepts; forcing clean; a round that lets the cheap path decide is caught; and Programs
declaring it run on it (or are refused with the reason)."""
import re

import pytest
import torch

from specpilot.ir import (CaptureGraphs, LayerSkipPrune, LowPrecisionPrune, SetRefill,
                          SetTopology, SetVerifyPrune)
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import DynamicTree, Tree
from specpilot.runtime.decoder import ModelPair
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_program import decoder_for, rounds_refusal
from specpilot.runtime.graphed_tree import GraphedTreeDecoder
from specpilot.runtime.graphed_two_level import GraphedTwoLevelDecoder

from mechanism_setup import (MAX_NEW, assert_clean, one_thread,  # noqa: F401
                             pair_setup, program_of, run_program_graphed)

TREES = [Tree((2, 2, 1)), Tree((3, 2, 1)), Tree((2, 2))]


def _layers(s):
    return s["target"].config.num_layers


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("tree", TREES, ids=str)
@pytest.mark.parametrize("batch", [3, 4])
def test_equals_greedy_ar_and_forcing_is_clean_with_half_the_layers(seed, tree, batch):
    s = pair_setup(seed)
    ref = s["reference"]
    decoder = GraphedTwoLevelDecoder(s["target"], s["drafter"], batch, 64, tree.shape(),
                                     tuple(range(0, _layers(s), 2)), s["eos"], capture=False)
    outputs = []
    for start in range(0, len(s["prompts"]), batch):
        outputs += decoder.generate(s["prompts"][start:start + batch], MAX_NEW).tokens
    assert outputs == ref.tokens
    proposals = []
    for start in range(0, len(s["prompts"]), batch):
        chunk = slice(start, start + batch)
        proposals += decoder.force(s["prompts"][chunk], ref.tokens[chunk])
    assert_clean(compare_to_reference(proposals, ref, default_tolerance(torch.float32)), ref)


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("tree", TREES, ids=str)
def test_with_every_layer_kept_it_accepts_as_the_static_tree(seed, tree):
    # The cheap verifier is then the target: its greedy walk is the target's accepted path, and
    # the full target verifies exactly that path (the same drafts, the same acceptance).
    s = pair_setup(seed)
    two = GraphedTwoLevelDecoder(s["target"], s["drafter"], 4, 64, tree.shape(),
                                 tuple(range(_layers(s))), s["eos"], capture=False)
    static = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, tree.shape(), s["eos"],
                                capture=False)
    got, want = (d.generate(s["prompts"], MAX_NEW) for d in (two, static))
    assert got.tokens == want.tokens == s["reference"].tokens
    assert got.accepted_lengths == want.accepted_lengths
    assert got.mean_accepted > 1.5
    rounds = got.target_forwards - 1                     # after the one prefill
    assert got.stats == {f"rounds_chain_{tree.shape().max_depth}": rounds,
                         "cheap_forwards": rounds}


def test_a_round_where_the_cheap_path_decides_is_caught():
    class CheapDecides(GraphedTwoLevelDecoder):
        """GraphedTwoLevelDecoder._round, but committing the cheap verifier's path as if the
        full target had accepted all of it. Forced rounds are the chain's (they never run
        `_round`), so the exactness test, not forcing, must catch it."""

        def _round(self, k):
            base = self._base()
            mask = self._round_mask(base)
            nodes = self._draft_tree(base, mask)
            path, path_len = self._cheap_path(base, nodes, mask)
            drafts = torch.where(path >= 0, nodes.gather(1, path.clamp(min=0)),
                                 torch.zeros_like(path))
            g = self._verify(drafts)
            committed = torch.cat([drafts, g[:, -1:]], dim=1).scatter(
                1, path_len[:, None], g.gather(1, path_len[:, None]))
            self._move_path(base, path, ((self.dcache, path), (self.ccache, path)))
            self._commit(committed, path_len)

    s = pair_setup(11)
    decoder = CheapDecides(s["target"], s["drafter"], 4, 64, TREES[0].shape(), (0,), s["eos"],
                           capture=False)
    assert decoder.generate(s["prompts"], MAX_NEW).tokens != s["reference"].tokens


def test_a_program_declaring_it_runs_on_it_and_what_it_cannot_run_is_refused():
    s = pair_setup(4)
    half = tuple(range(0, _layers(s), 2))
    prune = SetVerifyPrune(LayerSkipPrune(keep_layers=half, top_k=1))
    graphs, tree = CaptureGraphs(True), SetTopology(Tree((2, 2, 1)))
    program = program_of(s, graphs, tree, prune, batch=2)
    assert rounds_refusal(program) is None
    run_program_graphed(s, program, GraphedTwoLevelDecoder)
    # The same span without the pruned verifier is another decoder, not this one.
    plain = program_of(s, graphs, tree, batch=2)
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    plain_decoder = decoder_for(plain, pair, s["prompts"], MAX_NEW, capture=False)
    assert type(plain_decoder) is GraphedTreeDecoder
    refused = {
        "top_k=1": [tree, SetVerifyPrune(LayerSkipPrune(keep_layers=half, top_k=2))],
        "(layer_skip)": [tree, SetVerifyPrune(LowPrecisionPrune(dtype="bfloat16", top_k=1))],
        "static trees": [SetTopology(DynamicTree(budget=6, depth=3, width=2)), prune],
        "continuous refill": [tree, prune, SetRefill("continuous")],
    }
    for words, steps in refused.items():
        p = program_of(s, graphs, *steps, batch=2)
        assert words in rounds_refusal(p), words
        with pytest.raises(SpecPilotError, match=re.escape(words)):
            decoder_for(p, pair, s["prompts"], MAX_NEW, capture=False)
