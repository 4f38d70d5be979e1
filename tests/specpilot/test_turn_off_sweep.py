"""bench/turn_off_sweep.py and bench/acceptance_by_round.py, end to end on small profiles: the
sweep's figures are the adaptive replays' own at each rounds-before-a-turn-off, judging later
keeps requests that open badly, and the by-round spans are checked by hand."""
import json
import random

import pytest

from bench_script import load_bench_script
from specpilot.bench.adaptive_refill_replay import replay_adaptive_refill
from specpilot.bench.adaptive_replay import replay_adaptive
from specpilot.bench.step_costs import StepCosts
from replay_setup import chain_round_costs, profile_from_agreement
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def test_the_sweep_replays_each_candidate(tmp_path):
    module = load_bench_script("turn_off_sweep")
    rnd = random.Random(4)
    # Requests that open badly and then agree: where judging early turns them off.
    profile = profile_from_agreement(4, [[rnd.random() < (0.2 if i < 6 else 0.9)
                                          for i in range(rnd.randint(40, 80))]
                                         for _ in range(8)])
    path = tmp_path / "profile.json"
    profile.save(str(path))
    c = chain_round_costs([1, 4], 1e-3, [(1.2 + 0.2 * n) * 1e-3 for n in range(1, 5)])
    source = tmp_path / "costs.json"
    source.write_text(json.dumps({"step_costs": c.to_json()}))
    out = tmp_path / "sweep.json"
    argv = ["--off-after", "2,9", "--step-costs", str(source), "--round-model", "1.5,0.2",
            "--profiles", str(path), "--batch-sizes", "1,4", "--out", str(out)]
    assert module.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2          # cost sets x batch sizes x candidates
    for row in rows[:4]:                   # the stored step costs come first
        assert row["cold"] == pytest.approx(replay_adaptive(
            profile, c, row["batch"], off_after=row["off_after"]).speedup)
    assert {r["costs"] for r in rows[4:]} == {"model 1.5 + 0.2 L"}
    # Judged after two rounds, the bad openings turn batch 1 off; after nine, they do not.
    early, late = rows[0], rows[1]
    assert (early["batch"], early["off_after"], late["off_after"]) == (1, 2, 9)
    assert late["cold"] > early["cold"]
    # With the graphed loop's lag, the padded figures are the lagged replay's.
    lagged = tmp_path / "lagged.json"
    assert module.main(argv[:-1] + [str(lagged), "--host-lag", "4,2"]) == 0
    row = json.loads(lagged.read_text())["rows"][1]
    assert row["cold"] == pytest.approx(replay_adaptive(
        profile, c, row["batch"], host_lag=(4, 2), off_after=row["off_after"]).speedup)
    with pytest.raises(SystemExit):
        module.main(argv + ["--host-lag", "4"])
    with pytest.raises(SystemExit):
        module.main(["--off-after", "0", "--round-model", "1,1", "--profiles", str(path),
                     "--out", str(out)])
    bad = argv[:]
    bad[bad.index(str(path))] = str(tmp_path / "missing.json")
    assert module.main(bad) == 2
    # Both of the rule's estimates, each row the replay's own under it.
    both = tmp_path / "both.json"
    assert module.main(argv[:-1] + [str(both), "--estimator", "geometric,per_depth"]) == 0
    rows = json.loads(both.read_text())["rows"]
    assert [r["estimator"] for r in rows[:4]] == ["geometric"] * 2 + ["per_depth"] * 2
    for row in rows:
        assert row["refill"] == pytest.approx(replay_adaptive_refill(
            profile, c if row["costs"] == str(source) else StepCosts.of_round_model(
                1.5, 0.2, [1, 4], 4), row["batch"], off_after=row["off_after"],
            estimator=row["estimator"]).speedup)
    with pytest.raises(SystemExit):
        module.main(argv + ["--estimator", "depth"])


def test_acceptance_by_round_by_hand(tmp_path):
    module = load_bench_script("acceptance_by_round")
    rows = [[0, 1, 2, 4, 4, 4, 3, 4, 4], [2, 2]]
    spans = module.by_round(rows, 4)
    # rounds 1-4: 0 1 2 4 and 2 2 -> mean 11/6, rejections 5 of 6; rounds 5-8: 4 4 3 4
    assert spans[0]["count"] == 6 and spans[0]["mean_accepted"] == pytest.approx(11 / 6)
    assert spans[0]["rejected_share"] == pytest.approx(5 / 6)
    assert spans[1]["mean_accepted"] == pytest.approx(15 / 4)
    assert spans[1]["rejected_share"] == pytest.approx(1 / 4)
    assert spans[2]["count"] == 1 and spans[3]["count"] == 0 and spans[3]["mean_accepted"] is None
    profile = profile_from_agreement(4, [[True] * 9 + [False], [False, True, True]])
    path = tmp_path / "p.json"
    profile.save(str(path))
    out = tmp_path / "by-round.json"
    assert module.main(["--profiles", str(path), "--out", str(out)]) == 0
    got = json.loads(out.read_text())["spans"][str(path)]
    assert got == module.by_round(profile.accepted_lengths, 4)
    assert module.main(["--profiles", str(tmp_path / "missing.json"), "--out", str(out)]) == 2
