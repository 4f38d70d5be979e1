"""The one-row prefill of continuous refill (runtime/row_prefill.py), run eagerly on CPU in
float32: the chosen row of each batch cache holds what an eager prefill of the prompt writes,
its logits are the eager prefill's, and every other row keeps what it held; capture and the
prefill's own stream are covered by tests/gpu/test_row_prefill_gpu.py and
tests/gpu/test_graphed_refill_gpu.py."""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.row_prefill import RowPrefill, prefill_placement
from specpilot.runtime.steps import append_step

from mechanism_setup import pair_setup


def _filled(model, batch, capacity, seed):
    """A batch cache holding random K/V and positions: a stand-in for running requests."""
    cache = model.new_cache(batch, capacity)
    g = torch.Generator().manual_seed(seed)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
    cache.positions.copy_(torch.randint(0, capacity, cache.positions.shape, generator=g))
    return cache


def _assert_holds_eager_prefill(target, drafter, caches, row, prompt, logits):
    """`row` of both batch caches holds what an eager prefill of `prompt` into a fresh one-row
    cache writes, its positions 0..n-1, and `logits` are that prefill's."""
    eager = [target.new_cache(1, 96), drafter.new_cache(1, 96)]
    zero = torch.zeros(1, dtype=torch.int64)
    want = append_step(target, eager[0], zero, [list(prompt)])
    append_step(drafter, eager[1], zero, [list(prompt)])
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    n = len(prompt)
    for cache, ref in zip(caches, eager):
        for mine, theirs in zip(cache.k + cache.v, ref.k + ref.v):
            torch.testing.assert_close(mine[row, :n], theirs[0, :n], rtol=1e-5, atol=1e-5)
        assert torch.equal(cache.positions[row, :n], torch.arange(n))


def test_row_prefill_writes_only_its_row_and_gives_the_eager_logits():
    s = pair_setup(7)
    target, drafter = s["target"], s["drafter"]
    caches = [_filled(target, 3, 96, 1), _filled(drafter, 3, 96, 2)]
    before = [[t.clone() for t in c.k + c.v + [c.positions]] for c in caches]
    prefill = RowPrefill([(target, caches[0]), (drafter, caches[1])], 96, capture=False)
    for row, prompt in ((1, s["prompts"][1]), (2, s["prompts"][3]), (1, s["prompts"][0])):
        _assert_holds_eager_prefill(target, drafter, caches, row, prompt,
                                    prefill.run(row, prompt))
        for cache, old in zip(caches, before):
            for now, then in zip(cache.k + cache.v + [cache.positions], old):
                for other in {0, 1, 2} - {row}:               # the other rows keep theirs
                    assert torch.equal(now[other], then[other])
            for i, t in enumerate(cache.k + cache.v + [cache.positions]):
                old[i] = t.clone()


def test_the_prefill_placement_is_checked_and_off_a_gpu_needs_no_stream(monkeypatch):
    s = pair_setup(7)
    target = s["target"]
    monkeypatch.setenv("SPECPILOT_REFILL_PREFILL", "sideways")
    with pytest.raises(SpecPilotError, match="SPECPILOT_REFILL_PREFILL='sideways'"):
        RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False)
    monkeypatch.delenv("SPECPILOT_REFILL_PREFILL")
    assert prefill_placement() == "beside"      # the default: ahead was no faster on the GPU
    for placement, sets in (("beside", 1), ("after", 1), ("ahead", 2)):
        monkeypatch.setenv("SPECPILOT_REFILL_PREFILL", placement)
        prefill = RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False)
        # uncaptured, the prefill is the caller's own work, on the caller's stream; ahead, a
        # newcomer prefilled early holds a scratch set and leaves the other for the rest
        assert prefill.stream is None and len(prefill.caches[0][1]) == sets
        assert prefill.ahead == (placement == "ahead")
    # given to the constructor, the placement overrides the environment's, and is checked too
    given = RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False, placement="beside")
    assert not given.ahead and len(given.caches[0][1]) == 1
    with pytest.raises(SpecPilotError, match="prefill placement 'sideways'"):
        RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False, placement="sideways")


def test_a_newcomer_prefilled_ahead_keeps_its_set_while_others_come_and_go():
    """`prefetch` prefills the queue's next newcomer before a row is free for it. Two other
    newcomers are admitted meanwhile (each prefilled at its admission, in the set the held one
    leaves free); then the held one's `run` only copies: every row ends with what an eager
    prefill of its own prompt writes, and the logits are its own. A second `prefetch` while one
    is held does nothing, and `forget` drops the held one (its `run` then prefills anew)."""
    s = pair_setup(7)
    target, drafter = s["target"], s["drafter"]
    caches = [_filled(target, 3, 96, 1), _filled(drafter, 3, 96, 2)]
    prefill = RowPrefill([(target, caches[0]), (drafter, caches[1])], 96, capture=False,
                         placement="ahead")
    ahead, others = s["prompts"][2], (s["prompts"][0], s["prompts"][3])
    prefill.prefetch(ahead)
    prefill.prefetch(others[0])                      # one is held: nothing happens
    got = {0: prefill.run(0, others[0]), 2: prefill.run(2, others[1]), 1: prefill.run(1, ahead)}
    prefill.prefetch(others[1])
    prefill.forget()
    got[0] = prefill.run(0, others[1])               # dropped: prefilled again, same result
    for row, prompt in ((0, others[1]), (1, ahead), (2, others[1])):
        _assert_holds_eager_prefill(target, drafter, caches, row, prompt, got[row])
