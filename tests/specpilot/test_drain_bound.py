"""bench/drain_bound.py on a hand-made bench result and acceptance profile: the schedules'
rounds (the refill schedule's, worked by hand in tests/specpilot/test_refill_granularity.py)
priced at the row's own rate, and a profile that is not the row's refused."""
import json

import pytest

from bench_script import load_bench_script, write_profile

# Two slots, requests of 3, 1, 1 and 3 rounds (chain(2)): one round a replay 8 rounds, refilled
# at once 5, longest first 4, packed (3 + 1 | 3 + 1) 4, full rows 4.
ROWS = [[2, 2, 0], [1], [0], [2, 1, 1]]


def _bench(tmp_path, forwards=11, seconds=0.0101):
    def row(system, s, **more):
        return {"system": system, "batch_size": 2, "status": "measured", "requests": 4,
                "seconds": {"median": s}, **more}
    doc = {"rows": [row("strong_ar", 0.02), row("stock_graphed", 0.03),
                    row("mech:graphed_refill_fused", seconds, target_forwards=forwards)]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _profile(tmp_path, source=None):
    return write_profile(tmp_path / "p.json", {"kind": "chain", "k": 2}, ROWS,
                         [sum(a + 1 for a in r) + 1 for r in ROWS],
                         source=source or {"system": "mech:graphed_refill_fused",
                                           "batch_size": 2})


def test_each_schedule_is_priced_at_the_calls_own_round(tmp_path, capsys):
    out = tmp_path / "d.json"
    script = load_bench_script("drain_bound")
    # 8 rounds + 3 prefills = 11 forwards; two admissions of 0.05 ms leave 10 ms: 1.25 ms a round
    assert script.main([_bench(tmp_path), _profile(tmp_path), "--admission-ms", "0.05",
                        "--out", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    assert result["round_ms"] == pytest.approx(1.25)
    want = {"loop": 8, "at_once": 5, "longest_first": 4, "packed": 4, "full_rows": 4.0}
    for name, rounds in want.items():
        s = result["schedules"][name]
        seconds = 0.0001 + rounds * 0.00125
        assert s["rounds"] == rounds
        assert s["seconds"] == pytest.approx(seconds)
        assert s["x_strong_ar"] == pytest.approx(0.02 / seconds)
        assert s["x_stock"] == pytest.approx(0.03 / seconds)
    assert result["schedules"]["loop"]["seconds"] == pytest.approx(0.0101)   # the measurement
    assert result["stock_x_strong_ar"] == pytest.approx(0.02 / 0.03)
    assert "longest_first" in capsys.readouterr().out


def test_a_profile_whose_schedule_misses_the_rows_forwards_is_refused(tmp_path, capsys):
    script = load_bench_script("drain_bound")
    with pytest.raises(SystemExit):
        script.main([_bench(tmp_path, forwards=12), _profile(tmp_path)])
    assert "8 rounds and 3 prefills, the row 12 target forwards" in capsys.readouterr().err
    # at two rounds a replay the same schedule is 12 rounds: not this row's either
    with pytest.raises(SystemExit):
        script.main([_bench(tmp_path), _profile(tmp_path), "--rounds-per-replay", "2"])
    assert "not 2 rounds a replay" in capsys.readouterr().err


def test_a_profile_that_names_no_system_needs_it_given(tmp_path, capsys):
    script = load_bench_script("drain_bound")
    bare = _profile(tmp_path, source={"hand": True})
    with pytest.raises(SystemExit):
        script.main([_bench(tmp_path), bare])
    assert "give --system and --batch" in capsys.readouterr().err
    assert script.main([_bench(tmp_path), bare, "--system", "mech:graphed_refill_fused",
                        "--batch", "2"]) == 0
    with pytest.raises(SystemExit):
        script.main([_bench(tmp_path), bare, "--system", "mech:nothing", "--batch", "2"])
    assert "no measured row of mech:nothing at batch 2" in capsys.readouterr().err
