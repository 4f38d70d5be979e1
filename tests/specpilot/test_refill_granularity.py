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
    # packed: 3 | 3 at capacity 4, then 1 | 1: the same order as longest first
    assert b == {"batch": 2, "full_rows": 4.0, "at_once": 5, "longest_first": 4, "packed": 4,
                 "rounds_per_replay": {"1": 8, "2": 12}}
    assert "refilled at once 5" in capsys.readouterr().out


def test_a_file_that_is_not_a_profile_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(SystemExit):
        load_bench_script("refill_granularity").main([str(bad)])
    assert "bad.json" in capsys.readouterr().err


def test_packing_beats_longest_first_where_longest_first_is_not_the_best_order():
    # LPT's textbook case: two slots, requests of 3, 3, 2, 2, 2 rounds. Longest first puts the
    # two 3s side by side and ends at 7; 3 + 3 | 2 + 2 + 2 fills both slots to 6 (full rows).
    from specpilot.cost.refill_schedule import packed_order, refill_steps

    rounds = [2, 3, 2, 3, 2]
    assert refill_steps(sorted(rounds, reverse=True), 2) == 7
    order = packed_order(rounds, 2)
    assert sorted(order) == sorted(rounds)
    # the slots' plans (3, 3 | 2, 2, 2) by start: 3 and 2 at 0, 2 at 2, 3 at 3, 2 at 4
    assert order == [3, 2, 2, 3, 2]
    assert refill_steps(order, 2) == 6
