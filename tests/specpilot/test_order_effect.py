"""bench/order_effect.py on made-up interleaved rows: known system times, place factors and
drifts over the passes (and noise) are recovered; with fewer passes than systems it says the
places are not told apart; a file with no interleaved rows is refused."""
import json
import math
import random

import pytest

from bench_script import load_bench_script
from specpilot.bench.interleave import rotated

NAMES = ["strong_ar", "stock_graphed", "mech:graphed_refill_fused_accept", "mech:adaptive",
         "mech:depth"]


def _bench(tmp_path, seconds, place_factor, passes, noise=0.0, seed=0, drift=None):
    """Rows as `specpilot bench --interleave` writes them: each system's runs in rotated
    passes, seconds = its own x the factor of its place (x its drift per pass, counted from the
    middle pass) (x lognormal noise)."""
    drift = drift or {}
    rng = random.Random(seed)
    runs = {n: [] for n in seconds}
    places = {n: [] for n in seconds}
    for turn in range(passes):
        for place, name in enumerate(rotated(list(seconds), turn)):
            runs[name].append(seconds[name] * place_factor[place] * math.exp(rng.gauss(0, noise))
                              * drift.get(name, 1.0) ** (turn - (passes - 1) / 2))
            places[name].append(place)
    rows = [{"system": n, "batch_size": 16, "status": "measured", "new_tokens": 40000,
             "seconds": {"runs": runs[n], "median": sorted(runs[n])[len(runs[n]) // 2]},
             "tokens_per_s": {"median": 40000 / sorted(runs[n])[len(runs[n]) // 2]},
             "timing": {"mode": "interleaved", "systems": list(seconds), "places": places[n]}}
            for n in seconds]
    rows.append({"system": "hf_ar", "batch_size": 16, "status": "measured", "new_tokens": 1,
                 "seconds": {"runs": [9.0], "median": 9.0}, "tokens_per_s": {"median": 0.1}})
    path = tmp_path / "side.json"
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def _truth(seed):
    rng = random.Random(seed)
    seconds = {n: rng.uniform(1.2, 3.0) for n in NAMES}
    raw = [rng.uniform(0.97, 1.04) for _ in NAMES]
    mean = math.exp(sum(math.log(f) for f in raw) / len(raw))
    return seconds, [f / mean for f in raw]           # place factors averaging 1 in logs


@pytest.mark.parametrize("seed", [1, 2])
def test_a_full_rotation_recovers_each_system_and_each_place(tmp_path, seed, capsys):
    seconds, factor = _truth(seed)
    script = load_bench_script("order_effect")
    out = tmp_path / "order.json"
    assert script.main([_bench(tmp_path, seconds, factor, passes=5), "--out", str(out)]) == 0
    got = json.loads(out.read_text())["batches"]["16"]
    assert got["places_told_apart"] and got["residual_rms"] < 1e-9
    for place, f in enumerate(factor):
        assert got["places"][str(place)] == pytest.approx(f, rel=1e-9)
    for name, s in seconds.items():
        assert got["systems"][name]["seconds"] == pytest.approx(s, rel=1e-9)
        assert got["systems"][name]["tokens_per_s"] == pytest.approx(40000 / s, rel=1e-9)
        assert got["systems"][name]["over_against"] == pytest.approx(
            seconds["mech:graphed_refill_fused_accept"] / s, rel=1e-9)
    assert "hf_ar" not in got["systems"]
    assert "batch 16: place factors" in capsys.readouterr().out


def test_a_drift_over_the_passes_is_told_from_the_places(tmp_path, capsys):
    """Systems that slow down pass by pass (by different amounts, one not at all): each drift
    is recovered, and the places' factors and the systems' seconds at the middle pass stay
    exact; without the drift in the model they would not (the rotation meets a drifting system
    at each place in a different pass)."""
    seconds, factor = _truth(6)
    drift = {"mech:graphed_refill_fused_accept": 1.012, "mech:adaptive": 1.004,
             "stock_graphed": 0.997}
    script = load_bench_script("order_effect")
    out = tmp_path / "order.json"
    script.main([_bench(tmp_path, seconds, factor, passes=5, drift=drift), "--out", str(out)])
    got = json.loads(out.read_text())["batches"]["16"]
    assert got["places_told_apart"] and got["residual_rms"] < 1e-9
    for name, s in seconds.items():
        assert got["systems"][name]["drift_per_pass"] == pytest.approx(drift.get(name, 1.0),
                                                                       rel=1e-9)
        assert got["systems"][name]["seconds"] == pytest.approx(s, rel=1e-9)
    for place, f in enumerate(factor):
        assert got["places"][str(place)] == pytest.approx(f, rel=1e-9)
    assert "each pass +1.20 % on the last" in capsys.readouterr().out


def test_with_noise_and_two_rotations_the_estimates_stay_close(tmp_path):
    seconds, factor = _truth(3)
    script = load_bench_script("order_effect")
    out = tmp_path / "order.json"
    script.main([_bench(tmp_path, seconds, factor, passes=10, noise=0.002, seed=4),
                 "--out", str(out)])
    got = json.loads(out.read_text())["batches"]["16"]
    for name, s in seconds.items():
        assert got["systems"][name]["seconds"] == pytest.approx(s, rel=0.003)
    for place, f in enumerate(factor):
        assert got["places"][str(place)] == pytest.approx(f, rel=0.003)
    assert 0.0005 < got["residual_rms"] < 0.005


def test_one_pass_is_flagged_and_two_already_tell_places_apart(tmp_path, capsys):
    """One pass puts each system at one place only; two link every place through the rotation
    (noise-free here, so the fit is exact with one run to spare)."""
    seconds, factor = _truth(5)
    script = load_bench_script("order_effect")
    out = tmp_path / "order.json"
    script.main([_bench(tmp_path, seconds, factor, passes=1), "--out", str(out)])
    one = json.loads(out.read_text())["batches"]["16"]
    assert one["places_told_apart"] is False
    assert one["systems"]["strong_ar"]["drift_per_pass"] is None      # fitted from three passes
    assert "not told apart from the systems" in capsys.readouterr().out
    script.main([_bench(tmp_path, seconds, factor, passes=2), "--out", str(out)])
    got = json.loads(out.read_text())["batches"]["16"]
    assert got["places_told_apart"]
    for name, s in seconds.items():
        assert got["systems"][name]["seconds"] == pytest.approx(s, rel=1e-9)


def test_a_file_without_interleaved_rows_is_refused(tmp_path, capsys):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"rows": [{"system": "strong_ar", "batch_size": 16,
                                          "status": "measured"}]}))
    with pytest.raises(SystemExit) as exc:
        load_bench_script("order_effect").main([str(path)])
    assert exc.value.code == 2
    assert "no interleaved rows" in capsys.readouterr().err
