"""bench/profile_decode.py's --fast-ops: which fast-path modes it profiles, and a "layers" run
off a GPU (compiled blocks on the CPU) whose rows say the mode and how many graphs each block
compiled."""
import json
import math

import pytest

from bench_script import load_bench_script
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def test_fast_ops_modes_default_to_all_three_on_a_gpu_and_off_elsewhere():
    script = load_bench_script("profile_decode")
    assert script.modes(None, "cuda") == ["off", "ops", "layers"]
    assert script.modes(None, "cpu") == ["off"]
    assert script.modes("ops, layers", "cpu") == ["ops", "layers"]
    for bad in ("layer", "ops,fast", ","):
        with pytest.raises(SystemExit, match="--fast-ops"):
            script.modes(bad, "cuda")


@pytest.mark.slow
def test_a_layers_profile_reports_its_mode_and_graph_counts(tmp_path):
    out = tmp_path / "profile.json"
    script = load_bench_script("profile_decode")
    assert script.main(["--scale", "0.0625", "--batch-sizes", "2", "--context", "16",
                        "--new-tokens", "8", "--device", "cpu", "--fast-ops", "layers",
                        "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["fast_ops"] and row["fast_ops_mode"] == "layers"
    assert row["first_forward_s"] > 0 and row["ar_step_gpu_s"] > 0
    # A difference of two wall times (a long and a short run): off a GPU, on a busy machine, it
    # can come out negative, so only its presence is checked here.
    assert math.isfinite(row["round_wall_s"]) and row["rounds"] > 0
    for role in ("target", "drafter"):
        graphs = row["compiled_graphs"][role]
        layer = [n for name, n in graphs.items() if name.startswith("decoder_layer")]
        # Batch 2 only: a layer graph for single-token steps and one for wider forwards.
        assert layer == [2], graphs
