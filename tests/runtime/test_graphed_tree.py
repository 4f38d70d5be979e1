"""The device-resident static-tree decoder (runtime/graphed_tree.py), its rounds run eagerly
(capture=False) on CPU in float32 against greedy AR and the eager tree decoder."""
import pytest
import torch

from specpilot.ir import Tree
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_tree import GraphedTreeDecoder
from specpilot.runtime.speculative import speculative_generate

from mechanism_setup import MAX_NEW, ContraryDrafter, assert_caught, assert_clean, pair_setup

TREES = [(2, 2), (3, 2, 1), (2, 1, 1), (1, 1), (4,)]


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("branching", TREES)
def test_equals_greedy_ar_and_the_eager_tree_decoders_acceptance(seed, branching):
    s = pair_setup(seed)
    shape = Tree(branching).shape()
    decoder = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, shape, s["eos"],
                                 capture=False, rounds_per_replay=2)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    eager = speculative_generate(s["target"], s["drafter"], s["prompts"], MAX_NEW, shape)
    plain = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, shape, capture=False,
                               rounds_per_replay=1).generate(s["prompts"], MAX_NEW)
    assert plain.tokens == eager.tokens == s["plain"].tokens
    assert plain.accepted_lengths == eager.accepted_lengths


def test_a_wider_tree_accepts_at_least_as_much_as_its_first_child_chain():
    s = pair_setup(11)
    chain = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, Tree((1, 1, 1)).shape(),
                               capture=False).generate(s["prompts"], MAX_NEW)
    tree = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, Tree((3, 2, 1)).shape(),
                              capture=False).generate(s["prompts"], MAX_NEW)
    assert tree.mean_accepted >= chain.mean_accepted
    assert tree.tokens == chain.tokens


def test_forcing_is_clean_and_catches_a_missing_compaction():
    s = pair_setup(4)
    ref = s["reference"]
    shape = Tree((2, 2)).shape()
    decoder = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, shape, capture=False)
    assert_clean(compare_to_reference(decoder.force(s["prompts"], ref.tokens), ref,
                                      default_tolerance(torch.float32)), ref)

    class NoCompaction(GraphedTreeDecoder):
        def _compact(self, base, path, drafter_path=None):
            pass

    broken = NoCompaction(s["target"], s["drafter"], 4, 64, shape, capture=False)
    assert_caught(compare_to_reference(broken.force(s["prompts"], ref.tokens), ref,
                                       default_tolerance(torch.float32)), ref)
    assert broken.generate(s["prompts"], MAX_NEW).tokens != ref.tokens


def test_always_wrong_drafter_and_margins():
    s = pair_setup(11)
    decoder = GraphedTreeDecoder(s["target"], ContraryDrafter(s["target"]), 4, 64,
                                 Tree((2, 2)).shape(), s["eos"], capture=False,
                                 record_margins=True)
    r = decoder.generate_reference(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    for g, w in zip(r.margins, s["reference"].margins):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-4, atol=1e-4)
    with pytest.raises(SpecPilotError, match="drafter"):
        GraphedTreeDecoder(s["target"], None, 4, 64, Tree((2,)).shape(), capture=False)


def test_sparse_trees_whose_deepest_branch_is_not_the_first_child():
    from specpilot.ir.topology import SparseTree

    s = pair_setup(4)
    # The deepest node hangs under the root's second choice.
    shape = SparseTree(((0,), (1,), (0, 0), (1, 0), (1, 0, 0))).shape()
    decoder = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, shape, s["eos"], capture=False)
    assert decoder.generate(s["prompts"], MAX_NEW).tokens == s["reference"].tokens
    assert_clean(compare_to_reference(decoder.force(s["prompts"], s["reference"].tokens),
                                      s["reference"], default_tolerance(torch.float32)),
                 s["reference"])
