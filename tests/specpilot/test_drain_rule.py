"""What a refilled batch's length optimises once its queue is empty (a Program's
batch.length_drain, ir.program.LENGTH_DRAINS): the makespan drain sets the policy's `draining`
where the throughput drain leaves it, the two replay differently where one request that agrees
poorly is left in the drain, the graphed runtime builds its decoder with the Program's drain,
and bench/drain_rule_replay.py reports each rule's replay of a bench file's profile."""
import json
import random

import pytest

from specpilot.bench.adaptive_refill_replay import replay_adaptive_refill
from specpilot.bench.refill_replay import replay_refill
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.batch_length import BatchLengthPolicy

from bench_script import load_bench_script
from replay_setup import profile_from_agreement

PRICES = [1.0, 1.348, 1.504, 1.631, 1.759]       # run 63's recorded prices at batch 16


def test_the_policy_checks_its_drain_and_a_padded_batch_drains_by_its_makespan():
    with pytest.raises(SpecPilotError, match="length drain 'tail'"):
        BatchLengthPolicy(2, 4, "cpu", 0.2, objective="throughput", drain="tail")
    assert BatchLengthPolicy(2, 4, "cpu", 0.2, objective="throughput").drain == "makespan"
    # a padded batch drains from its start, whatever it is given
    assert BatchLengthPolicy(2, 4, "cpu", 0.2, drain="throughput").drain == "makespan"


@pytest.mark.parametrize("drain,draining", [("makespan", True), ("throughput", False)])
def test_an_empty_queue_sets_draining_only_for_the_makespan(drain, draining):
    policy = BatchLengthPolicy(3, 4, "cpu", 0.2, objective="throughput", drain=drain)
    policy.reset()
    assert not bool(policy.draining)
    policy.queue_empty()
    assert bool(policy.draining) == draining
    policy.reset()                                          # a new call refills again
    assert not bool(policy.draining)


@pytest.mark.parametrize("drain", ["makespan", "throughput"])
def test_the_graphed_runtime_builds_the_programs_drain_into_its_decoder(drain):
    """A Program's batch.length_drain reaches its decoder's policy (and is part of the kept
    decoder's key), and the output is greedy AR's either way."""
    from mechanism_setup import pair_setup, program_of, run_program_graphed
    from specpilot.ir import (CaptureGraphs, SetDraftLengthPolicy, SetLengthDrain,
                              SetMaxBatchSize, SetRefill)
    from specpilot.runtime.graphed_refill import GraphedRefillDecoder

    s = pair_setup(11)
    steps = [SetMaxBatchSize(2), SetDraftLengthPolicy("per_request_adaptive", 10),
             SetRefill("continuous"), CaptureGraphs(True)]
    if drain == "throughput":
        steps.append(SetLengthDrain("throughput"))
    program = program_of(s, *steps, batch=2)
    assert program.batch.length_drain == drain
    decoder, _ = run_program_graphed(s, program, GraphedRefillDecoder)
    assert decoder.policy.drain == drain


def _poor_one_last(seed=3):
    """Eleven requests whose drafter agrees 95 % of the time, then one long one at 30 %: it is
    left alone in the drain, and rules its makespan."""
    rnd = random.Random(seed)
    maps = [[rnd.random() < 0.95 for _ in range(rnd.randint(60, 100))] for _ in range(11)]
    maps.append([rnd.random() < 0.3 for _ in range(260)])
    return profile_from_agreement(4, maps)


def test_a_poor_request_left_in_the_drain_decides_the_makespan_not_the_time_per_token():
    """By the makespan, the poor request's plain steps beat every chain: the batch turns off
    for good while good requests still run. By the time per token it keeps drafting for them
    and serves their tokens faster, at the same tokens in all."""
    profile = _poor_one_last()
    costs = StepCosts.of_chain_rounds({4: PRICES})
    makespan = replay_adaptive_refill(profile, costs, 4, drain="makespan")
    throughput = replay_adaptive_refill(profile, costs, 4, drain="throughput")
    fixed = replay_refill(profile, costs, 4)
    assert makespan.tokens == throughput.tokens == fixed.tokens
    assert throughput.mean_accepted > makespan.mean_accepted
    assert throughput.spec_seconds != makespan.spec_seconds


FIXED_ROW = "mech:graphed_refill_fused_accept"


