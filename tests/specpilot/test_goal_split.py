"""bench/goal_split.py on hand-made bench rows: the goal's ratio split into the forwards' ratio
and the price of a forward, worked by hand."""
import json

import pytest

from bench_script import load_bench_script


def _bench(tmp_path, stock_tokens=40000):
    def row(system, forwards, seconds, tokens):
        return {"system": system, "batch_size": 16, "status": "measured", "requests": 176,
                "new_tokens": tokens, "target_forwards": forwards, "seconds": {"median": seconds},
                "tokens_per_s": {"median": tokens / seconds}}
    doc = {"rows": [row("strong_ar", 2871, 2.8, 40000),
                    row("stock_graphed", 1500, 3.0, stock_tokens),
                    row("mech:graphed_refill_fused", 1000, 1.6, 40000),
                    {"system": "mech:graphed_refill_fused", "batch_size": 64,
                     "status": "skipped", "reason": "time budget"}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_ratio_is_the_forwards_ratio_times_the_price_ratio(tmp_path, capsys):
    script = load_bench_script("goal_split")
    out = tmp_path / "split.json"
    assert script.main([_bench(tmp_path), "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    # 1500 / 1000 forwards; 2.0 ms a forward against 1.6: 1.5 x 1.25 = 1.875 = 25000 / 13333.3
    assert r["forwards_ratio"] == pytest.approx(1.5)
    assert r["stock_ms_per_forward"] == pytest.approx(2.0)
    assert r["row_ms_per_forward"] == pytest.approx(1.6)
    assert r["price_ratio"] == pytest.approx(1.25)
    assert r["tokens_ratio"] == 1.0
    assert r["row_x_stock"] == pytest.approx(1.875)
    assert "= 1.875x stock" in capsys.readouterr().out


def test_rows_of_different_token_counts_keep_the_tokens_factor(tmp_path):
    script = load_bench_script("goal_split")
    out = tmp_path / "split.json"
    # The stock rows ran one request 255 tokens past the reference.
    assert script.main([_bench(tmp_path, stock_tokens=40255), "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["tokens_ratio"] == pytest.approx(40000 / 40255)
    assert r["row_x_stock"] == pytest.approx(
        r["forwards_ratio"] * r["price_ratio"] * r["tokens_ratio"])
    assert r["row_x_stock"] == pytest.approx((40000 / 1.6) / (40255 / 3.0))


def test_a_row_the_file_did_not_measure_is_an_error(tmp_path, capsys):
    script = load_bench_script("goal_split")
    with pytest.raises(SystemExit):
        script.main([_bench(tmp_path), "--batch", "64"])
    assert "no measured row of stock_graphed at batch 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main([_bench(tmp_path), "--system", "mech:graphed_adaptive_refill_fused"])
    assert ("no measured row of mech:graphed_adaptive_refill_fused at batch 16"
            in capsys.readouterr().err)
