"""bench/startoff_gap.py end to end off a GPU, at a small scale: the adaptive decoder is started
off by its workload memory (a useless drafter), every decoder (and plain AR with more cache
slots) is timed in every round and split into its phases, and bad counts are refused."""
import json

import pytest

from bench_script import load_bench_script
from hf_factory import make_checkpoint
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()
pytestmark = pytest.mark.usefixtures("cpu_only")     # off a GPU on any host

# As in test_adaptive_extremes: after two calls of four, the memory starts the third off.
SMALL = ["--scale", "0.0625", "--batch", "4", "--prompt-len", "6", "--new-tokens", "30"]


def test_the_gap_script_times_a_started_off_batch_against_plain_ar(tmp_path):
    out = tmp_path / "gap.json"
    script = load_bench_script("startoff_gap")
    assert script.main(SMALL + ["--calls", "3", "--split-calls", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["adaptive_started_off"] == {"adaptive": True, "adaptive + refill": True}
    rows = {r["system"]: r for r in doc["rows"]}
    assert set(rows) == {"plain AR", "adaptive", "adaptive + refill", "plain AR, +8 slots"}
    for name in ("adaptive", "adaptive + refill"):       # every timed call, whole and split
        assert rows[name]["calls_started_off"] == [True] * 5
    for row in rows.values():
        assert len(row["call_ms"]) == 3 and all(t > 0 for t in row["call_ms"])
        phases = row["phase_ms_median"]
        assert set(phases) == set(script.PHASES)
        assert all(v >= 0 for v in phases.values())
    # plain AR has no length policy: no start decision, the phase between reset and prefill
    assert rows["plain AR"]["phase_ms_median"]["start decision"] == 0
    assert "calls_started_off" not in rows["plain AR"]
    for row in rows.values():
        assert row["x_plain_ar"] == pytest.approx(
            rows["plain AR"]["call_ms_median"] / row["call_ms_median"])
        assert row["call_ms_mean"] == pytest.approx(sum(row["call_ms"]) / 3)
        assert row["x_plain_ar_mean"] == pytest.approx(
            rows["plain AR"]["call_ms_mean"] / row["call_ms_mean"])
    assert rows["plain AR"]["x_plain_ar"] == 1.0
    # the splitting is undone: the module's loop is the real one again
    import specpilot.runtime.graphed_chain as graphed_chain
    from specpilot.runtime.graphed_loop import replay_until_done
    assert graphed_chain.replay_until_done is replay_until_done


@pytest.mark.parametrize("bad", [["--calls", "0"], ["--extra-slots", "-1"]])
def test_bad_counts_are_refused(tmp_path, bad):
    with pytest.raises(SystemExit):
        load_bench_script("startoff_gap").main(SMALL + bad + ["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_pair_mode_uses_the_pairs_drafter_and_workload(tmp_path):
    """--pair: the script runs on a pair folder and the first --batch prompts of --workload
    (decode_models' own checks: tests/specpilot/test_decode_models.py), with the decoders it
    races, and says which timed calls started off."""
    root = tmp_path / "pair"
    make_checkpoint(root, "llama3", name="target", seed=51, hidden_size=64,
                    intermediate_size=128)
    make_checkpoint(root, "llama3", name="drafter", seed=52, hidden_size=64,
                    intermediate_size=128)
    (tmp_path / "prompts.txt").write_text("w3 w14 w15 w92\nw35 w89 w79\nw1 w2\n")
    out = tmp_path / "gap.json"
    assert load_bench_script("startoff_gap").main(
        ["--pair", str(root), "--workload", str(tmp_path / "prompts.txt"), "--batch", "2",
         "--new-tokens", "12", "--calls", "2", "--split-calls", "1", "--extra-slots", "0",
         "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["system"]: r for r in doc["rows"]}
    assert set(rows) == {"plain AR", "adaptive", "adaptive + refill"}
    for name in ("adaptive", "adaptive + refill"):
        flags = rows[name]["calls_started_off"]
        assert len(flags) == 3 and doc["adaptive_started_off"][name] == all(flags)
    assert doc["settings"]["pair"] == str(root) and doc["settings"]["batch"] == 2
