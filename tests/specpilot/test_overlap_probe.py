"""bench/overlap_probe.py end to end at a tiny size (eager, float32, the drafter's fused
kernels in Triton's interpreter): the row of a batch size with the four timings and what they
derive (one batch size: the interpreter is slow)."""
import json

import pytest

from bench_script import load_bench_script
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def test_a_batch_size_gets_its_timings_and_the_overlap_they_imply(tmp_path):
    script = load_bench_script("overlap_probe")
    out = tmp_path / "probe.json"
    assert script.main(["--batch-sizes", "2", "--k", "1", "--context", "8", "--scale", "0.25",
                        "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["batch"], r["k"], r["context"]) for r in doc["batches"]] == [(2, 1, 8)]
    for row in doc["batches"]:
        ms = row["ms"]
        assert set(ms) == {"verify", "draft", "one_stream", "two_streams"}
        assert all(v > 0 for v in ms.values())
        assert row["saved_ms"] == pytest.approx(ms["one_stream"] - ms["two_streams"])
        assert row["two_streams_over_longer"] == pytest.approx(
            ms["two_streams"] / max(ms["verify"], ms["draft"]))
        assert row["draft_hidden"] == pytest.approx(row["saved_ms"] / ms["draft"])


def test_a_drafter_the_fused_kernels_cannot_run_is_refused_with_the_reason(tmp_path, capsys):
    script = load_bench_script("overlap_probe")
    with pytest.raises(SystemExit):
        script.main(["--scale", "0.0625", "--out", str(tmp_path / "probe.json")])
    assert "the fused forward cannot run this model" in capsys.readouterr().err
    assert not (tmp_path / "probe.json").exists()
