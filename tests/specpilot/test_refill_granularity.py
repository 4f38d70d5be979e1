"""bench/refill_granularity.py on a hand-made acceptance profile: its figures are the schedule's
(checked by hand here), and a file that is not a profile is refused with its name."""
import json

import pytest

from bench_script import load_bench_script, write_profile


def test_a_profiles_rounds_by_replay_granularity(tmp_path, capsys):
    # Two slots, requests of 3, 1, 1 and 3 rounds (chain(2)): full rows 4, refilled at once 5,
    # one round a replay 8, two 12 (tests/specpilot/test_refill_replay.py works these by hand).
    rows = [[2, 2, 0], [1], [0], [2, 1, 1]]
    profile = write_profile(tmp_path / "p.json", {"kind": "chain", "k": 2}, rows,
                            [sum(a + 1 for a in r) + 1 for r in rows])
    out = tmp_path / "g.json"
    script = load_bench_script("refill_granularity")
    assert script.main([profile, "--batch-sizes", "2", "--rounds-per-replay", "1,2",
                        "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["profiles"]
    assert (row["requests"], row["request_rounds"], row["longest_request_rounds"]) == (4, 8, 3)
    (b,) = row["batches"]
    # longest first: 3 and 3 at once, then 1 and 1: 4 rounds, full rows exactly
    assert b == {"batch": 2, "full_rows": 4.0, "at_once": 5, "longest_first": 4,
                 "rounds_per_replay": {"1": 8, "2": 12}}
    assert "refilled at once 5" in capsys.readouterr().out


def test_a_file_that_is_not_a_profile_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(SystemExit):
        load_bench_script("refill_granularity").main([str(bad)])
    assert "bad.json" in capsys.readouterr().err
