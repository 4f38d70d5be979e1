"""Continuous refill replayed (specpilot/bench/refill_replay.py) and its slot schedule
(specpilot/cost/refill_schedule.py) against a hand-checked schedule, a step-by-step simulation
of the slots, and the padded replay it must never be slower than."""
import random

import pytest

from specpilot.bench.refill_replay import replay_refill
from specpilot.bench.replay import AcceptanceProfile, cycled_batches, replay
from specpilot.bench.step_costs import StepCosts
from specpilot.cost.refill_schedule import refill_steps
from specpilot.ir.topology import Chain


def _simulated(lengths, slots):
    """Step by step: each step every busy slot works one step; a slot that is free at the start
    of a step takes the next request in queue order (the lowest slot first)."""
    queue, left, step = list(lengths), [0] * slots, 0
    while queue or any(left):
        for s in range(slots):
            if left[s] == 0 and queue:
                left[s] = queue.pop(0)
        left = [max(0, n - 1) for n in left]
        step += 1
    return step


def test_a_hand_checked_schedule():
    # Two slots: r0 holds slot 0 for steps 0-2; r1 (step 0), r2 (step 1) and r3 (steps 2-4)
    # follow one another in slot 1: 5 steps, where the padded loop runs [3, 1] then [1, 3]: 6.
    assert refill_steps([3, 1, 1, 3], 2) == 5
    assert refill_steps([4], 3) == 4 and refill_steps([2, 2, 2], 1) == 6


def test_a_hand_checked_schedule_in_replays():
    # One round a replay: r1 is done in replay 0, seen after it while replay 1 runs, so r2
    # starts at replay 2 and r3 (after r2 is seen) at replay 4, running replays 4-6; replay 7
    # is queued before replay 6 is read back: 8 steps.
    assert refill_steps([3, 1, 1, 3], 2, rounds_per_replay=1) == 8
    # Two a replay: r0 holds replays 0-1 (free at 3), r1 replay 0 (free at 2), r2 replay 2
    # (free at 4), r3 replays 3-4, and replay 5 is queued: 6 replays of 2 steps.
    assert refill_steps([3, 1, 1, 3], 2, rounds_per_replay=2) == 12
    # A request done at its prefill (0 rounds) still holds its slot for one replay.
    assert refill_steps([0, 2], 1, rounds_per_replay=1) == 5
    with pytest.raises(ValueError, match="rounds_per_replay"):
        refill_steps([1], 1, rounds_per_replay=0)
    # Read back two replays behind: r1, done in replay 0, is seen while replays 1 and 2 are
    # queued, so r2 runs replay 3; r0, done in replay 2, is seen in replay 4's gap, so r3 runs
    # replays 5-7; replays 8 and 9 are queued before replay 7 is read back: 10 steps.
    assert refill_steps([3, 1, 1, 3], 2, rounds_per_replay=1, lag=2) == 10
    with pytest.raises(ValueError, match="lag"):
        refill_steps([1], 1, rounds_per_replay=1, lag=0)


def _replayed(lengths, slots, per):
    """The graphed refill loop replay by replay: a row done in replay j is seen once replay j
    is read back, while j + 1 already runs, so its newcomer runs from replay j + 2."""
    queue, rows, left, admit = list(lengths), [None] * slots, [0] * slots, {}
    for row in range(slots):
        if queue:
            rows[row], left[row] = True, queue.pop(0)
    j = 0
    while any(rows) or any(admit.values()):
        for row in admit.pop(j, []):
            if queue:
                rows[row], left[row] = True, queue.pop(0)
        if not any(rows):
            j += 1
            continue
        for row in range(slots):
            if rows[row]:
                left[row] -= per
                if left[row] <= 0:
                    rows[row] = None
                    admit.setdefault(j + 2, []).append(row)
        j += 1
        if not any(rows) and not queue:
            break
    return (j + 1) * per            # the replay queued while the last one is read back


@pytest.mark.parametrize("per", [1, 2, 4])
def test_the_schedule_in_replays_matches_the_replayed_loop(per):
    rnd = random.Random(per)
    for _ in range(30):
        lengths = [rnd.randint(0, 30) for _ in range(rnd.randint(1, 25))]
        slots = rnd.choice([1, 2, 3, 8])
        steps = refill_steps(lengths, slots, rounds_per_replay=per)
        assert steps == _replayed(lengths, slots, per)
        assert steps >= refill_steps(lengths, slots) and steps % per == 0


@pytest.mark.parametrize("slots", [1, 3, 8])
def test_the_schedule_matches_a_step_by_step_simulation_and_never_loses(slots):
    rnd = random.Random(slots)
    for _ in range(20):
        lengths = [rnd.randint(1, 30) for _ in range(rnd.randint(1, 25))]
        steps = refill_steps(lengths, slots)
        assert steps == _simulated(lengths, slots)
        padded = sum(max(lengths[i:i + slots]) for i in range(0, len(lengths), slots))
        assert max(lengths) <= steps <= padded


