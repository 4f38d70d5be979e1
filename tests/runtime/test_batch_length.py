"""The batch-level chain length (runtime/batch_length.py) against hand-computed makespans."""
import pytest
import torch

from specpilot.runtime.adaptive_draft import acceptance_rate, expected_tokens
from specpilot.runtime.batch_length import makespans, model_round_costs, next_length


def _expected(alpha, n):
    return sum(alpha ** i for i in range(n + 1))


def _tokens(alpha, cost):
    """What the rule weighs: each request's E_i(L) for L = 0..cap from its alpha."""
    return expected_tokens(alpha, len(cost) - 1)


def test_makespans_are_the_slowest_active_request_per_length():
    alpha = torch.tensor([0.9, 0.3, 0.6], dtype=torch.float64)
    remaining = torch.tensor([50, 80, 30])
    active = torch.tensor([True, True, False])
    cost = torch.tensor(model_round_costs(3, 0.5), dtype=torch.float64)
    assert cost.tolist() == [1.0, 1.5, 2.0, 2.5]
    want = [max(rem * c / _expected(a, n) for a, rem in ((0.9, 50), (0.3, 80)))
            for n, c in enumerate(cost.tolist())]
    spans = makespans(_tokens(alpha, cost), remaining, active, cost)
    assert spans.tolist() == pytest.approx(want)
    best, plain = next_length(_tokens(alpha, cost), remaining, active, cost)
    # the slow request decides: 80 tokens at alpha 0.3 finish soonest with plain steps
    assert want[0] < min(want[1:])
    assert bool(plain) and int(best) == 1 + min(range(3), key=lambda i: want[1 + i])


def test_a_good_batch_takes_the_longest_chain_and_cheap_drafts_never_lose():
    alpha = torch.rand(6, dtype=torch.float64) * 0.05 + 0.95
    remaining = torch.randint(10, 100, (6,))
    active = torch.ones(6, dtype=torch.bool)
    cost = torch.tensor(model_round_costs(4, 0.25), dtype=torch.float64)
    best, plain = next_length(_tokens(alpha, cost), remaining, active, cost)
    assert int(best) == 4 and not bool(plain)
    # with alpha = 1 and cost(L) = 1 + c L (c < 1), a longer chain always finishes sooner
    spans = makespans(_tokens(torch.ones(6, dtype=torch.float64), cost), remaining, active,
                      cost)
    assert all(a > b for a, b in zip(spans.tolist(), spans.tolist()[1:]))


def test_finished_requests_do_not_count():
    alpha = torch.tensor([0.05, 0.95], dtype=torch.float64)
    remaining = torch.tensor([200, 40])
    cost = torch.tensor(model_round_costs(4, 0.25), dtype=torch.float64)
    _, plain_with_slow = next_length(_tokens(alpha, cost), remaining,
                                     torch.tensor([True, True]), cost)
    best, plain = next_length(_tokens(alpha, cost), remaining, torch.tensor([False, True]), cost)
    assert bool(plain_with_slow) and not bool(plain) and int(best) == 4


def _run_policy(rounds, cap=4, costs=(1.0, 1.4, 1.8, 2.0, 2.4), keep=False):
    """One request's lengths under BatchLengthPolicy, each round accepting rounds[i](length)
    (and the policy, with `keep`)."""
    from specpilot.runtime.batch_length import BatchLengthPolicy

    policy = BatchLengthPolicy(1, cap, "cpu", 0.0, round_costs=list(costs))
    policy.reset()
    length, out = cap, []
    for accept in rounds:
        n = torch.tensor([min(accept, length)])
        length = int(policy.next(n, torch.tensor([length]), torch.tensor([True]),
                                 torch.tensor([200]), torch.tensor([True])))
        out.append(length)
    return (out, policy) if keep else out


def test_the_rounds_before_a_turn_off_are_a_setting_of_the_policy():
    # A drafter that never agrees, judged from the third round instead of the eighth: the bound
    # after n rejections (above) has fallen below every cost by n = 5 here (cost(1) = 1.4:
    # 0.39 at n = 5), so the batch turns off at its fifth round, not at its third.
    from specpilot.ir.errors import SpecPilotError
    from specpilot.runtime.batch_length import BatchLengthPolicy

    lengths = []
    policy = BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=[1.0, 1.4, 1.8, 2.0, 2.4],
                               off_after=3)
    policy.reset()
    length = 4
    for _ in range(7):
        length = int(policy.next(torch.tensor([0]), torch.tensor([length]), torch.tensor([True]),
                                 torch.tensor([200]), torch.tensor([True])))
        lengths.append(length)
    assert lengths.index(0) == 4
    with pytest.raises(SpecPilotError, match="off_after"):
        BatchLengthPolicy(1, 4, "cpu", 0.0, off_after=0)


