"""Replayed acceptance: the replay arithmetic on hand-computed cases, the acceptance profile
format (round trip and refusals), and the step-cost table."""
import json

import pytest

from specpilot.bench.replay import (REPLAYED, AcceptanceProfile, MissingStepCost, ProfileError,
                                    cycled_batches, replay)
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain, Tree

MS = 1e-3


def chain2_costs():
    """Step costs in ms, chosen so every term of the hand computation is distinct."""
    return StepCosts(
        context=64, graphed=False,
        target_costs={1: {1: 3 * MS, 3: 4 * MS}, 2: {1: 6 * MS, 3: 10 * MS}},
        drafter_costs={1: {1: 0.5 * MS, 3: 1.0 * MS}, 2: {1: 1 * MS, 3: 2 * MS}},
        accept_costs={"chain(2)": {1: 0.25 * MS, 2: 0.5 * MS}})


# r0 accepts 2 then 0 drafts and generates 5 tokens (1 at prefill + 3 + 1); r1 accepts 1, 3 tokens.
PROFILE = AcceptanceProfile(Chain(2), [[2, 0], [1]], [5, 3], {"note": "hand-made"})


def test_batch_of_one_replays_each_request_alone():
    fig = replay(PROFILE, chain2_costs(), 1)
    # Chain(2): catch-up + one drafter forward (level 1) + verify of 3 tokens + accept.
    # r0 step 1: 0.5 + 0.5 + 4 + 0.25 = 5.25; step 2 catches up 2+1 = 3 tokens:
    #            1.0 + 0.5 + 4 + 0.25 = 5.75.  r1 step 1: 5.25.
    assert fig.spec_seconds == pytest.approx(16.25 * MS)
    assert fig.spec_steps == 3
    assert fig.tokens == 4 + 2                       # new tokens after each prefill
    assert fig.ar_steps == 6 and fig.ar_seconds == pytest.approx(18 * MS)
    assert fig.tokens_per_s == pytest.approx(6 / (16.25 * MS))
    assert fig.speedup == pytest.approx(18 / 16.25)
    assert fig.mean_accepted == pytest.approx((3 + 1 + 2) / 3)


def test_batch_of_two_runs_in_lock_step_until_the_longest_request_ends():
    fig = replay(PROFILE, chain2_costs(), 2)
    # step 1 (both active, width 1): 1 + 1 + 10 + 0.5 = 12.5
    # step 2 (r0 only; it re-feeds its 3 committed tokens, r1 pads with 1): 2 + 1 + 10 + 0.5
    assert fig.spec_seconds == pytest.approx(26 * MS)
    assert fig.spec_steps == 2 and fig.requests == 2
    assert fig.ar_steps == 4 and fig.ar_seconds == pytest.approx(24 * MS)
    assert fig.tokens_per_s == pytest.approx(6 / (26 * MS))
    out = fig.to_json()
    assert out["label"] == REPLAYED and out["speedup_vs_ar"] == pytest.approx(24 / 26)


def test_batches_are_filled_by_cycling_the_profile():
    costs = chain2_costs()
    costs.target_costs[3] = {1: 7 * MS, 3: 11 * MS}
    costs.drafter_costs[3] = {1: 1.5 * MS, 3: 2.5 * MS}
    costs.accept_costs["chain(2)"][3] = 0.75 * MS
    fig = replay(PROFILE, costs, 3)   # rows r0, r1, r0
    assert fig.requests == 3 and fig.tokens == 4 + 2 + 4
    # step 1: 1.5 + 1.5 + 11 + 0.75 = 14.75; step 2 (the two r0 rows, width 3): 2.5 + 1.5 + 11 + 0.75
    assert fig.spec_seconds == pytest.approx((14.75 + 15.75) * MS)
    assert fig.ar_seconds == pytest.approx(4 * 7 * MS)


def test_cycled_batches_fill_whole_batches_and_refuse_an_empty_batch():
    assert cycled_batches(5, 2) == [[0, 1], [2, 3], [4, 0]]
    assert cycled_batches(2, 5) == [[0, 1, 0, 1, 0]]
    assert cycled_batches(4, 4) == [[0, 1, 2, 3]]
    with pytest.raises(SpecPilotError, match="at least 1, got 0"):
        cycled_batches(3, 0)
    with pytest.raises(SpecPilotError, match="at least 1, got 0"):
        replay(PROFILE, chain2_costs(), 0)


