"""What a padded adaptive decoder remembers of its workload (runtime/workload_memory.py): when a
batch starts with speculation off, against a float64 statement of the rule, and the decoder's
calls with a useless and a perfect drafter."""
import math
import random

import numpy as np
import pytest
import torch

from mechanism_setup import MAX_NEW, ContraryDrafter, fill_with_noise, pair_setup
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS, BatchLengthPolicy
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.workload_memory import (EXPLORE_AFTER, EXPLORE_AFTER_MAX, START_OFF_AFTER,
                                               WorkloadMemory)

COSTS = [1.0, 1.4, 1.8, 2.0, 2.4]


def _starts_off(counts, requests, costs=COSTS):
    """The rule in float64: the Beta(a + 1, r + 1) mean plus two deviations per request, its
    q-quantile with (1 - q)^requests = 1/2 (a remembered value, the lower one), and whether one
    plain step per token beats cost(L) / E(L) for every L >= 1."""
    upper = []
    for a, r in counts:
        x, y = a + 1.0, r + 1.0
        mean = x / (x + y)
        upper.append(min(1.0, mean + 2 * math.sqrt(x * y / ((x + y) ** 2 * (x + y + 1)))))
    q = float(np.quantile(upper, 1.0 - 0.5 ** (1.0 / requests), method="lower"))
    spans = [c / sum(q ** i for i in range(n + 1)) for n, c in enumerate(costs)]
    return spans[0] < min(spans[1:])


def _policy(counts, batch=4, costs=COSTS):
    """A padded batch's length policy (turn-off on) that remembers requests with `counts`."""
    policy = BatchLengthPolicy(batch, 4, "cpu", 0.0, round_costs=costs)
    policy.memory.add([a for a, _ in counts], [r for _, r in counts])
    policy.reset()
    return policy


def test_a_batch_starts_off_where_its_slowest_request_would_lose():
    rnd = random.Random(5)
    # Most requests agree well; a tenth barely: one batch of 64 holds some of those.
    counts = [(rnd.uniform(150, 200), rnd.uniform(5, 15)) for _ in range(54)]
    counts += [(rnd.uniform(0, 5), rnd.uniform(40, 60)) for _ in range(10)]
    rnd.shuffle(counts)
    for requests in (1, 4, 64):
        policy = _policy(counts)
        first = policy.start(requests)
        assert (first == 0) == _starts_off(counts, requests) == bool(policy.off)
        assert first in (0, 4)
    assert _policy(counts).start(1) == 4 and _policy(counts).start(64) == 0


def test_one_barely_agreeing_request_in_a_workload_of_64_starts_a_batch_of_64_off():
    # As on the H200 pair: after seven rounds one request had accepted none of its drafts, the
    # next ones two or four of seven rounds' worth (whole-history counts, as remembered).
    rnd = random.Random(11)
    good = [(float(rnd.randint(2, 20)), float(rnd.randint(1, 5))) for _ in range(63)]
    good[:3] = [(2.0, 5.0), (2.0, 5.0), (4.0, 5.0)]
    costs = [1.0, 1.31, 1.62, 1.93, 2.24]
    for counts, off in ((good + [(0.0, 7.0)], True), (good + [(6.0, 4.0)], False)):
        assert _starts_off(counts, 64, costs) == off
        assert _policy(counts, 64, costs).start(64) == (0 if off else 4)
        assert _policy(counts, 1, costs).start(1) == 4       # the median request speculates