def test_a_few_bad_rounds_after_good_ones_do_not_turn_speculation_off():
    # Eight full chains, then four rounds that accept nothing: the moving average alone (weight
    # 1/2 on the newest round: 4 accepted and no rejection halved four times, 4 / 16 against
    # 15 / 16 rejections) has alpha = 4 / 19 = 0.21, where plain steps win (E(1) = 1.21 <
    # cost(1) = 1.4); over the whole history (32 drafts accepted, 4 rejections) the bound keeps
    # it on.
    lengths, policy = _run_policy([4] * 8 + [0] * 4, keep=True)
    assert 0 not in lengths
    recent = float(acceptance_rate(policy.accepted_avg, policy.rejected_avg)[0])
    assert recent == pytest.approx(4 / 19) and 1.0 + recent < 1.4
    # A drafter that never agrees is turned off at the eighth round, the first where it may
    # (OFF_AFTER_ROUNDS): after n rejections and nothing accepted the upper bound on its
    # acceptance is the mean of Beta(1, n + 1) plus two standard deviations, 0.28 at n = 8
    # (E(1) = 1.28, E(2) = 1.36, E(3) = 1.38, E(4) = 1.38: below every cost).
    from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS
    assert OFF_AFTER_ROUNDS == 8
    assert _run_policy([0] * 10)[6:] == [1, 0, 0, 0]
    # And one that only agreed long ago is turned off once the history agrees with the present.
    late = _run_policy([4, 4] + [0] * 40)
    assert late[-1] == 0 and late.index(0) > 8


def test_throughput_is_the_time_per_token_of_all_active_requests():
    from specpilot.runtime.batch_length import times_per_token

    alpha = torch.tensor([0.9, 0.2, 0.6], dtype=torch.float64)
    active = torch.tensor([True, True, False])
    cost = torch.tensor(model_round_costs(3, 0.5), dtype=torch.float64)
    want = [c / (_expected(0.9, n) + _expected(0.2, n)) for n, c in enumerate(cost.tolist())]
    assert times_per_token(_tokens(alpha, cost), active, cost).tolist() == pytest.approx(want)
    best, plain = next_length(_tokens(alpha, cost), torch.tensor([5, 900, 1]), active, cost,
                              "throughput")
    assert int(best) == 1 + min(range(3), key=lambda i: want[1 + i]) and not bool(plain)
    # the makespan would follow the slow request's 900 tokens and turn speculation off
    _, plain_makespan = next_length(_tokens(alpha, cost), torch.tensor([5, 900, 1]), active,
                                    cost)
    assert bool(plain_makespan)


def test_a_newcomer_starts_from_the_averages_of_the_requests_before_it():
    from specpilot.runtime.batch_length import BatchLengthPolicy

    policy = BatchLengthPolicy(2, 4, "cpu", 0.0, round_costs=[1.0, 1.4, 1.8, 2.0, 2.4],
                               objective="throughput")
    policy.reset()
    policy.admit(1)                                # nothing seen yet: the optimistic prior
    assert policy.accepted_avg.tolist() == [4.0, 4.0] and policy.rejected_avg.tolist() == [0, 0]
    rng = torch.Generator().manual_seed(3)
    accepted = rejections = rounds = 0
    for i in range(5):
        n = torch.randint(0, 5, (2,), generator=rng)
        ran = torch.tensor([True, i % 2 == 0])
        policy.next(n, torch.tensor([4, 4]), ran, torch.tensor([50, 50]), ran)
        accepted += int(n[ran].sum())
        rejections += int((n[ran] < 4).sum())
        rounds += int(ran.sum())
    policy.admit(1)
    assert policy.accepted_avg[1].item() == pytest.approx(accepted / rounds)
    assert policy.rejected_avg[1].item() == pytest.approx(rejections / rounds)
    from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS as prior   # its history

    assert policy.accepted_total[1].item() == pytest.approx(prior * accepted / rounds)
    assert policy.rejected_total[1].item() == pytest.approx(prior * rejections / rounds)
    with pytest.raises(Exception, match="objective"):
        BatchLengthPolicy(2, 4, "cpu", 0.0, objective="fastest")


