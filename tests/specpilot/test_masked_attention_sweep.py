"""bench/masked_attention_sweep.py end to end at a tiny size: a row per (shape, batch, tokens),
every variant that runs checked against the float64 reference, and the tree mask it builds
checked by hand (the prefix, then each node's ancestors and itself)."""
import json

import pytest
import torch
from bench_script import load_bench_script
from hf_factory import kernel_device
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def test_the_tree_mask_sees_the_prefix_and_each_nodes_ancestors():
    script = load_bench_script("masked_attention_sweep")
    q, k, v, mask, kv_len = script.tree_inputs(3, 6, 30, 20, 4, 2, 8, torch.float32, "cpu",
                                               seed=5)
    assert q.shape == (3, 6, 4, 8) and k.shape == v.shape == (3, 30, 2, 8)
    for b in range(3):
        start = int(kv_len[b]) - 6
        assert 15 <= start <= 20
        assert mask[b, :, :start].all() and not mask[b, :, start + 6:].any()
        tree = mask[b, :, start:start + 6]
        assert tree.diagonal().all() and not tree.triu(1).any()
        for i in range(1, 6):       # i sees exactly one parent and that parent's ancestors
            seen = tree[i, :i].nonzero().flatten().tolist()
            parent = max(seen)
            assert seen == tree[parent, :parent + 1].nonzero().flatten().tolist()


def test_every_variant_that_runs_matches_the_reference(tmp_path):
    script = load_bench_script("masked_attention_sweep")
    out = tmp_path / "sweep.json"
    # 49 slots: an odd cache (the padded additive mask's rows 56 apart)
    assert script.main(["--batch-sizes", "2", "--tokens", "1,5", "--context", "40", "--slack",
                        "9", "--scale", "0.25", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(s["shape"], s["batch"], s["tokens"]) for s in doc["shapes"]] == [
        (shape, 2, t) for shape in ("zoo-gpu-small", "zoo-gpu-small-drafter") for t in (1, 5)]
    for shape in doc["shapes"]:
        ran = {v["variant"]: v for v in shape["variants"] if "refused" not in v}
        # The runtime's own path and the generated kernel run everywhere; math always runs.
        assert {"grouped", "grouped_math", "expanded_math", "gqa", "grouped_additive",
                "grouped_additive_padded", "generated"} <= set(ran)
        for v in ran.values():
            if kernel_device() == "cpu":
                assert v["max_abs_error"] < 1e-5 and v["us_per_call"] is None
            else:
                assert v["max_abs_error"] < 2e-2 and v["us_per_call"] > 0


def test_slack_must_hold_the_widest_verification(tmp_path):
    script = load_bench_script("masked_attention_sweep")
    with pytest.raises(SystemExit):
        script.main(["--tokens", "65", "--slack", "10", "--out", str(tmp_path / "x.json")])


def test_the_padded_additive_mask_holds_the_same_values_rows_eight_slots_apart():
    script = load_bench_script("masked_attention_sweep")
    _, _, _, mask, _ = script.tree_inputs(2, 3, 13, 8, 4, 2, 8, torch.float32, "cpu", seed=2)
    plain = script.additive_rows(mask, 2, torch.bfloat16)
    padded = script.additive_rows(mask, 2, torch.bfloat16, pad_to=8)
    assert plain.shape == padded.shape == (2, 1, 6, 13)
    assert plain.stride()[-2] == 13 and padded.stride()[-2] == 16
    assert torch.equal(plain, padded)
    # row g * 3 + i of request b is token i's mask, for each of the 2 query heads of a kv head
    for b in range(2):
        for g in range(2):
            for i in range(3):
                expected = torch.where(mask[b, i], 0.0, float("-inf")).to(torch.bfloat16)
                assert torch.equal(padded[b, 0, g * 3 + i], expected)
