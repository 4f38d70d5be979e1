"""build_deployment / model_spec_from_checkpoint against configs written by HF transformers."""
import os
import random

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from specpilot.deploy import build_deployment, model_spec_from_checkpoint
from specpilot.ir import linear_names, stock_program, verify
from specpilot.ir.errors import SpecPilotError

CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config,
           "qwen3": Qwen3Config}


def _random_config(cls, rng, **overrides):
    heads = rng.choice([2, 4, 8])
    kw = dict(vocab_size=rng.randrange(32, 200), num_attention_heads=heads,
              num_key_value_heads=rng.choice([k for k in (1, 2, heads) if heads % k == 0]),
              hidden_size=heads * rng.choice([4, 8]), intermediate_size=rng.randrange(8, 64),
              num_hidden_layers=rng.randrange(1, 4), tie_word_embeddings=rng.random() < 0.5)
    kw.update(overrides)
    return cls(**kw)


def _save(cfg, folder):
    cfg.save_pretrained(folder)  # config.json only: deploy reads nothing else
    return str(folder)


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_model_spec_matches_the_hf_config(tmp_path, family, dtype):
    rng = random.Random()
    cfg = _random_config(CONFIGS[family], rng)
    folder = _save(cfg, tmp_path / family)
    spec = model_spec_from_checkpoint(folder, "drafter", dtype)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert spec.role == "drafter" and spec.family == family and spec.dtype == dtype
    assert spec.checkpoint == os.path.abspath(folder)
    assert (spec.vocab_size, spec.hidden_size, spec.intermediate_size, spec.num_layers,
            spec.num_heads, spec.num_kv_heads, spec.head_dim) == (
        cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
        cfg.num_attention_heads, cfg.num_key_value_heads, head_dim)
    assert spec.tie_embeddings == cfg.tie_word_embeddings
    assert spec.qkv_bias == (family == "qwen2")  # Qwen2 always has q/k/v biases
    assert spec.qk_norm == (family == "qwen3")
    assert spec.layer_kinds == ("attention",) * cfg.num_hidden_layers
    dense = {"bfloat16": "bf16", "float32": "fp32"}[dtype]
    assert spec.weight_formats == tuple((n, dense) for n in linear_names(cfg.num_hidden_layers))
    assert spec.lossless12_escape_ppm == ()


def test_build_deployment_gives_a_verified_stock_program(tmp_path):
    rng = random.Random()
    vocab = rng.randrange(32, 200)
    target = _save(_random_config(Qwen2Config, rng, vocab_size=vocab, num_hidden_layers=3),
                   tmp_path / "t")
    drafter = _save(_random_config(Qwen2Config, rng, vocab_size=vocab, num_hidden_layers=1),
                    tmp_path / "d")
    d = build_deployment(target, drafter, gpu="NVIDIA H200", workload="humaneval")
    assert (d.gpu, d.workload) == ("NVIDIA H200", "humaneval")
    assert (d.target.role, d.target.num_layers) == ("target", 3)
    assert (d.drafter.role, d.drafter.num_layers) == ("drafter", 1)
    verify(stock_program(d))


def test_vocabulary_mismatch_names_both_sizes(tmp_path):
    rng = random.Random()
    target = _save(_random_config(LlamaConfig, rng, vocab_size=128), tmp_path / "t")
    drafter = _save(_random_config(LlamaConfig, rng, vocab_size=96), tmp_path / "d")
    with pytest.raises(SpecPilotError) as info:
        build_deployment(target, drafter)
    message = str(info.value)
    assert "128" in message and "96" in message and "tokenizer" in message


def test_bad_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(SpecPilotError, match="does not exist"):
        model_spec_from_checkpoint(str(tmp_path / "missing"), "target")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecPilotError, match="config.json"):
        model_spec_from_checkpoint(str(tmp_path / "empty"), "target")
    biased = _save(_random_config(LlamaConfig, random.Random(), attention_bias=True),
                   tmp_path / "biased")
    with pytest.raises(SpecPilotError, match="o_proj biases are not supported"):
        model_spec_from_checkpoint(biased, "target")
    ok = _save(_random_config(LlamaConfig, random.Random()), tmp_path / "ok")
    with pytest.raises(SpecPilotError, match="role must be one of target, drafter"):
        model_spec_from_checkpoint(ok, "oracle")
    with pytest.raises(SpecPilotError, match="dtype must be one of bfloat16, float32"):
        model_spec_from_checkpoint(ok, "target", "float16")