def _bench_rows(tmp_path, name, profile):
    """A bench file `name`.json at batch 4 with the fixed refill row (its profile saved beside
    it, as the bench writes it) and the adaptive row's recorded prices (PRICES); its rows and
    path."""
    profile.save(str(tmp_path / f"{name}.acceptance.mech-graphed_refill_fused_accept.json"))
    rows = [{"system": FIXED_ROW, "batch_size": 4, "status": "measured"},
            {"system": "mech:graphed_adaptive_refill_fused_accept", "batch_size": 4,
             "status": "measured", "length_rule": {"prices": PRICES, "off_from_round": [],
                                                   "restarts": 0}}]
    bench = tmp_path / f"{name}.json"
    bench.write_text(json.dumps({"name": name, "rows": rows}))
    return rows, bench


def test_the_script_reports_each_rules_replay_of_a_bench_files_profile(tmp_path, capsys):
    """The fixed row's profile is the one the bench wrote beside the file (its batch's own
    where there are several), priced by the adaptive row's recorded prices, else by the round
    model; each rule's figures are the replay's own."""
    profile, other = _poor_one_last(5), _poor_one_last(6)
    fixed_name = FIXED_ROW
    rows, bench = _bench_rows(tmp_path, "mechanisms-x", profile)
    out = tmp_path / "drain.json"
    script = load_bench_script("drain_rule_replay")
    assert script.main([str(bench), "--out", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["batch"] == 4 and cell["prices"] == PRICES and cell["prices_recorded"]
    costs = StepCosts.of_chain_rounds({4: PRICES})
    fixed = replay_refill(profile, costs, 4)
    assert cell["fixed_x_ar"] == pytest.approx(fixed.speedup)
    assert set(cell["rules"]) == {"geometric/makespan", "geometric/throughput",
                                  "per_depth/makespan", "per_depth/throughput"}
    for name, rule in cell["rules"].items():
        estimator, drain = name.split("/")
        got = replay_adaptive_refill(profile, costs, 4, estimator=estimator, drain=drain)
        assert rule["over_fixed"] == pytest.approx(fixed.spec_seconds / got.spec_seconds)
        assert rule["x_ar"] == pytest.approx(got.speedup)
        # Drafts where the profile never drafted from counted as accepted: never below it.
        hope = replay_adaptive_refill(profile, costs, 4, estimator=estimator, drain=drain,
                                      unknown_agrees=True)
        assert rule["optimistic"]["over_fixed"] == pytest.approx(
            fixed.spec_seconds / hope.spec_seconds)
        assert rule["optimistic"]["over_fixed"] >= rule["over_fixed"]
    assert "over fixed: geometric/makespan" in capsys.readouterr().out
    # the batch's own profile where the bench wrote several; no recorded prices: the model's
    other.save(str(tmp_path / "mechanisms-x.acceptance.mech-graphed_refill_fused_accept.b4.json"))
    by_batch = {fixed_name: {"4": "mechanisms-x.acceptance.mech-graphed_refill_fused_accept"
                                  ".b4.json"}}
    bench.write_text(json.dumps({"name": "mechanisms-x", "rows": rows[:1],
                                 "acceptance_profiles_by_batch": by_batch}))
    assert script.main([str(bench), "--round-model", "1.5,0.25", "--out", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["prices"] == [1.0, 1.75, 2.0, 2.25, 2.5] and not cell["prices_recorded"]
    modelled = StepCosts.of_round_model(1.5, 0.25, [4], 4)
    assert cell["fixed_x_ar"] == pytest.approx(replay_refill(other, modelled, 4).speedup)
    # no fixed row: refused, nothing written
    bench.write_text(json.dumps({"name": "mechanisms-x", "rows": rows[1:]}))
    assert script.main([str(bench), "--out", str(tmp_path / "no.json")]) == 2
    assert not (tmp_path / "no.json").exists()


def test_the_optimistic_replay_brackets_rules_that_draft_shorter_chains(tmp_path):
    """Requests whose drafter agrees 70 % of the time: the rules draft shorter chains than the
    profile's four, starting rounds where it never drafted from. Counted as rejected there the
    replay puts every rule behind the fixed chain; counted as accepted, level with it or ahead."""
    rnd = random.Random(7)
    profile = profile_from_agreement(4, [[rnd.random() < 0.7 for _ in range(rnd.randint(60, 100))]
                                         for _ in range(12)])
    _, bench = _bench_rows(tmp_path, "mechanisms-y", profile)
    out = tmp_path / "drain.json"
    assert load_bench_script("drain_rule_replay").main([str(bench), "--out", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    for rule in cell["rules"].values():
        assert rule["over_fixed"] < 0.97 and rule["optimistic"]["over_fixed"] > 0.98
        assert rule["optimistic"]["mean_accepted"] > rule["mean_accepted"]