def test_the_start_decision_runs_on_the_host():
    """A started-off batch must cost what a plain batch costs, so `start` decides from host
    copies. On the meta device a tensor holds no values: reading one back raises, so a decision
    that read the device could not be made there at all, nor could a started-off batch's end
    read its (empty) counts back. The decisions equal the CPU policy's, and round costs set
    later (as a decoder's timing sets them) are the ones decided by."""
    rnd, started_off = random.Random(3), 0
    for _ in range(4):
        counts = [(rnd.uniform(0, 40), rnd.uniform(0, 40)) for _ in range(24)]
        for costs in (COSTS, [1.0, 1.1, 1.15, 1.2, 1.25]):
            meta = BatchLengthPolicy(8, 4, "meta", 0.0, round_costs=[9.0] * 5)
            meta.set_round_costs(costs)
            meta.memory.add([a for a, _ in counts], [r for _, r in counts])
            for requests in (1, 8):
                meta.reset()
                first = meta.start(requests)
                assert first == _policy(counts, 8, costs).start(requests)
                assert (first == 0) == _starts_off(counts, requests, costs)
                if first == 0:      # nor does its end read anything back: it ran no round
                    meta.remember_batch()
                    started_off += 1
    assert started_off > 0
    with pytest.raises(SpecPilotError, match="one cost per length 0..4"):
        meta.set_round_costs(COSTS[:4])


def test_an_exploration_too_short_to_turn_off_leaves_the_wait():
    """An exploring batch that ends before the rule could turn it off (fewer rounds than
    OFF_AFTER_ROUNDS) found nothing: whether or not its flag is set, the wait (doubled first
    by a full exploration that turned off) neither doubles again nor resets."""
    policy = _policy([(0.0, 30.0)] * 8)
    started = [_batch(policy) for _ in range(EXPLORE_AFTER + 1)]
    assert started == [True] * EXPLORE_AFTER + [False]
    assert policy.memory.explore_after == 2 * EXPLORE_AFTER
    for turns_off in (False, True):
        started = [_batch(policy, turns_off, rounds=OFF_AFTER_ROUNDS - 1)
                   for _ in range(2 * EXPLORE_AFTER + 1)]
        assert started == [True] * (2 * EXPLORE_AFTER) + [False]
        assert policy.memory.explore_after == 2 * EXPLORE_AFTER


def test_a_decoder_reads_whether_its_exploring_batch_turned_off():
    """On a real decoder (eager) with a drafter that is always wrong: two batches teach the
    memory, eight start off, the ninth explores, turns itself off at its first chance, and the
    wait before the next exploration doubles."""
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"],
                                  capture=False, adaptive=True)
    memory, calls = decoder.policy.memory, []
    for _ in range(2 + EXPLORE_AFTER + 1):
        r = decoder.generate(s["prompts"], MAX_NEW)
        calls.append((r.drafter_forwards > 0, memory.explore_after))
    assert calls[:2] == [(True, EXPLORE_AFTER)] * 2
    assert calls[2:-1] == [(False, EXPLORE_AFTER)] * EXPLORE_AFTER
    assert calls[-1] == (True, 2 * EXPLORE_AFTER)
    assert r.tokens == s["reference"].tokens


def test_new_round_costs_change_the_remembered_decision():
    """The memory keeps the slowest acceptance it found until it learns something new, but not
    the decision: round costs set anew (a decoder timing its rounds) decide the next start."""
    counts = [(50.0, 50.0)] * 8         # acceptance about 0.5: one draft commits 1.5 tokens
    cheap, dear = [1.0, 1.2, 1.5, 1.8, 2.1], [1.0, 1.9, 2.3, 2.6, 2.9]
    policy = _policy(counts, costs=cheap)
    assert policy.start(4) == 4
    policy.set_round_costs(dear)
    policy.reset()
    assert _starts_off(counts, 4, dear) and not _starts_off(counts, 4, cheap)
    assert policy.start(4) == 0
    policy.set_round_costs(cheap)
    policy.reset()
    assert policy.start(4) == 4


