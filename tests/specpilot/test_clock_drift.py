"""bench/clock_drift.py on made-up interleaved runs and a made-up nvidia-smi log: each run gets
the samples taken while it ran; a system whose time follows the SM clock gets an elasticity of
-1, one that ignores it 0, one that slows with temperature its rate a degree; bad input is
refused in one line."""
import json
import math
import random
from datetime import datetime, timezone

import pytest

from bench_script import load_bench_script

T0 = 1_790_000_000.0            # some seconds since the epoch


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _files(tmp_path, seed=0):
    """Three systems in 4 passes of a few seconds each. The GPU's SM clock steps down pass by
    pass while its temperature climbs; 'clocked' takes base x (1980 / clock), 'flat' the same
    every run, 'warm' 0.4 % more a degree above 50 C."""
    rng = random.Random(seed)
    clocks, lines, rows = [], [], {n: ([], []) for n in ("clocked", "flat", "warm")}
    t = T0
    for turn in range(4):
        sm = 1980 - 45 * turn + rng.uniform(-5, 5)
        temp = 50 + 6 * turn + rng.uniform(0, 1)
        for name in ("clocked", "flat", "warm"):
            base = {"clocked": 1.3, "flat": 2.8, "warm": 1.5}[name]
            took = {"clocked": base * 1980 / sm, "flat": base,
                    "warm": base * math.exp(0.004 * (temp - 50))}[name]
            rows[name][0].append(t)
            rows[name][1].append(took)
            at = t + 0.01
            while at < t + took:                    # samples every 0.2 s while it runs
                lines.append(f"{_stamp(at)}, {sm:.0f}, 3201, {temp:.0f}, 612.30")
                clocks.append((at, sm, temp))
                at += 0.2
            t += took + 0.05
    # nvidia-smi rounds to whole MHz and degrees: the truth the runs took is what it logged.
    bench = {"rows": [{"system": n, "batch_size": 16, "status": "measured",
                       "seconds": {"runs": r[1]},
                       "timing": {"mode": "interleaved", "systems": list(rows),
                                  "places": [0, 1, 2, 0], "started": r[0]}}
                      for n, r in rows.items()]}
    bench_path, clock_path = tmp_path / "side.json", tmp_path / "gpu-clocks.csv"
    bench_path.write_text(json.dumps(bench))
    clock_path.write_text("\n".join(lines) + "\n")
    return str(bench_path), str(clock_path)


def test_each_system_gets_the_clock_it_ran_at_and_its_slopes(tmp_path, capsys):
    script = load_bench_script("clock_drift")
    bench, clocks = _files(tmp_path)
    out = tmp_path / "drift.json"
    assert script.main([bench, clocks, "--out", str(out)]) == 0
    got = json.loads(out.read_text())["batches"]["16"]
    samples = script.read_clocks(clocks)
    for name, s in got.items():
        assert s["unsampled_runs"] == 0
        for r in s["runs"]:
            assert r["samples"] >= 6 and r["mem_mhz"] == 3201
            assert r["power_w"] == pytest.approx(612.3)
    # The clock each run saw is the logged one of its pass (logged to the MHz)...
    clocked = got["clocked"]["runs"]
    for r in clocked:
        assert 1980 * 1.3 / r["seconds"] == pytest.approx(r["sm_mhz"], abs=0.5)
    # ...so a run taking base x 1980 / clock has an elasticity of -1 (to the rounding), a
    # flat one 0, and the warm one's slope a degree is its 0.4 % (to the degree's rounding).
    assert got["clocked"]["sm_clock_elasticity"] == pytest.approx(-1.0, abs=0.02)
    assert got["flat"]["sm_clock_elasticity"] == pytest.approx(0.0, abs=1e-9)
    assert got["warm"]["per_degree"] == pytest.approx(0.004, rel=0.2)
    assert got["flat"]["per_degree"] == pytest.approx(0.0, abs=1e-9)
    assert len(samples) == sum(r["samples"] for s in got.values() for r in s["runs"])
    assert "elasticity to the SM clock -1.0" in capsys.readouterr().out


def test_not_available_values_and_runs_with_no_sample(tmp_path, capsys):
    script = load_bench_script("clock_drift")
    bench, clocks = _files(tmp_path)
    lines = open(clocks).read().splitlines()
    # power not available anywhere; and only the first two samples kept
    kept = [line.rsplit(",", 1)[0] + ", [N/A]" for line in lines[:2]]
    open(clocks, "w").write("\n".join(kept) + "\n")
    out = tmp_path / "drift.json"
    script.main([bench, clocks, "--out", str(out)])
    got = json.loads(out.read_text())["batches"]["16"]
    first = got["clocked"]["runs"][0]
    assert first["samples"] == 2 and first["power_w"] is None and first["sm_mhz"] > 0
    assert got["clocked"]["unsampled_runs"] == 3
    assert got["clocked"]["sm_clock_elasticity"] is None          # one clock seen
    assert got["flat"]["runs"][0]["sm_mhz"] is None
    assert "runs with no sample: log more often" in capsys.readouterr().out


@pytest.mark.parametrize("change,message", [
    ("no-start", "its runs have no start times"),
    ("bad-stamp", "not a timestamp"),
    ("short-line", "expected 5 fields"),
])
def test_bad_input_is_refused_in_one_line(tmp_path, capsys, change, message):
    script = load_bench_script("clock_drift")
    bench, clocks = _files(tmp_path)
    if change == "no-start":
        doc = json.loads(open(bench).read())
        del doc["rows"][0]["timing"]["started"]
        open(bench, "w").write(json.dumps(doc))
    elif change == "bad-stamp":
        open(clocks, "a").write("yesterday, 1980, 3201, 50, 600\n")
    else:
        open(clocks, "a").write(f"{_stamp(T0)}, 1980\n")
    with pytest.raises(SystemExit) as exc:
        script.main([bench, clocks])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
