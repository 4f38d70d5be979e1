"""The one-row prefill of continuous refill (runtime/row_prefill.py), run eagerly on CPU in
float32: the chosen row of each batch cache holds what an eager prefill of the prompt writes,
its logits are the eager prefill's, and every other row keeps what it held; capture and the
prefill's own stream are covered by tests/gpu/test_row_prefill_gpu.py and
tests/gpu/test_graphed_refill_gpu.py."""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.row_prefill import (AHEAD_DEPTH, RowPrefill, ahead_depth,
                                           prefill_placement)
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
    assert prefill_placement() == "ahead"       # the default: faster on the GPU (thirtieth set)
    for placement, depth in (("beside", 0), ("after", 0), ("ahead", 4)):
        monkeypatch.setenv("SPECPILOT_REFILL_PREFILL", placement)
        prefill = RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False)
        # uncaptured, the prefill is the caller's own work, on the caller's stream, in one
        # scratch set; ahead, newcomers prefilled early wait in staging caches of their own
        assert prefill.stream is None and len(prefill.scratch) == 1
        assert prefill.ahead == (placement == "ahead")
        assert prefill.depth == depth and len(prefill.staging) == depth
    monkeypatch.setenv("SPECPILOT_REFILL_AHEAD", "2")
    assert RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False).depth == 2
    assert ahead_depth(3) == 3                  # given, it overrides the environment's
    for bad in ("0", "17", "two"):
        monkeypatch.setenv("SPECPILOT_REFILL_AHEAD", bad)
        with pytest.raises(SpecPilotError, match=f"SPECPILOT_REFILL_AHEAD='{bad}'"):
            RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False)
    for bad in (0, 17, True, 2.0):
        with pytest.raises(SpecPilotError, match=f"ahead depth {bad!r}"):
            ahead_depth(bad)
    monkeypatch.delenv("SPECPILOT_REFILL_AHEAD")
    assert ahead_depth() == AHEAD_DEPTH
    monkeypatch.setenv("SPECPILOT_REFILL_PREFILL", "beside")    # beside reads no depth
    monkeypatch.setenv("SPECPILOT_REFILL_AHEAD", "two")
    assert RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False).depth == 0
    monkeypatch.delenv("SPECPILOT_REFILL_AHEAD")
    # given to the constructor, the placement overrides the environment's, and is checked too
    given = RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False, placement="beside")
    assert not given.ahead and len(given.scratch) == 1
    with pytest.raises(SpecPilotError, match="prefill placement 'sideways'"):
        RowPrefill([(target, target.new_cache(2, 32))], 32, capture=False, placement="sideways")


def test_newcomers_prefilled_ahead_wait_in_staging_while_others_come_and_go():
    """`prefetch` prefills the queue's next newcomers (two held here) before a row is free for
    them; a second `prefetch` of the same queue prefills nothing more. Their `run` only copies
    from staging, and an admission of a prompt not held (prefilled then, in the scratch set)
    leaves nothing held. Every row ends with what an eager prefill of its own prompt writes,
    and the logits are its own; a staging slot freed by its admission takes the next newcomer;
    `forget` drops those held (their `run` then prefills anew)."""
    s = pair_setup(7)
    target, drafter = s["target"], s["drafter"]
    caches = [_filled(target, 3, 96, 1), _filled(drafter, 3, 96, 2)]
    prefill = RowPrefill([(target, caches[0]), (drafter, caches[1])], 96, capture=False,
                         placement="ahead", depth=2)
    p = s["prompts"]
    queue = [p[2], p[0], p[3], p[1]]
    assert prefill.prefetch(queue) == 2                  # the first two
    assert prefill.prefetch(queue) == 0                  # held already
    assert [a.prompt for a in prefill._held] == [tuple(p[2]), tuple(p[0])]
    got = {1: prefill.run(1, p[2])}                      # from staging
    assert [a.prompt for a in prefill._held] == [tuple(p[0])]
    _assert_holds_eager_prefill(target, drafter, caches, 1, p[2], got[1])
    assert prefill.prefetch(queue[1:]) == 1              # the freed slot takes p[3]
    got[0] = prefill.run(0, p[0])
    got[2] = prefill.run(2, p[3])
    assert not prefill._held
    for row, prompt in ((0, p[0]), (2, p[3])):
        _assert_holds_eager_prefill(target, drafter, caches, row, prompt, got[row])
    # out of the queue's order: p[1] is not held's head, so it is prefilled at its admission
    assert prefill.prefetch([p[0], p[3]]) == 2
    got[1] = prefill.run(1, p[1])
    assert not prefill._held                             # dropped
    _assert_holds_eager_prefill(target, drafter, caches, 1, p[1], got[1])
    assert prefill.prefetch([p[3]]) == 1
    prefill.forget()
    assert not prefill._held and list(prefill._free) == [0, 1]
    got[0] = prefill.run(0, p[3])                        # dropped: prefilled again, same result
    for row, prompt in ((0, p[3]), (1, p[1]), (2, p[3])):
        _assert_holds_eager_prefill(target, drafter, caches, row, prompt, got[row])


def test_a_queue_that_no_longer_starts_with_those_held_drops_them():
    s = pair_setup(7)
    target = s["target"]
    cache = _filled(target, 2, 96, 3)
    prefill = RowPrefill([(target, cache)], 96, capture=False, placement="ahead", depth=3)
    p = s["prompts"]
    assert prefill.prefetch([p[0], p[1]]) == 2
    # another queue: those held are dropped and its head is prefilled instead
    assert prefill.prefetch([p[2], p[0]]) == 2
    assert [a.prompt for a in prefill._held] == [tuple(p[2]), tuple(p[0])]
    logits = prefill.run(1, p[2])
    eager = target.new_cache(1, 96)
    want = append_step(target, eager, torch.zeros(1, dtype=torch.int64), [list(p[2])])
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