def _run_rounds(policy, accepted_per_round, remaining=200):
    """Rounds of chain(4) on `policy`: accepted_per_round[t][i] drafts of request i accepted
    in round t, every request active."""
    b = len(accepted_per_round[0])
    for row in accepted_per_round:
        n = torch.tensor(row, dtype=torch.int64)
        policy.next(n, torch.full_like(n, 4), torch.ones(b, dtype=torch.bool),
                    torch.full_like(n, remaining), torch.ones(b, dtype=torch.bool))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_batch_that_would_turn_off_at_its_first_chance_starts_off(seed):
    """Eight requests agree well, but one opens with eight rejected rounds: the batch turns off
    at its eighth round (OFF_AFTER_ROUNDS), and the rounds the host runs before it reads that
    (here four, all of them full chains for that request) leave its whole history looking
    good. The next batch of
    eight starts off, as its first decision would again have turned it off; by whole histories
    alone (the float64 rule) it would have speculated. A batch of one is judged on the median
    request's first decision, and speculates."""
    rnd = random.Random(seed)
    costs = [1.0, 1.9, 2.0, 2.1, 2.2]
    policy = BatchLengthPolicy(8, 4, "cpu", 0.0, round_costs=costs)
    policy.reset()
    assert policy.start(8) == 4
    slow = rnd.randrange(8)
    first = OFF_AFTER_ROUNDS
    rounds = [[0 if (i == slow and t < first) else rnd.choice([3, 4, 4]) for i in range(8)]
              for t in range(first + 4)]
    _run_rounds(policy, rounds[:first - 1])
    assert not bool(policy.off)
    _run_rounds(policy, rounds[first - 1:first])
    assert bool(policy.off)                         # turned off at its first chance
    _run_rounds(policy, rounds[first:])
    policy.remember_batch()
    counts = list(zip(policy.accepted_total.tolist(), policy.rejected_total.tolist()))
    assert not _starts_off(counts, 8, costs)        # whole histories alone: speculate
    policy.reset()
    assert policy.start(8) == 0 and bool(policy.off)
    one = BatchLengthPolicy(1, 4, "cpu", 0.0, round_costs=costs)
    one.memory = policy.memory
    one.reset()
    assert one.start(1) == 4


def test_a_batch_started_off_records_no_first_judgement():
    """Started off by the memory, a batch makes no turn-off decision, so it leaves no judgement
    to remember (a replay still runs the policy on its plain rounds)."""
    policy = _policy([(0.0, 30.0)] * 8)
    assert policy.start(4) == 0
    zero = torch.zeros(4, dtype=torch.int64)
    for _ in range(2 * OFF_AFTER_ROUNDS):
        policy.next(zero, zero, torch.ones(4, dtype=torch.bool), torch.full((4,), 100),
                    torch.ones(4, dtype=torch.bool))
    assert policy.first_judged.tolist() == [-1.0] * 4
    policy.remember_batch()             # (a started-off batch is not even read back)
    assert policy.memory.first_judged == []


def _batch(policy, turns_off: bool = True, rounds: int = OFF_AFTER_ROUNDS) -> bool:
    """One padded batch of 4 as far as the memory sees it: started, and where it speculates,
    ended after `rounds` speculative rounds turned off (or not), with no draft counted.
    Returns whether it started off."""
    policy.reset()
    started_off = policy.start(4) == 0
    if not started_off:
        policy.off.fill_(turns_off)
        policy.rounds.fill_(rounds)
    policy.remember_batch()
    return started_off


def test_too_few_requests_keep_a_batch_speculating_and_off_is_explored_again():
    useless = [(0.0, 30.0)] * (START_OFF_AFTER - 1)
    policy = _policy(useless + [(0.0, 0.0)])
    assert len(policy.memory.counts) == START_OFF_AFTER - 1     # a row without a round: skipped
    assert policy.start(4) == 4
    policy.memory.add([0.0], [30.0])
    started = [_batch(policy) for _ in range(7 * EXPLORE_AFTER + 4)]
    # off, EXPLORE_AFTER times in a row; then one batch speculates and refreshes the memory;
    # each exploring batch that turns itself off doubles the wait before the next
    waits = [EXPLORE_AFTER, 2 * EXPLORE_AFTER, 4 * EXPLORE_AFTER]
    assert started[:sum(waits) + 3] == sum(([True] * w + [False] for w in waits), [])
    assert started[sum(waits) + 3:] == [True]


