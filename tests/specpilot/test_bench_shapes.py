"""Shape presets (dimensions, proportions at a small scale, a forward checked against HF
transformers on the same random weights) and step-cost measurement on CPU."""
import math

import pytest
import torch

from specpilot.bench.shapes import (ShapeError, build_preset, get_preset, parse_shapes,
                                    random_tensors)
from specpilot.bench.step_costs import (measure_accept, measure_forwards, measure_tree_verify,
                                        time_median)
from specpilot.ir.topology import Chain, Tree
from specpilot.runtime.config import parse_model_config
from torch_threads import single_thread_fixture

SCALE = 1 / 32

# From the published config.json files of meta-llama/Llama-3.1-8B and Llama-3.2-1B.
PUBLISHED = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                         rope_theta=500000.0, rope_factor=8.0),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                         num_kv_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                         rope_theta=500000.0, rope_factor=32.0),
}


_one_thread = single_thread_fixture()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_presets_have_the_published_dimensions(name):
    cfg = get_preset(name).config()
    want = dict(PUBLISHED[name])
    assert cfg.rope_scaling.rope_type == "llama3"
    assert cfg.rope_scaling.factor == want.pop("rope_factor")
    assert (cfg.rope_scaling.low_freq_factor, cfg.rope_scaling.high_freq_factor,
            cfg.rope_scaling.original_max_position_embeddings) == (1.0, 4.0, 8192)
    for field, value in want.items():
        assert getattr(cfg, field) == value, field


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_scaled_presets_keep_the_proportions(name):
    full, small = get_preset(name).config(), get_preset(name).config(SCALE)
    for field in ("hidden_size", "intermediate_size", "head_dim", "vocab_size"):
        assert getattr(small, field) * 32 == getattr(full, field), field
    for field in ("num_layers", "num_heads", "num_kv_heads", "tie_word_embeddings", "rope_theta",
                  "rope_scaling"):
        assert getattr(small, field) == getattr(full, field), field
    assert small.num_heads * small.head_dim * full.hidden_size == \
        full.num_heads * full.head_dim * small.hidden_size


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_hf_config_of_a_preset_reads_back_as_the_same_model(name):
    preset = get_preset(name)
    assert parse_model_config(preset.hf_config(SCALE)) == preset.config(SCALE)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_scaled_preset_forward_matches_hf_on_the_same_weights(name):
    import transformers

    preset = get_preset(name)
    model = build_preset(name, "cpu", torch.float32, scale=SCALE, seed=3)
    cfg = dict(preset.hf_config(SCALE))
    hf_cfg = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(random_tensors(model.config, "cpu", torch.float32,
                                                            seed=3), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: lm_head is the embedding
    tokens = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(4))
    slots = torch.arange(5)[None, :].expand(2, 5)
    mask = torch.arange(8)[None, None, :] <= slots[:, :, None]
    ours = model.forward(tokens, slots, slots, mask, model.new_cache(2, 8))
    with torch.no_grad():
        theirs = hf(tokens).logits.float()
    assert torch.isfinite(ours).all() and ours.shape == (2, 5, model.config.vocab_size)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_random_weights_are_drawn_at_the_stated_scale_on_the_device():
    cfg = get_preset("llama-3.1-8b").config(SCALE)
    tensors = random_tensors(cfg, "cpu", torch.float32, seed=5)
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (cfg.num_heads * cfg.head_dim, cfg.hidden_size)
    assert q.std().item() == pytest.approx(1 / math.sqrt(cfg.hidden_size), rel=0.1)
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors.values())
    again = random_tensors(cfg, "cpu", torch.float32, seed=5)
    assert torch.equal(again["lm_head.weight"], tensors["lm_head.weight"])


@pytest.mark.parametrize("text,message", [
    ("llama-3.1-8b", "TARGET:DRAFTER"),
    ("llama-3.1-8b:gpt-9", "unknown shape preset 'gpt-9'"),
])
def test_bad_shape_names_are_refused(text, message):
    with pytest.raises(ShapeError, match=message):
        parse_shapes(text)


@pytest.mark.parametrize("scale,message", [(1 / 64, "head_dim 64"), (0, r"\(0, 1\]"),
                                           (1 / 3, "not a positive")])
def test_scales_that_break_a_dimension_are_refused(scale, message):
    with pytest.raises(ShapeError, match=message):
        get_preset("llama-3.2-1b").config(scale)


def test_step_costs_are_measured_for_every_width_and_shape():
    model = build_preset("llama-3.2-1b", "cpu", torch.float32, scale=SCALE, seed=6)
    costs = measure_forwards(model, 2, [1, 3, 2], context=6, graphed=False, warmup=0, repeats=2)
    assert sorted(costs) == [1, 2, 3]
    assert all(0 < s < 10 for s in costs.values())
    assert 0 < measure_tree_verify(model, 2, Tree((2, 2)), 6, False, 0, 1) < 10
    assert 0 < measure_accept(model, 2, Tree((2, 2)), 6, 0, 1) < 10
    assert 0 < measure_accept(model, 1, Chain(3), 6, 0, 1) < 10


def test_time_median_is_the_median_of_the_timed_runs():
    calls = []
    durations = iter([0.0, 0.03, 0.01, 0.02])   # first call is the warm-up

    def fn():
        import time
        calls.append(1)
        time.sleep(next(durations))

    assert time_median(fn, torch.device("cpu"), warmup=1, repeats=3) == pytest.approx(0.02, abs=5e-3)
    assert len(calls) == 4


def test_zoo_shape_presets_have_the_zoo_pairs_dimensions():
    from specpilot.bench.shapes import get_preset as get_shape
    from specpilot.zoo.presets import get_preset as get_zoo

    zoo = get_zoo("gpu-small")
    for shape_name, dims in (("zoo-gpu-small", zoo.target), ("zoo-gpu-small-drafter", zoo.drafter)):
        c = get_shape(shape_name).config()
        assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads,
                c.head_dim, c.vocab_size) == (dims.hidden, dims.intermediate, dims.layers,
                                               dims.heads, dims.kv_heads, dims.head_dim,
                                               zoo.vocab_size)
        assert get_shape(shape_name).hf_config()["rope_parameters"]["rope_type"] == "default"


def test_step_costs_read_back_from_a_result_file_and_bad_files_are_named(tmp_path):
    import json

    from specpilot.bench.step_costs import StepCosts, read_step_costs
    from specpilot.ir.errors import SpecPilotError

    costs = StepCosts(context=64, graphed=True)
    costs.target_costs[4] = {1: 1.5e-3, 5: 2.25e-3}
    costs.round_costs[str(Chain(2))] = {4: 3.5e-3}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"step_costs": costs.to_json(), "settings": {"shapes": "x"}}))
    got, doc = read_step_costs(str(path))
    assert got.target(4, 5) == 2.25e-3 and got.round(4, Chain(2)) == 3.5e-3
    assert doc["settings"] == {"shapes": "x"}
    with pytest.raises(SpecPilotError, match="cannot read step costs"):
        read_step_costs(str(tmp_path / "missing.json"))
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SpecPilotError, match="is not a `specpilot bench --shapes` result"):
        read_step_costs(str(tmp_path / "other.json"))
