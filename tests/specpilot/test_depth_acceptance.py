"""bench/depth_acceptance.py on hand-made profiles: each depth's acceptance given the one
before, pooled over every round (worked by hand), and an adaptive system's profile refused."""
import json

import pytest

from bench_script import load_bench_script, write_profile

ROWS = [[2, 2, 0], [1], [0], [2, 1, 1]]          # chain(2): 8 rounds, 9 drafts accepted


def test_per_depth_acceptance_of_a_fixed_chain(tmp_path, capsys):
    profile = write_profile(tmp_path / "p.json", {"kind": "chain", "k": 2}, ROWS,
                            [sum(a + 1 for a in r) + 1 for r in ROWS],
                            source={"system": "stock_graphed"})
    out = tmp_path / "d.json"
    assert load_bench_script("depth_acceptance").main([profile, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["profiles"]
    # depth 1: 6 of 8 rounds accepted a first draft; depth 2: 3 of those 6 a second
    assert row["per_depth"] == pytest.approx([0.75, 0.5])
    assert (row["k"], row["rounds"]) == (2, 8)
    assert row["mean_accepted"] == pytest.approx(9 / 8)
    assert "per depth 0.750, 0.500" in capsys.readouterr().out


def test_an_adaptive_systems_profile_is_refused(tmp_path, capsys):
    profile = write_profile(tmp_path / "a.json", {"kind": "chain", "k": 2}, ROWS,
                            [sum(a + 1 for a in r) + 1 for r in ROWS],
                            source={"system": "mech:graphed_adaptive_refill_fused"})
    with pytest.raises(SystemExit):
        load_bench_script("depth_acceptance").main([profile])
    assert "not a fixed chain's profile" in capsys.readouterr().err
