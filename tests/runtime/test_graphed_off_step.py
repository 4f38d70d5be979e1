"""Once an adaptive batch has turned speculation off, its plain steps must cost what a plain
decoder's steps cost: on a GPU a step of a small model is bound by its kernel count, and the
length policy's bookkeeping, run every step, cost the off state about a tenth of its speed on
an H200. Not even the next length is written (the host holds 0 for good). Checked here by the
operators each step runs (eagerly, on CPU)."""
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

from adaptive_reference import reference_batch_lengths
from mechanism_setup import MAX_NEW, ContraryDrafter, one_thread, pair_setup  # noqa: F401


class _Ops(TorchDispatchMode):
    """Counts the aten operators run inside it that compute (views launch no kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _ops_of_one_step(decoder, prompts):
    decoder.generate(prompts, 4)                 # a real state: prefilled, rows active
    with _Ops() as mode:
        decoder._runner(False, 0, rounds=1)()
    return mode.ops


def _plain_and_adaptive(cls):
    """Prompts, a plain decoder and an adaptive `cls` decoder with a useless drafter, on one
    target."""
    s = pair_setup(4)
    plain = GraphedChainDecoder(s["target"], None, 4, 48, 0, s["eos"], capture=False)
    adaptive = cls(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"], capture=False,
                   adaptive=True)
    return s["prompts"], plain, adaptive


def test_an_off_step_runs_the_plain_steps_operators_exactly():
    prompts, plain, adaptive = _plain_and_adaptive(GraphedChainDecoder)
    plain_ops = _ops_of_one_step(plain, prompts)
    assert plain_ops["aten.mm"] > 0                          # the step really ran the model
    assert _ops_of_one_step(adaptive, prompts) == plain_ops


def _ops_of_the_log(decoder, plain):
    accepted = torch.where(decoder.active, 0, -1)
    with _Ops() as mode:
        decoder._log_round(accepted, plain=plain)
    return mode.ops


def test_a_refill_off_step_is_the_plain_step_with_a_smaller_log():
    prompts, plain, refill = _plain_and_adaptive(GraphedRefillDecoder)
    plain_ops, refill_ops = _ops_of_one_step(plain, prompts), _ops_of_one_step(refill, prompts)
    # The same step but for the log: the padded one writes the round's entry and status row,
    # the refill's only counts the round.
    padded_log, refill_log = _ops_of_the_log(plain, True), _ops_of_the_log(refill, True)
    assert refill_ops + padded_log == plain_ops + refill_log
    assert sum(refill_log.values()) < sum(padded_log.values())


def test_a_refill_plain_log_only_counts_the_round_and_a_full_one_writes_entries():
    prompts, _, refill = _plain_and_adaptive(GraphedRefillDecoder)
    refill.generate(prompts, 4)
    refill.active.copy_(torch.tensor([True, False, True, True]))     # rows that run the round
    ran = refill.active.clone()
    accepted = torch.where(ran, 0, -1)
    log, rows, index = refill.accepted.clone(), refill.row_round.clone(), refill.round_index.clone()
    refill._log_round(accepted, plain=True)
    assert torch.equal(refill.accepted, log)                           # no entry written
    assert torch.equal(refill.row_round, rows + ran) and refill.round_index == index + 1
    # A speculative round's log (plain=False) writes each running row's own entry at its
    # counter (distinct counts, so a row written with another's shows).
    drafts = torch.where(ran, torch.tensor([3, 9, 1, 2]), -1)
    refill._log_round(drafts, plain=False)
    at = rows + ran
    for row in range(4):
        want = drafts[row] if ran[row] else log[at[row], row]
        assert refill.accepted[at[row], row] == want
    assert torch.equal(refill.row_round, rows + 2 * ran)


def test_an_off_batch_stays_off_and_keeps_the_ar_output():
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"],
                                  capture=False, adaptive=True)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    rounds = r.target_forwards - 1
    wanted = reference_batch_lengths(4, lambda n: 0, rounds)[1:]
    # The host replays the length read two rounds back: the full chain twice, then the rule's.
    graphs = [4, 4] + wanted[:rounds - 2]
    assert r.stats == {f"rounds_chain_{n}": graphs.count(n) for n in sorted(set(graphs))}
    # Every round after the first plain one is plain too: off is for good.
    first_off = graphs.index(0)
    assert set(graphs[first_off:]) == {0} and rounds - first_off > 2
    torch.testing.assert_close(torch.tensor(r.drafter_forwards), torch.tensor(1 + sum(graphs)))
