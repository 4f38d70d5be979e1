"""Continuous refill with static and dynamic draft trees in the graphed runtime
(runtime/graphed_tree_refill.py), rounds run eagerly on CPU in float32: every request equals
greedy AR with more requests than slots, finishing at different times; forcing is clean; a
refilled slot reading a stale row is caught."""
import pytest
import torch

from specpilot.ir.topology import DynamicTree, Tree
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_tree_refill import (GraphedDynamicTreeRefillDecoder,
                                                   GraphedTreeRefillDecoder)

from mechanism_setup import MAX_NEW, assert_clean, one_thread  # noqa: F401
from refill_setup import NoTargetPrefill, StaleLength, mixed_requests

TREES = [
    (GraphedTreeRefillDecoder, Tree((2, 2)).shape()),
    (GraphedTreeRefillDecoder, Tree((3, 1, 1)).shape()),
    (GraphedDynamicTreeRefillDecoder, DynamicTree(budget=6, depth=3, width=2)),
    (GraphedDynamicTreeRefillDecoder, DynamicTree(budget=4, depth=3, width=2)),
]


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("cls,tree", TREES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_refilled_tree_slots_give_greedy_ar_and_pass_forcing(seed, batch, cls, tree):
    s, prompts, reference = mixed_requests(seed)
    decoder = cls(s["target"], s["drafter"], batch, 64, tree, s["eos"], capture=False)
    r = decoder.generate(prompts, MAX_NEW)
    assert r.tokens == reference.tokens
    assert r.stats["refills"] == len(prompts) - batch
    assert r.mean_accepted > 1.0                       # the trees did accept drafts
    report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert_clean(report, reference)


@pytest.mark.parametrize("mutant", [StaleLength, NoTargetPrefill])
@pytest.mark.parametrize("cls,tree", TREES[::2], ids=lambda x: getattr(x, "__name__", str(x)))
def test_a_refilled_tree_slot_reading_a_stale_row_is_caught(mutant, cls, tree):
    s, prompts, reference = mixed_requests(4)
    broken = type(f"{mutant.__name__}{cls.__name__}", (mutant, cls), {})
    decoder = broken(s["target"], s["drafter"], 2, 64, tree, s["eos"], capture=False)
    assert decoder.generate(prompts, MAX_NEW).tokens != reference.tokens
