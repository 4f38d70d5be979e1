"""The bench's GPU paths: shape presets built on the device (the full Llama-3.1-8B included),
CUDA-graphed step costs, and the pair bench with the CUDA-graphed strong AR measured.
Skipped on a machine without CUDA."""
import json
import shutil

import pytest
import torch

from hf_factory import make_checkpoint
from specpilot.bench.shapes import build_preset, get_preset
from specpilot.bench.step_costs import measure_accept, measure_forwards, measure_tree_verify
from specpilot.cli_bench import main
from specpilot.ir.topology import Chain, Tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _param_bytes(cfg) -> int:
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    per_layer = (h * d * (cfg.num_heads * 2 + cfg.num_kv_heads * 2) + 3 * h * i + 2 * h)
    heads = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return 2 * (cfg.num_layers * per_layer + heads + h)


def test_full_llama_8b_preset_is_built_on_the_gpu_without_extra_copies():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model = build_preset("llama-3.1-8b", "cuda", torch.bfloat16)
    cfg = model.config
    weights = _param_bytes(cfg)
    assert 16.0e9 < weights < 16.1e9   # 8.03B parameters in bf16
    assert torch.cuda.memory_allocated() - before == pytest.approx(weights, rel=0.01)
    # No float32 staging or second copy on the device while the weights were drawn.
    assert torch.cuda.max_memory_allocated() - before < 1.02 * weights
    assert model.embed.is_cuda and model.embed.dtype == torch.bfloat16
    w, _ = model.layers[31].linears["mlp.down_proj"]
    assert w.is_cuda and w.shape == (4096, 14336)
    cache = model.new_cache(1, 16)
    t = torch.tensor([[1, 2, 3]], device="cuda")
    slots = torch.arange(3, device="cuda")[None, :]
    mask = torch.arange(16, device="cuda")[None, None, :] <= slots[:, :, None]
    logits = model.forward(t, slots, slots, mask, cache)
    assert logits.shape == (1, 3, 128256) and torch.isfinite(logits).all()
    del model, cache, logits
    torch.cuda.empty_cache()


def test_graphed_step_costs_on_a_scaled_preset():
    model = build_preset("llama-3.2-1b", "cuda", torch.bfloat16, scale=1 / 8)
    assert get_preset("llama-3.2-1b").config(1 / 8).hidden_size == model.config.hidden_size == 256
    costs = measure_forwards(model, 4, range(1, 6), context=64, graphed=True, warmup=2, repeats=5)
    assert sorted(costs) == [1, 2, 3, 4, 5] and all(0 < s < 0.5 for s in costs.values())
    assert 0 < measure_tree_verify(model, 4, Tree((2, 2)), 64, True, 2, 5) < 0.5
    assert 0 < measure_accept(model, 4, Chain(4), 64, 1, 3) < 0.5


def test_pair_bench_measures_strong_ar_and_forces_it(tmp_path):
    target = make_checkpoint(tmp_path / "pair", "llama3", name="target", seed=71, hidden_size=64,
                             intermediate_size=128)
    shutil.copytree(target, tmp_path / "pair" / "drafter")
    (tmp_path / "prompts.txt").write_text("w3 w14 w15 w92\nw35 w89 w79\nw1\n")
    code = main(["--pair", str(tmp_path / "pair"), "--workload", str(tmp_path / "prompts.txt"),
                 "--max-new-tokens", "24", "--batch-sizes", "1,4", "--repeats", "2",
                 "--out-dir", str(tmp_path / "out"), "--name", "gpu", "--device", "cuda"])
    assert code == 0
    doc = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert doc["settings"]["dtype"] == "bfloat16" and doc["environment"]["gpu"] != "cpu"
    rows = {(r["system"], r["batch_size"]): r for r in doc["rows"] if r["status"] == "measured"}
    for b in (1, 4):
        strong = rows[("strong_ar", b)]
        assert strong["forcing"]["passed"] and strong["forcing"]["violation_count"] == 0
        assert strong["peak_memory_bytes"] > 0
        for (system, bb), r in rows.items():
            if bb == b:
                assert r["speedup_vs_strong_ar"] == pytest.approx(
                    r["tokens_per_s"]["median"] / strong["tokens_per_s"]["median"])
        for system in ("ar_torch", "stock", "stock_graphed"):
            assert rows[(system, b)]["forcing"]["violation_count"] == 0
        assert rows[("stock_graphed", b)]["mean_accepted"] == pytest.approx(
            rows[("stock", b)]["mean_accepted"], rel=0.2)


def test_interleaved_graphed_systems_match_their_runs_alone(tmp_path):
    """`--interleave` on the GPU: graphed decoders kept alive side by side (their captured
    graphs replayed in rotated passes) decode as each does alone, forcing clean, with a peak
    memory of its own (as if alone: under the sum of every system's)."""
    target = make_checkpoint(tmp_path / "pair", "llama3", name="target", seed=73, hidden_size=64,
                             intermediate_size=128)
    shutil.copytree(target, tmp_path / "pair" / "drafter")
    (tmp_path / "prompts.txt").write_text("w3 w14 w15 w92\nw35 w89 w79\nw1\nw7 w7 w2\nw40\n")
    docs = {}
    for name, extra in (("alone", []), ("side", ["--interleave"])):
        code = main(["--pair", str(tmp_path / "pair"), "--workload", str(tmp_path / "prompts.txt"),
                     "--max-new-tokens", "24", "--batch-sizes", "2", "--repeats", "2",
                     "--mechanisms", "--systems",
                     "strong_ar,stock_graphed,mech:graphed_refill_fused_accept,"
                     "mech:graphed_adaptive_refill_fused_accept", *extra,
                     "--out-dir", str(tmp_path / "out"), "--name", name, "--device", "cuda"])
        assert code == 0
        doc = json.loads((tmp_path / "out" / f"{name}.json").read_text())
        docs[name] = {r["system"]: r for r in doc["rows"]}
    side, alone = docs["side"], docs["alone"]
    group = list(side)
    assert all(r["status"] == "measured" for r in side.values()), side
    for system, r in side.items():
        assert r["timing"]["mode"] == "interleaved" and r["timing"]["systems"] == group
        assert r["forcing"]["passed"] and r["forcing"]["violation_count"] == 0
        assert r["new_tokens"] == alone[system]["new_tokens"]
        if "adaptive" not in system:    # lengths chosen by timed prices may differ
            assert r["target_forwards"] == alone[system]["target_forwards"]
        assert 0 < r["peak_memory_bytes"] < sum(a["peak_memory_bytes"] for a in alone.values())
