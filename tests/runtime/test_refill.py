"""Continuous refill: a finished request's slot takes the next queued request at once, whose
prefill shares the step's forward with the others' decoding. Checked by hand (the schedule),
against greedy AR and by forcing; a newcomer that trusts the slot's old K/V must be caught.
"""
import pytest

from specpilot.ir.topology import Chain, DynamicTree
from specpilot.runtime import refill
from specpilot.runtime.dynamic_tree import DynamicProposer
from specpilot.runtime.tree_drafting import StaticProposer

from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import SEEDS, assert_caught, assert_clean, decode, force, pair_setup

PROPOSERS = {"chain3": lambda: StaticProposer(Chain(3)),
             "dynamic": lambda: DynamicProposer(DynamicTree(6, 3, 3))}


def finish(scheduler, row):
    scheduler.slots[row].done = True


@pytest.mark.parametrize("policy", ["drain", "continuous"])
def test_schedule_by_hand(policy):
    prompts = [[1], [2, 3], [4], [5, 6, 7], [8]]
    s = refill.SlotScheduler(prompts, None, 2, policy)
    assert s.fill() == [0, 1] and [r.index for r in s.slots] == [0, 1]
    finish(s, 1)
    if policy == "drain":
        assert s.fill() == [] and s.active() == [0]          # slot 1 waits for the batch
        finish(s, 0)
        assert s.fill() == [0, 1] and [r.index for r in s.slots] == [2, 3]
    else:
        assert s.fill() == [1] and [r.index for r in s.slots] == [0, 2]
        finish(s, 0)
        assert s.fill() == [0] and [r.index for r in s.slots] == [3, 2]
    newcomer = s.slots[0]
    assert newcomer.committed == prompts[newcomer.index]
    assert (newcomer.target_len, newcomer.drafter_len, newcomer.cheap_len) == (0, 0, 0)
    for row in s.active():
        finish(s, row)
    s.fill()
    for row in s.active():
        finish(s, row)
    assert [r.index for r in s.results()] == [0, 1, 2, 3, 4] and s.admissions == 5


@pytest.mark.parametrize("layout", ["padded", "ragged"])
@pytest.mark.parametrize("proposer", sorted(PROPOSERS))
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_ar(seed, batch, proposer, layout):
    s = pair_setup(seed)
    cont = decode(s, PROPOSERS[proposer](), batch, layout=layout, refill="continuous")
    drain = decode(s, PROPOSERS[proposer](), batch, layout=layout, refill="drain")
    assert cont.tokens == drain.tokens == s["reference"].tokens
    assert cont.stats["admissions"] == drain.stats["admissions"] == len(s["prompts"])
    # Continuous: some newcomer's prefill shared a verify forward with others' decoding, in a
    # slot holding another request's old K/V. Drain admits whole batches at once.
    assert cont.stats["interleaved_prefills"] > 0
    assert drain.stats["interleaved_prefills"] == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_forcing_is_clean(seed):
    s = pair_setup(seed)
    for layout in ("padded", "ragged"):
        report = force(s, PROPOSERS["dynamic"](), 2, layout=layout, refill="continuous")
        assert_clean(report, s["reference"])


def test_newcomer_reading_the_stale_cache_is_caught(monkeypatch):
    original = refill.admit

    def keep_old_cache(index, prompt, reference, previous):
        # "The slot already holds K/V for its first tokens": the newcomer skips prefilling them
        # and attends to what the previous request left there.
        r = original(index, prompt, reference, previous)
        if previous is not None:
            r.target_len = min(previous.target_len, len(prompt) - 1)
        return r

    monkeypatch.setattr(refill, "admit", keep_old_cache)
    s = pair_setup(SEEDS[0])
    assert_caught(force(s, PROPOSERS["chain3"](), 2, refill="continuous"), s["reference"])
