"""bench/poor_start_replay.py on a hand-made workload: one request accepts every draft, the other
none in its first eight rounds and every one after. The fixed chain's figure and the acceptance
of the first rounds and of the whole are worked out by hand; the adaptive rule's figures are the
replay's own (specpilot/bench/adaptive_replay.py)."""
import json

import pytest

from bench_script import load_bench_script
from specpilot.bench.adaptive_replay import replay_adaptive
from specpilot.bench.replay import AcceptanceProfile
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.topology import Chain

COSTS = [1.0, 1.2, 1.3]


def _files(tmp_path):
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"batches": [{"batch": 2, "costs": {"true": COSTS}}]}))
    rows = [[2] * 10, [0] * 8 + [2] * 8]
    profile = AcceptanceProfile(Chain(2), rows, [1 + sum(n + 1 for n in r) for r in rows])
    path = tmp_path / "chain2.acceptance.json"
    profile.save(str(path))
    return truth, path, profile


def test_the_replay_rows_against_hand_worked_figures(tmp_path):
    truth, path, profile = _files(tmp_path)
    out = tmp_path / "out.json"
    script = load_bench_script("poor_start_replay")
    assert script.main(["--truth", str(truth), "--profiles", str(path), "--batch-sizes", "2,1",
                        "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {(r["batch"], r["workload"]): r for r in doc["rows"]}
    assert set(rows) == {(2, "first"), (2, "all"), (1, "first"), (1, "all")}
    two = rows[(2, "first")]
    assert profile.new_tokens == [31, 33]
    # 32 plain steps for the longer request against 16 rounds of chain(2)
    assert two["fixed_chain"] == pytest.approx(32 / (16 * 1.3))
    assert two["acceptance_first_rounds"] == pytest.approx([1.0, 0.0])
    assert two["acceptance_whole"] == pytest.approx([1.0, 16 / 24])
    # batch 1 takes the nearest measured batch's costs; its "first" workload is request 0
    one = rows[(1, "first")]
    assert one["requests"] == 1 and one["fixed_chain"] == pytest.approx(30 / (10 * 1.3))
    # every adaptive figure is the replay's own, on the workload the row names
    costs = StepCosts.of_chain_rounds({1: COSTS, 2: COSTS})
    for (batch, workload), row in rows.items():
        replayed = profile if workload == "all" else AcceptanceProfile(
            Chain(2), profile.accepted_lengths[:batch], profile.new_tokens[:batch])
        for bound, optimistic in (("pessimistic", False), ("optimistic", True)):
            assert row[f"adaptive_{bound}"] == pytest.approx(replay_adaptive(
                replayed, costs, batch, unknown_agrees=optimistic, warm=True,
                host_lag=(4, 2)).speedup)


@pytest.mark.parametrize("case", ["no batches", "missing", "short costs"])
def test_bad_inputs_are_refused_before_anything_runs(tmp_path, case):
    truth, path, _ = _files(tmp_path)
    if case == "no batches":
        truth.write_text(json.dumps({"batches": []}))
    elif case == "missing":
        truth = tmp_path / "nowhere.json"
    else:   # costs up to one draft only: chain(2) cannot be priced
        truth.write_text(json.dumps({"batches": [{"batch": 2, "costs": {"true": COSTS[:2]}}]}))
    with pytest.raises(SystemExit):
        load_bench_script("poor_start_replay").main(
            ["--truth", str(truth), "--profiles", str(path), "--out", str(tmp_path / "o.json")])
    assert not (tmp_path / "o.json").exists()
