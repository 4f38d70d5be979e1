"""bench/startoff_gap.py end to end off a GPU, at a small scale: the adaptive decoder is started
off by its workload memory (a useless drafter), every decoder (and plain AR with more cache
slots) is timed in every round and split into its phases, and bad counts are refused."""
import json

import pytest

from bench_script import load_bench_script
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()

# As in test_adaptive_extremes: after two calls of four, the memory starts the third off.
SMALL = ["--scale", "0.0625", "--batch", "4", "--prompt-len", "6", "--new-tokens", "30"]


def test_the_gap_script_times_a_started_off_batch_against_plain_ar(tmp_path):
    out = tmp_path / "gap.json"
    script = load_bench_script("startoff_gap")
    assert script.main(SMALL + ["--pairs", "3", "--split-pairs", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["adaptive_started_off"] is True
    rows = {r["system"]: r for r in doc["rows"]}
    assert set(rows) == {"plain AR", "adaptive", "plain AR, +8 slots"}
    for row in rows.values():
        assert len(row["call_ms"]) == 3 and all(t > 0 for t in row["call_ms"])
        phases = row["phase_ms_median"]
        assert set(phases) == {"start", "rounds", "finish"}
        assert all(v >= 0 for v in phases.values())
    for row in rows.values():
        assert row["x_plain_ar"] == pytest.approx(
            rows["plain AR"]["call_ms_median"] / row["call_ms_median"])
    assert rows["plain AR"]["x_plain_ar"] == 1.0
    # the splitting is undone: the module's loop is the real one again
    import specpilot.runtime.graphed_chain as graphed_chain
    from specpilot.runtime.graphed_loop import replay_until_done
    assert graphed_chain.replay_until_done is replay_until_done


@pytest.mark.parametrize("bad", [["--pairs", "0"], ["--extra-slots", "-1"]])
def test_bad_counts_are_refused(tmp_path, bad):
    with pytest.raises(SystemExit):
        load_bench_script("startoff_gap").main(SMALL + bad + ["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