def test_the_wait_before_exploring_is_bounded_and_resets_when_an_exploration_pays():
    policy = _policy([(0.0, 30.0)] * 256)
    memory = policy.memory
    for _ in range(400):        # started off, exploring ever more rarely: 8 + 16 + ... + 128
        if memory.explore_after == EXPLORE_AFTER_MAX:
            break
        _batch(policy)
    for _ in range(2 * (EXPLORE_AFTER_MAX + 1)):    # two more explorations: it stays capped
        _batch(policy)
        assert memory.explore_after == EXPLORE_AFTER_MAX
    while memory.started_off_in_a_row < EXPLORE_AFTER_MAX:
        assert _batch(policy)
    # An exploration that speculates to its end: its four requests agreed well, too few among
    # the 256 remembered to start the next batch on, yet the wait must not grow.
    policy.reset()
    assert policy.start(4) == 4
    policy.accepted_total.fill_(200.0)
    policy.rejected_total.fill_(1.0)
    policy.rounds.fill_(60)
    policy.remember_batch()
    assert memory.explore_after == EXPLORE_AFTER
    started = [_batch(policy) for _ in range(EXPLORE_AFTER + 1)]
    assert started == [True] * EXPLORE_AFTER + [False]
    # The workload itself changes: a batch starts on, and the doubled wait resets.
    assert memory.explore_after == 2 * EXPLORE_AFTER
    memory.add([200.0] * 256, [1.0] * 256)
    assert not _batch(policy, turns_off=False)
    assert memory.explore_after == EXPLORE_AFTER


@pytest.mark.parametrize("useful", [False, True])
def test_a_decoder_stops_learning_a_useless_drafter_again_and_keeps_a_perfect_one(useful):
    s = pair_setup(4)
    drafter = s["target"] if useful else ContraryDrafter(s["target"])
    decoder = GraphedChainDecoder(s["target"], drafter, 4, 48, 4, s["eos"], capture=False,
                                  adaptive=True)
    runs = [decoder.generate(s["prompts"], MAX_NEW) for _ in range(2)]
    # Noise in the drafter's cache: a batch started off must neither touch nor need it.
    untouched = fill_with_noise(decoder.dcache)
    runs.append(decoder.generate(s["prompts"], MAX_NEW))
    assert all(r.tokens == s["reference"].tokens for r in runs)
    assert all(r.drafter_forwards > 0 for r in runs[:2])
    if useful:
        assert all(r.stats == {"rounds_chain_4": r.target_forwards - 1} for r in runs)
        assert not all(untouched())
    else:
        # Two batches of four requests teach it the workload (START_OFF_AFTER = 8): the third
        # runs plain steps from its first round, and its drafter does not even prefill.
        assert START_OFF_AFTER == 8
        assert any(k != "rounds_chain_0" for k in runs[1].stats)
        assert list(runs[2].stats) == ["rounds_chain_0"] and runs[2].drafter_forwards == 0
        assert all(untouched())


def test_the_whole_history_is_judged_at_the_confidence_asked():
    """At confidence 0 a remembered request counts at its Beta(a + 1, r + 1) mean: the memory's
    figure is the remembered q-quantile of those means (float64, by hand); by default at the
    batch rule's upper bound, which is higher. A negative confidence is refused."""
    rnd = random.Random(8)
    counts = [(float(rnd.randint(0, 90)), float(rnd.randint(1, 90))) for _ in range(40)]
    for requests in (1, 4, 64):
        q = 1.0 - 0.5 ** (1.0 / requests)
        means = [(a + 1.0) / (a + r + 2.0) for a, r in counts]
        expected = float(np.quantile(means, q, method="lower"))
        at_mean, default = WorkloadMemory(0.0), WorkloadMemory()
        for memory in (at_mean, default):
            memory.add([a for a, _ in counts], [r for _, r in counts])
        assert at_mean.slowest_acceptance(requests) == pytest.approx(expected, rel=1e-12)
        assert default.slowest_acceptance(requests) > expected
    with pytest.raises(SpecPilotError, match="confidence"):
        WorkloadMemory(-1.0)
