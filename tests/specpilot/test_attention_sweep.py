"""bench/attention_sweep.py end to end at a tiny size (Triton's interpreter, float32): a row per
(batch, tokens) and per variant (slot block, warps, splits, bounded or not), each variant's output
checked against the float64 reference (float32 in the interpreter; bf16 and timed on a GPU)."""
import json

from bench_script import load_bench_script
from hf_factory import kernel_device
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def test_every_variant_is_checked_against_the_reference(tmp_path):
    script = load_bench_script("attention_sweep")
    out = tmp_path / "sweep.json"
    assert script.main(["--batch-sizes", "2", "--tokens", "1,2", "--context", "40", "--slack",
                        "9", "--blocks", "16,32", "--warps", "4", "--splits", "1,3",
                        "--scale", "0.25", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(s["batch"], s["tokens"]) for s in doc["shapes"]] == [(2, 1), (2, 2)]
    for shape in doc["shapes"]:
        variants = {(v["block_s"], v["num_warps"], v["splits"], v["kv_len"]): v
                    for v in shape["variants"]}
        assert set(variants) == {(b, 4, splits, bounded) for b in (16, 32) for splits in (1, 3)
                                 for bounded in (False, True)}
        for v in variants.values():
            if kernel_device() == "cpu":
                assert v["max_abs_error"] < 1e-5 and v["us_per_launch"] is None
            else:
                assert v["max_abs_error"] < 2e-2 and v["us_per_launch"] > 0
