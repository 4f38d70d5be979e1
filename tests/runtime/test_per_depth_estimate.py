"""The batch-length rule's per-depth estimate (runtime/depth_acceptance.py, BatchLengthPolicy
with estimator "per_depth") against hand-checked trials, a float64 loop for E(L), and a request
whose drafts agree in pairs, where the one-alpha estimate picks a worse length."""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.adaptive_draft import expected_tokens
from specpilot.runtime.batch_length import BatchLengthPolicy, model_round_costs
from specpilot.runtime.depth_acceptance import (DEPTH_SMOOTHING, depth_expected_tokens,
                                                depth_trials, update_depth_rates)

# Rounds priced as the nineteenth set's model of an H200 batch-64 round: 1.14 + 0.27 L plain
# steps (1 for a plain step).
COSTS = [1.0] + [1.14 + 0.27 * n for n in range(1, 5)]


def test_a_rounds_trials_are_the_depths_it_reached():
    accepted = torch.tensor([2, 4, 0, 1, 3])
    drafted = torch.tensor([4, 4, 3, 1, 4])
    ran = torch.tensor([True, True, True, True, False])
    tried, took, past_full = depth_trials(accepted, drafted, ran, 4)
    T, F = True, False
    assert tried.tolist() == [[T, T, T, F],     # two accepted, the third rejected
                              [T, T, T, T],     # all four accepted
                              [T, F, F, F],     # the first rejected
                              [T, F, F, F],     # one drafted, accepted: nothing past it tried
                              [F, F, F, F]]     # did not run
    assert took.tolist() == [[T, T, F, F], [T, T, T, T], [F, F, F, F], [T, F, F, F],
                             [F, F, F, F]]
    # Only the fourth row accepted all it drafted and drafted less than the cap.
    assert past_full.tolist() == [[F, F, F, F], [F, F, F, F], [F, F, F, F], [F, T, T, T],
                                  [F, F, F, F]]


def test_expected_tokens_from_depth_rates_against_a_float64_loop():
    rates = torch.rand(5, 6, dtype=torch.float64) * 0.9 + 0.05
    got = depth_expected_tokens(rates)
    for row, p in zip(got.tolist(), rates.tolist()):
        want, reach = [1.0], 1.0
        for rate in p:
            reach *= rate
            want.append(want[-1] + reach)
        assert row == pytest.approx(want)
    # Equal rates at every depth are the one-alpha estimate.
    alpha = rates[:, 0]
    same = depth_expected_tokens(alpha[:, None].expand(5, 6).contiguous())
    assert torch.allclose(same, expected_tokens(alpha, 6))


def test_tried_depths_and_those_past_a_full_chain_move():
    rates = torch.tensor([[0.5, 0.8, 0.4, 0.3], [0.5, 0.6, 0.7, 0.2]])
    tried = torch.tensor([[True, True, False, False], [True, False, False, False]])
    took = torch.tensor([[True, False, False, False], [True, False, False, False]])
    past_full = torch.tensor([[False, False, False, False], [False, True, True, True]])
    s = DEPTH_SMOOTHING
    got = update_depth_rates(rates, tried, took, past_full).tolist()
    # Row 0 rejected its second draft: the depths past it keep theirs.
    assert got[0] == pytest.approx([(1 - s) * 0.5 + s, (1 - s) * 0.8, 0.4, 0.3])
    # Row 1 drafted one and it was accepted: the depths it did not draft move toward 1.
    assert got[1] == pytest.approx([(1 - s) * 0.5 + s] + [(1 - s) * r + s for r in (0.6, 0.7,
                                                                                    0.2)])


def _pairs_policy(estimator: str, rounds: int):
    """One request drafting four a round that accepts, alternately, none and two (its third
    draft never agrees): the long-run rates are 1/2, 1, 0 by depth, one alpha 1/2."""
    policy = BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=COSTS, turn_off=False,
                               estimator=estimator)
    policy.reset()
    chosen = None
    for i in range(rounds):
        chosen = int(policy.next(torch.tensor([2 * (i % 2)]), torch.tensor([4]),
                                 torch.tensor([True]), torch.tensor([200]), torch.tensor([True])))
    return policy, chosen


@pytest.mark.parametrize("rounds", [40, 41])     # ending on a round of two or of none
def test_per_depth_rates_follow_the_pairs_and_choose_two_drafts(rounds):
    policy, chosen = _pairs_policy("per_depth", rounds)
    d1, d2, d3, d4 = policy.depth.rates[0].tolist()
    assert 0.4 < d1 < 0.6 and d2 > 0.99 and d3 < 0.02       # 0.8 ** 20 after 20 tries
    assert d4 == 1.0                     # never tried: the optimistic prior stays
    # By hand, with d1 = 1/2: E = 1, 1.5, 2, 2, 2 tokens for 1, 1.41, 1.68, 1.95, 2.22 plain
    # steps; two drafts take 0.84 a token, one 0.94, plain steps 1.
    assert chosen == 2


