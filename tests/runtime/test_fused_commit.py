"""A round's end in one generated kernel (accept_kernels "fused", the chain_commit family) in
the graphed decoders, rounds run eagerly on CPU in float32 with the kernel in Triton's
interpreter: every decoder that takes it gives greedy AR's tokens, and the same accepted
lengths, rounds and refills as its torch-ops round end (with adaptive lengths the length's
update is a generated kernel too, the length_policy family, so the lengths chosen round by
round are the kernel's); forcing is clean; a commit that miscounts what it accepted is
caught."""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

from mechanism_setup import MAX_NEW, assert_clean, one_thread  # noqa: F401
from refill_setup import mixed_requests

COSTS = [1.0, 1.3, 1.6, 1.9, 2.2]


def _runs(cls, s, prompts, batch, k, **options):
    """The same decoder with each round end: (ops result, fused result)."""
    drafter = s["drafter"] if k else None
    return [cls(s["target"], drafter, batch, 48, k, s["eos"], capture=False,
                accept_kernels=kernels, **options).generate(prompts, MAX_NEW)
            for kernels in ("ops", "fused")]


def _same(ops, fused):
    assert fused.tokens == ops.tokens
    assert fused.accepted_lengths == ops.accepted_lengths
    assert fused.stats == ops.stats
    assert fused.target_forwards == ops.target_forwards


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("k,batch,adaptive", [(0, 3, False), (3, 2, False), (4, 3, True)])
def test_refill_with_the_fused_commit_gives_greedy_ar(seed, k, batch, adaptive):
    s, prompts, reference = mixed_requests(seed)
    options = dict(adaptive=True, round_costs=COSTS) if adaptive else {}
    ops, fused = _runs(GraphedRefillDecoder, s, prompts, batch, k, **options)
    assert fused.tokens == reference.tokens
    _same(ops, fused)
    assert fused.stats["refills"] == len(prompts) - batch
    if k:   # not a trivial case: drafts were accepted
        assert any(a > 0 for row in fused.accepted_lengths for a in row)


def test_adaptive_refill_turning_speculation_off_logs_plain_steps_alike():
    """Dear rounds: the batch turns speculation off part way, so the kernel's plain-step log
    (row counters only) and its speculative log both run, and the length rule reads the
    kernel's accepted counts."""
    s, prompts, reference = mixed_requests(11)
    ops, fused = _runs(GraphedRefillDecoder, s, prompts, 2, 4, adaptive=True,
                       round_costs=[1.0, 2.0, 2.6, 3.2, 3.8])
    assert fused.tokens == reference.tokens
    _same(ops, fused)
    assert fused.stats["rounds_chain_0"] > 0
    assert any(0 < max(row) and row[-1] == 0 for row in fused.accepted_lengths)


@pytest.mark.parametrize("estimator,drain", [("per_depth", "makespan"),
                                             ("per_depth", "throughput"),
                                             ("geometric", "throughput")])
def test_adaptive_refill_chooses_the_same_lengths_in_the_kernel(estimator, drain):
    """Each estimate and drain: the length_policy kernel picks, round by round, the lengths
    the torch update picks (the rounds of each length and the accepted counts agree)."""
    s, prompts, reference = mixed_requests(4)
    ops, fused = _runs(GraphedRefillDecoder, s, prompts, 3, 4, adaptive=True,
                       round_costs=[1.0, 1.5, 1.9, 2.3, 2.7], length_estimator=estimator,
                       length_drain=drain)
    assert fused.tokens == reference.tokens
    _same(ops, fused)
    assert len([key for key in fused.stats if key.startswith("rounds_chain_")]) > 1


@pytest.mark.parametrize("k,adaptive", [(0, False), (3, False), (4, True)])
def test_padded_batches_with_the_fused_commit_give_greedy_ar(k, adaptive):
    s, prompts, reference = mixed_requests(4)
    options = dict(adaptive=True, round_costs=COSTS) if adaptive else {}
    ops, fused = _runs(GraphedChainDecoder, s, prompts[:4], 4, k, **options)
    assert fused.tokens == reference.tokens[:4]
    _same(ops, fused)


def test_forcing_with_the_fused_commit_is_clean():
    s, prompts, reference = mixed_requests(11)
    decoder = GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, 3, s["eos"], capture=False,
                                   accept_kernels="fused")
    report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert_clean(report, reference)


class _OneTooMany(GraphedRefillDecoder):
    """A round end that commits one draft past the first the target rejected: the kernel is
    handed that draft as if the target had agreed."""

    def _commit_in_kernel(self, committed, drafts, drafted=None):
        n = self._accepted(drafts, committed)
        at = torch.arange(drafts.shape[1], device=drafts.device)[None, :] == n[:, None]
        super()._commit_in_kernel(committed, torch.where(at, committed[:, :-1], drafts),
                                  drafted=drafted)


def test_a_commit_past_the_rejected_draft_changes_the_output():
    s, prompts, reference = mixed_requests(11)
    wrong = _OneTooMany(s["target"], s["drafter"], 2, 48, 3, s["eos"], capture=False,
                        accept_kernels="fused").generate(prompts, MAX_NEW)
    assert wrong.tokens != reference.tokens


class _Counted:
    """A built kernel module whose launches are counted (and, `shift`ed, its first token moved
    on by one: a row_start that starts a newcomer from the wrong token)."""

    def __init__(self, module, shift=False):
        self.module, self.shift, self.launches = module, shift, 0

    def launch(self, logits, out, accepted, row_round, length, prev, limit_t, count, last,
               active, eos, row, *host_values):
        self.launches += 1
        self.module.launch(logits, out, accepted, row_round, length, prev, limit_t, count, last,
                           active, eos, row, *host_values)
        if self.shift:
            last[row] += 1
            out[row, 0] += 1


@pytest.mark.parametrize("adaptive", [False, True])
def test_newcomers_rows_are_started_by_the_generated_kernel(adaptive):
    """With the fused round end every unforced admission is one row_start launch (none of the
    torch operations), the output stays greedy AR's; a row_start off by one token is caught."""
    s, prompts, reference = mixed_requests(4)
    options = dict(adaptive=True, round_costs=COSTS) if adaptive else {}
    k = len(COSTS) - 1 if adaptive else 3
    for shift in (False, True):
        decoder = GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, k, s["eos"],
                                       capture=False, accept_kernels="fused", **options)
        decoder._row_start = counted = _Counted(decoder._row_start, shift)
        result = decoder.generate(prompts, MAX_NEW)
        assert counted.launches == result.stats["refills"] == len(prompts) - 2
        assert (result.tokens == reference.tokens) != shift
        if not shift:       # forcing admits through the torch operations, and is clean
            report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                          default_tolerance(torch.float32))
            assert_clean(report, reference)
            assert counted.launches == len(prompts) - 2
    ops = GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, k, s["eos"], capture=False,
                               **options)
    assert ops._row_start is None


def test_unknown_accept_kernels_and_margins_are_refused():
    s, _, _ = mixed_requests(11)
    with pytest.raises(SpecPilotError, match="unknown accept kernels"):
        GraphedChainDecoder(s["target"], s["drafter"], 2, 48, 3, capture=False,
                            accept_kernels="cuda")
    with pytest.raises(SpecPilotError, match="margins"):
        GraphedChainDecoder(s["target"], s["drafter"], 2, 48, 3, capture=False,
                            accept_kernels="fused", record_margins=True)
