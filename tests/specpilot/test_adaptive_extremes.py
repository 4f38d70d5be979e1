"""bench/adaptive_extremes.py end to end off a GPU, at a small scale: the refill decoder given one
batch of prompts runs round for round as the padded adaptive decoder (the workload memory
starting a useless drafter's call off in both), a perfect drafter keeps the longest chain, and
unknown systems or drafters are refused by name."""
import json
import math

import pytest

from bench_script import load_bench_script
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()

NEW = 30    # new tokens per request


def test_refill_with_one_batch_runs_as_the_padded_adaptive_decoder(tmp_path):
    out = tmp_path / "extremes.json"
    # Three calls of four requests each (a warm-up and two timed): the workload memory has
    # eight requests after two, enough to start the third off.
    script = load_bench_script("adaptive_extremes")
    assert script.main(["--scale", "0.0625", "--batch-sizes", "4", "--prompt-len", "6",
                        "--new-tokens", str(NEW), "--repeats", "2",
                        "--systems", "adaptive,adaptive+refill", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    by = {(r["drafter"], r["system"]): r for r in rows}
    assert set(by) == {("-", "plain AR"), ("useless", "adaptive"),
                       ("useless", "adaptive+refill"), ("perfect", "adaptive"),
                       ("perfect", "adaptive+refill")}
    # Off a GPU one round a replay, and the host reads "done" one replay late: a plain step
    # per new token after the prefill's, and one more.
    plain_rounds = (NEW - 1) + 1
    assert by[("-", "plain AR")]["rounds"] == {"rounds_chain_0": plain_rounds}
    for name in ("useless", "perfect"):
        padded, refill = by[(name, "adaptive")], by[(name, "adaptive+refill")]
        assert refill["rounds"] == {**padded["rounds"], "refills": 0}
        assert refill["target_forwards"] == padded["target_forwards"]
    # The target as its own drafter: every round the longest chain, 5 tokens each, and the
    # same round late.
    perfect_rounds = math.ceil((NEW - 1) / 5) + 1
    assert by[("perfect", "adaptive")]["rounds"] == {"rounds_chain_4": perfect_rounds}
    # The useless drafter's last call started off: plain steps only, in both decoders.
    assert by[("useless", "adaptive")]["rounds"] == {"rounds_chain_0": plain_rounds}


@pytest.mark.parametrize("flag,value", [("--systems", "adaptive,tree"), ("--drafters", "half")])
def test_unknown_systems_and_drafters_are_refused(tmp_path, flag, value, capsys):
    with pytest.raises(SystemExit):
        load_bench_script("adaptive_extremes").main([flag, value,
                                                     "--out", str(tmp_path / "x.json")])
    assert value.split(",")[-1] in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