def test_one_alpha_prices_the_pairs_as_independent_trials():
    # Its state, set to the pairs' long-run averages: 1 accepted, 1 rejection a round. Then
    # E = 1, 1.5, 1.75, 1.875, 1.94 and one draft (0.94 a token) beats two (0.96).
    policy = BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=COSTS, turn_off=False)
    policy.reset()
    policy.accepted_avg.fill_(1.0)
    policy.rejected_avg.fill_(1.0)
    nothing = torch.tensor([False])           # a round where the request did not run
    chosen = policy.next(torch.tensor([0]), torch.tensor([0]), nothing, torch.tensor([200]),
                         torch.tensor([True]))
    assert int(chosen) == 1
    depth = BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=COSTS, turn_off=False,
                              estimator="per_depth")
    depth.reset()
    depth.depth.rates.copy_(torch.tensor([[0.5, 1.0, 0.0, 0.0]]))
    assert int(depth.next(torch.tensor([0]), torch.tensor([0]), nothing, torch.tensor([200]),
                          torch.tensor([True]))) == 2


def test_a_useless_drafter_turns_off_after_the_rounds_it_waits():
    policy = BatchLengthPolicy(2, 4, "cpu", 0.0, round_costs=COSTS, estimator="per_depth")
    policy.reset()
    lengths = []
    length = 4
    for _ in range(40):
        length = int(policy.next(torch.tensor([0, 0]), torch.tensor([length, length]),
                                 torch.tensor([length > 0] * 2), torch.tensor([200, 200]),
                                 torch.tensor([True, True])))
        lengths.append(length)
    assert 0 not in lengths[:policy.off_after - 1]
    assert lengths[-1] == 0 and lengths.index(0) < 30
    assert all(n == 0 for n in lengths[lengths.index(0):])     # off for good


def test_a_newcomer_starts_from_the_workloads_depth_rates():
    policy = BatchLengthPolicy(2, 4, "cpu", 0.0, round_costs=COSTS, objective="throughput",
                               estimator="per_depth")
    policy.reset()
    # Two rounds of both rows: row 0 accepts 2 then 4 of 4, row 1 accepts 0 then 1 of 4.
    for accepted in ([2, 0], [4, 1]):
        policy.next(torch.tensor(accepted), torch.tensor([4, 4]), torch.tensor([True, True]),
                    torch.tensor([200, 200]), torch.tensor([True, True]))
    # Tries per depth: 4, 3, 2, 1; acceptances 3, 2, 1, 1 (by the trials above).
    assert policy.depth.workload.tolist() == [[4, 3, 2, 1], [3, 2, 1, 1]]
    policy.admit(1)
    assert policy.depth.rates[1].tolist() == pytest.approx([3 / 4, 2 / 3, 1 / 2, 1.0])
    # Its history: `off_after` average rounds of the workload (4 request rounds so far).
    prior = policy.off_after / 4
    assert policy.depth.tried[1].tolist() == pytest.approx([4 * prior, 3 * prior, 2 * prior,
                                                            1 * prior])
    assert policy.depth.took[1].tolist() == pytest.approx([3 * prior, 2 * prior, prior, prior])
    policy.reset()
    assert policy.depth.rates.eq(1.0).all() and policy.depth.workload.eq(0).all()


def test_an_unknown_estimator_is_refused():
    with pytest.raises(SpecPilotError, match="per_depth"):
        BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=model_round_costs(4, 0.2),
                          estimator="depth")


def test_full_chains_bring_back_a_depth_the_rule_stopped_drafting():
    # The fused drafter's prices (1.17 + 0.16 L plain steps; BENCHMARKS.md, twentieth set).
    costs = [1.0] + [1.17 + 0.16 * n for n in range(1, 5)]
    policy = BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=costs, turn_off=False,
                               estimator="per_depth")
    policy.reset()
    run = lambda n, drafted: int(policy.next(torch.tensor([n]), torch.tensor([drafted]),
                                             torch.tensor([True]), torch.tensor([200]),
                                             torch.tensor([True])))
    length = 4
    for _ in range(10):                   # the fourth draft is rejected, round after round
        length = run(3, 4)
    assert length == 3
    lengths = []
    for _ in range(12):                   # then every draft is accepted, at whatever length
        length = run(length, length)
        lengths.append(length)
    assert lengths[0] == 3 and 4 in lengths
