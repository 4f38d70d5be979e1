"""bench/fused_tiles.py end to end off a GPU (Triton's interpreter, a quarter-scale drafter): a
call past 16 tokens runs the wide tiles asked for, each variant's logits are within float32
roundings of the per-op forward's, and bad arguments are refused."""
import json
import os

import pytest
import torch

from bench_script import load_bench_script

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the script off a GPU")


def test_the_wide_tiles_are_timed_and_agree_with_the_per_op_forward(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    script = load_bench_script("fused_tiles")
    out = tmp_path / "tiles.json"
    assert script.main(["--models", "drafter", "--calls", "2x9", "--wide-rows", "32",
                        "--scale", "0.25", "--context", "8", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["calls"]
    assert (row["model"], row["rows"]) == ("drafter", 18)
    assert set(row["ms"]) == {"per_op", "fused_32"}        # no PDL off a Hopper GPU
    assert all(ms > 0 for ms in row["ms"].values())
    assert row["max_abs_diff_vs_per_op"]["per_op"] == 0.0
    assert 0 <= row["max_abs_diff_vs_per_op"]["fused_32"] < 1e-3


@pytest.mark.parametrize("args,message", [
    (["--calls", "16y5"], "BATCHxTOKENS"),
    (["--calls", "0x5"], "positive"),
    (["--models", "verifier"], "target and/or drafter"),
    (["--wide-rows", "48"], "16, 32 and/or 64"),
])
def test_bad_arguments_are_refused(tmp_path, capsys, args, message):
    script = load_bench_script("fused_tiles")
    with pytest.raises(SystemExit):
        script.main(args + ["--out", os.fspath(tmp_path / "x.json")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
