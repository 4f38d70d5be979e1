"""bench/profile_decode.py runs end to end off a GPU (uncaptured loops, tiny widths) and writes
one row per batch size whose measured times are positive and whose round counts match the
decode."""
import json
import math

from bench_script import load_bench_script
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def test_profile_script_writes_a_row_per_batch(tmp_path):
    module = load_bench_script("profile_decode")
    out = tmp_path / "profile.json"
    assert module.main(["--scale", "0.0625", "--batch-sizes", "1,2", "--context", "16",
                        "--new-tokens", "8", "--device", "cpu", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 2] and not any(r["fast_ops"] for r in rows)
    for r in rows:
        assert all(r[key] > 0 for key in ("ar_step_gpu_s", "prefill_wall_s", "round_gpu_s"))
        # A difference of two wall times (a long and a short run): off a GPU, on a busy
        # machine, it can come out negative, so only its presence is checked.
        assert math.isfinite(r["round_wall_s"])
        # Random weights: drafts are almost never accepted, so about one round per new token.
        assert 4 <= r["rounds"] <= 8