def _costs(batch_sizes):
    c = StepCosts(context=64, graphed=True)
    for b in batch_sizes:
        c.target_costs[b] = {1: 1e-3 * (1 + 0.02 * b)}
        c.round_costs.setdefault(str(Chain(3)), {})[b] = 2.1e-3 * (1 + 0.02 * b)
    return c


def test_refill_replays_both_decoders_on_the_padded_replays_tokens():
    rnd = random.Random(5)
    rows = [[rnd.randint(0, 3) for _ in range(rnd.randint(3, 40))] for _ in range(7)]
    # new tokens: what each row committed, plus an EOS cut for some (AR decodes new_tokens - 1)
    tokens = [sum(a + 1 for a in row) + 1 for row in rows]
    profile = AcceptanceProfile(Chain(3), rows, tokens)
    c = _costs([1, 3])
    for batch in (1, 3):
        padded, kept = replay(profile, c, batch), replay_refill(profile, c, batch)
        assert kept.tokens == padded.tokens and kept.requests == padded.requests
        order = [r for group in cycled_batches(len(rows), batch) for r in group]
        assert kept.spec_steps == _simulated([len(rows[r]) for r in order], batch)
        assert kept.ar_steps == _simulated([tokens[r] - 1 for r in order], batch)
        assert kept.spec_seconds == pytest.approx(kept.spec_steps * c.round(batch, Chain(3)))
        assert kept.ar_seconds == pytest.approx(kept.ar_steps * c.target(batch, 1))
        assert kept.spec_seconds <= padded.spec_seconds + 1e-12
        assert kept.ar_seconds <= padded.ar_seconds + 1e-12
        if batch == 1:          # one slot: nothing to refill, the same as the padded loop
            assert (kept.spec_steps, kept.ar_steps) == (padded.spec_steps, padded.ar_steps)


def test_the_shapes_bench_adds_refill_rows_against_the_padded_ar():
    from specpilot.bench.shapes_bench import replay_rows

    rnd = random.Random(8)
    rows = [[rnd.randint(0, 3) for _ in range(rnd.randint(5, 30))] for _ in range(6)]
    profile = AcceptanceProfile(Chain(3), rows, [sum(a + 1 for a in r) + 1 for r in rows])
    c = _costs([1, 3])
    table, figures = replay_rows(profile, c, [3], refill=True)
    by_name = {r["system"]: r for r in table}
    kept, padded = replay_refill(profile, c, 3), replay(profile, c, 3)
    assert by_name["spec chain(3), refill"]["speedup_vs_ar"] == pytest.approx(
        padded.ar_seconds / kept.spec_seconds)
    assert by_name["ar (graphed steps), refill"]["tokens_per_s"]["median"] == pytest.approx(
        kept.ar_tokens_per_s)
    assert [f["system"] for f in figures if "system" in f] == ["continuous refill"]


def test_without_a_graphed_round_each_step_is_the_modelled_step_at_the_widest_catch_up():
    from specpilot.bench.replay import MissingStepCost
    from specpilot.ir.topology import DynamicTree

    ms = 1e-3
    costs = StepCosts(context=64, graphed=False,
                      target_costs={2: {1: 6 * ms, 3: 10 * ms}},
                      drafter_costs={2: {1: 1 * ms, 3: 2 * ms}},
                      accept_costs={"chain(2)": {2: 0.5 * ms}})
    # Two slots, requests of 2, 1, 1 and 1 rounds: r0 holds slot 0 for steps 0-1, r1 and r2
    # follow in slot 1, r3 takes slot 0 at step 2: 3 steps. Each is a catch-up of 3 tokens
    # (2 ms) + one drafter level (1 ms) + verify of 3 (10 ms) + accept (0.5 ms) = 13.5 ms.
    # AR decodes 4, 1, 2 and 1 tokens: r0 in slot 0, r1, r2, r3 in slot 1: 4 steps of 6 ms.
    profile = AcceptanceProfile(Chain(2), [[2, 0], [0], [1], [0]], [5, 2, 3, 2])
    kept = replay_refill(profile, costs, 2)
    assert (kept.spec_steps, kept.ar_steps) == (3, 4)
    assert kept.spec_seconds == pytest.approx(40.5 * ms)
    assert kept.ar_seconds == pytest.approx(24 * ms)
    assert kept.step_model.startswith("sum of step costs, widest catch-up")
    dynamic = AcceptanceProfile(DynamicTree(budget=6, depth=3, width=2), [[1]], [3])
    with pytest.raises(MissingStepCost, match="graphed round only"):
        replay_refill(dynamic, costs, 2)