def test_tree_steps_run_every_level_but_the_last_and_use_the_tree_verification():
    tree = Tree((2, 2))          # levels of 2 and 4 nodes: one drafter forward of width 2
    costs = StepCosts(64, False,
                      target_costs={1: {1: 3 * MS}},
                      drafter_costs={1: {1: 0.5 * MS, 2: 0.75 * MS, 3: 1.25 * MS}},
                      tree_costs={"tree([2, 2])": {1: 5 * MS}},
                      accept_costs={"tree([2, 2])": {1: 0.125 * MS}})
    fig = replay(AcceptanceProfile(tree, [[2, 1]], [6]), costs, 1)
    # step 1: 0.5 + 0.75 + 5 + 0.125 = 6.375; step 2 (width 3): 1.25 + 0.75 + 5 + 0.125 = 7.125
    assert fig.spec_seconds == pytest.approx(13.5 * MS)
    assert fig.ar_seconds == pytest.approx(5 * 3 * MS)


def test_missing_costs_name_what_to_measure():
    with pytest.raises(MissingStepCost, match="batch 4"):
        replay(PROFILE, chain2_costs(), 4)
    costs = chain2_costs()
    del costs.accept_costs["chain(2)"]
    with pytest.raises(MissingStepCost, match="accept/commit of chain"):
        replay(PROFILE, costs, 1)


def test_profile_round_trips_through_its_file(tmp_path):
    path = tmp_path / "p.json"
    PROFILE.save(str(path))
    assert json.loads(path.read_text())["format"] == "specpilot-acceptance-profile"
    loaded = AcceptanceProfile.load(str(path))
    assert loaded == PROFILE


@pytest.mark.parametrize("edit,message", [
    (lambda o: o.update(format="other"), "not an acceptance profile"),
    (lambda o: o.update(version=7), "version 7"),
    (lambda o: o.update(topology={"kind": "ring"}), "topology"),
    (lambda o: o["accepted_lengths"][0].append(3), "integers in 0..2"),
    (lambda o: o["new_tokens"].pop(), "one count per request"),
    (lambda o: o.update(new_tokens=[9, 3]), "fewer than new_tokens - 1 = 8"),
    (lambda o: o.update(new_tokens=[5, True]), "positive integer"),
])
def test_malformed_profiles_are_refused_with_the_field(tmp_path, edit, message):
    obj = PROFILE.to_json()
    edit(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ProfileError, match=message):
        AcceptanceProfile.load(str(path))


def test_missing_or_unreadable_profile_files(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        AcceptanceProfile.load(str(tmp_path / "nope.json"))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read"):
        AcceptanceProfile.load(str(tmp_path / "x.json"))


def test_a_profile_without_decode_steps_cannot_be_replayed():
    with pytest.raises(ProfileError, match="no decode steps"):
        replay(AcceptanceProfile(Chain(2), [[]], [1]), chain2_costs(), 1)


def test_step_costs_round_trip_through_json():
    costs = chain2_costs()
    costs.tree_costs["tree([2, 2])"] = {1: 0.001}
    again = StepCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert again == costs


def test_a_measured_graphed_round_replaces_the_sum_of_steps():
    costs = chain2_costs()
    costs.round_costs["chain(2)"] = {1: 2 * MS}          # batch 1 only
    fig = replay(PROFILE, costs, 1)
    # 3 speculative steps of one 2 ms round each; AR as before (6 steps of 3 ms).
    assert fig.spec_seconds == pytest.approx(6 * MS) and fig.spec_steps == 3
    assert fig.speedup == pytest.approx(18 / 6)
    assert fig.step_model.startswith("graphed round")
    # Batch 2 has no measured round: the sum of step costs, said so.
    assert replay(PROFILE, costs, 2).step_model == "sum of step costs"
    again = StepCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert again == costs and again.round(1, Chain(2)) == 2 * MS
    with pytest.raises(MissingStepCost, match="round at batch 2"):
        costs.round(2, Chain(2))


def test_dynamic_tree_profiles_load_and_replay_from_a_graphed_round_only():
    from specpilot.ir.topology import DynamicTree

    topology = DynamicTree(budget=6, depth=3, width=2)
    profile = AcceptanceProfile.from_json(
        AcceptanceProfile(topology, [[3, 0], [1]], [6, 3]).to_json())
    assert profile.topology == topology
    costs = chain2_costs()
    with pytest.raises(MissingStepCost, match="graphed round only"):
        replay(profile, costs, 1)
    costs.round_costs[str(topology)] = {1: 5 * MS}
    fig = replay(profile, costs, 1)
    # 3 steps of 5 ms against AR's (5 + 2) steps of 3 ms.
    assert fig.spec_seconds == pytest.approx(15 * MS) and fig.ar_seconds == pytest.approx(21 * MS)
    assert fig.step_model.startswith("graphed round")