def test_the_upper_bound_on_acceptance_is_the_beta_mean_plus_two_deviations():
    from specpilot.runtime.adaptive_draft import upper_acceptance

    # Beta(9, 3): mean 3 / 4, variance 9 * 3 / (12 ** 2 * 13); Beta(1, 1): mean 1 / 2, sd
    # 1 / sqrt(12), so the bound passes 1 and is clamped.
    got = upper_acceptance(torch.tensor([8.0, 0.0, 0.0]), torch.tensor([2.0, 0.0, 30.0]))
    want = [0.75 + 2 * (27 / (144 * 13)) ** 0.5, 1.0,
            1 / 32 + 2 * ((1 / 32) * (31 / 32) / 33) ** 0.5]
    assert got.tolist() == pytest.approx(want, rel=1e-6)


def test_a_slow_start_does_not_turn_off_a_drafter_that_then_agrees():
    """Eight rejections in eight rounds (one draft accepted), then full chains: by the mean of
    the history ((1 + 1) / (1 + 8 + 2) = 0.18, E(L) < cost(L) for every L; the moving average
    is lower still) plain steps would win at the eighth round, the first where the batch may
    turn off, and off is for good. Eight rounds of a poor start are still too few to tell: the
    upper bound (0.40) keeps the batch speculating, and the full chains that follow bring it to
    the longest."""
    from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS
    assert OFF_AFTER_ROUNDS == 8
    costs = (1.0, 1.39, 1.79, 1.95, 2.41)
    lengths = _run_policy([1] + [0] * 7 + [4] * 10, costs=costs)
    assert 0 not in lengths and lengths[-1] == 4
    alpha = 2 / 11
    assert all(_expected(alpha, n) < c for n, c in zip(range(1, 5), costs[1:]))


def test_round_costs_off_a_gpu_are_each_lengths_best_host_time_over_the_plain_steps(monkeypatch):
    """`measure_round_costs` with the host clock (eager replays): per length, one untimed
    replay after `reset`, then the best of TIMING_REPEATS, over length 0's; checked against a
    clock that the replays advance. Each length's durations (untimed replay first) are set so
    that only "skip the untimed one, take the best" gives 1 : 2 : 3 (the first timed, the last
    or counting the untimed one would not)."""
    import specpilot.runtime.batch_length as batch_length
    assert batch_length.TIMING_REPEATS == 3
    durations = {0: [0.1, 5.0, 1.0, 4.0], 1: [0.1, 2.0, 6.0, 9.0], 2: [0.1, 7.0, 8.0, 3.0]}
    clock, calls, resets = [0.0], [], []
    monkeypatch.setattr(batch_length.time, "perf_counter", lambda: clock[0])

    def replay_of(n):
        def replay():
            clock[0] += durations[n][calls.count(n)]
            calls.append(n)
        return replay
    costs = batch_length.measure_round_costs({n: replay_of(n) for n in (2, 0, 1)},
                                             lambda: resets.append(1), torch.device("cpu"))
    assert costs == pytest.approx([1.0, 2.0, 3.0])
    per = 1 + batch_length.TIMING_REPEATS
    assert calls == [0] * per + [1] * per + [2] * per       # in length order, one untimed first
    assert len(resets) == 4                                  # before each length, and after


def test_the_smoothing_weighs_the_newest_round():
    """A moving average with weight s on the newest round, from the optimistic prior (cap
    accepted, no rejection): hand-computed after two rounds."""
    from specpilot.ir.errors import SpecPilotError
    from specpilot.runtime.batch_length import BatchLengthPolicy
    s, cap = 0.2, 4
    policy = BatchLengthPolicy(2, cap, "cpu", 0.0, round_costs=[1.0, 1.3, 1.6, 1.9, 2.2],
                               smoothing=s)
    yes = torch.tensor([True, True])
    for n in ([1, 4], [0, 4]):
        policy.next(torch.tensor(n), torch.tensor([4, 4]), yes, torch.tensor([50, 50]), yes)
    a0 = (1 - s) * ((1 - s) * cap + s * 1) + s * 0        # accepted 1, then 0 (two rejections)
    r0 = (1 - s) * s + s
    assert policy.accepted_avg.tolist() == pytest.approx([a0, cap])
    assert policy.rejected_avg.tolist() == pytest.approx([r0, 0.0])
    with pytest.raises(SpecPilotError, match="smoothing"):
        BatchLengthPolicy(2, cap, "cpu", 0.0, smoothing=0.0)
