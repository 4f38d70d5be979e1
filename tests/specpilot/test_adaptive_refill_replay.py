"""Adaptive lengths with continuous refill, replayed on a chain profile
(specpilot/bench/adaptive_refill_replay.py): held at the longest chain it is the fixed chain with
refill; with a drafter that would lose it costs at most AR with refill plus the rounds before it
may turn off; the shapes bench adds its rows when asked for both."""
import random

import pytest

from specpilot.bench.adaptive_refill_replay import replay_adaptive_refill
from specpilot.bench.refill_replay import replay_refill
from specpilot.bench.shapes_bench import replay_rows
from specpilot.cost.refill_schedule import refill_steps
from specpilot.ir.topology import Chain
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS

from replay_setup import chain_round_costs, profile_from_agreement


def _profile(seed, p, requests=9):
    rnd = random.Random(seed)
    return profile_from_agreement(4, [[rnd.random() < p for _ in range(rnd.randint(10, 90))]
                                      for _ in range(requests)])


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_held_at_the_longest_chain_it_is_the_fixed_chain_with_refill(batch):
    profile = _profile(batch, 0.7)
    flat = chain_round_costs([batch], 1e-3, [2e-3] * 4)   # every length costs the same: k wins
    got = replay_adaptive_refill(profile, flat, batch, turn_off=False)
    fixed = replay_refill(profile, flat, batch)
    rounds = [len(profile.accepted_lengths[r % 9]) for r in range(-(-9 // batch) * batch)]
    assert got.spec_steps == fixed.spec_steps == refill_steps(rounds, batch)
    assert got.spec_seconds == pytest.approx(fixed.spec_seconds)
    assert got.tokens == fixed.tokens and got.ar_seconds == pytest.approx(fixed.ar_seconds)
    assert got.mean_accepted == pytest.approx(fixed.mean_accepted)


@pytest.mark.parametrize("batch", [2, 4])
def test_a_drafter_that_would_lose_costs_at_most_the_rounds_before_the_turn_off(batch):
    profile = _profile(50 + batch, 0.1, requests=12)
    dear = chain_round_costs([batch], 1e-3, [(1 + 0.8 * n) * 1e-3 for n in range(1, 5)])
    fixed = replay_refill(profile, dear, batch)
    got = replay_adaptive_refill(profile, dear, batch)
    assert fixed.speedup < 0.8 and got.speedup > fixed.speedup
    # AR with refill, plus the rounds before the rule may turn off (each at most the dearest
    # round's cost) and one plain step per slot for the schedule they shifted
    assert got.spec_seconds <= got.ar_seconds + OFF_AFTER_ROUNDS * dear.round(batch, Chain(4)) \
        + batch * dear.target(batch, 1)


def test_the_shapes_bench_adds_the_combined_rows_against_the_padded_ar():
    profile = _profile(7, 0.6, requests=5)
    c = chain_round_costs([1, 4], 1e-3, [1.6e-3, 1.9e-3, 2.2e-3, 2.5e-3])
    rows, figures = replay_rows(profile, c, [1, 4], adaptive=True, refill=True)
    name = "spec chain(4), adaptive lengths, refill, pessimistic"
    got = next(r for r in rows if r["system"] == name and r["batch_size"] == 4)
    want = replay_adaptive_refill(profile, c, 4)
    padded_ar = next(r for r in rows if r["system"].startswith("ar") and r["batch_size"] == 4)
    assert got["tokens_per_s"]["median"] == pytest.approx(want.tokens_per_s)
    assert got["speedup_vs_ar"] == pytest.approx(want.tokens_per_s /
                                                 padded_ar["tokens_per_s"]["median"])
    assert sum(f.get("system") == "adaptive lengths, refill, optimistic" for f in figures) == 2
