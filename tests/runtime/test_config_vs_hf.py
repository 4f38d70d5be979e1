"""config.json parsing against HF: the model HF builds from the same file is the reference.

Hand-written config dicts exercise what `save_pretrained` never writes: omitted fields (each
family's class defaults differ), the 4.x and 5.x RoPE spellings, Qwen's per-layer sliding
windows. For each, every attribute our ModelConfig resolves is read back from the HF model
(its modules, its rotary inverse frequencies), not from HF's config defaults.
"""
import json

import pytest
import torch

from specpilot.runtime.config import load_model_config, parse_model_config
from specpilot.runtime.rope import inverse_frequencies

from hf_factory import make_checkpoint, other_rope_spelling, rewrite_config

_SMALL = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4}

CONFIGS = {
    # Omitted num_key_value_heads / head_dim / rope: Llama defaults (kv = heads, theta 1e4).
    "llama-minimal": dict(_SMALL, model_type="llama"),
    # Mistral defaults: 8 kv heads, a 4096 window on every layer.
    "mistral-minimal": dict(_SMALL, model_type="mistral", hidden_size=64, num_attention_heads=8),
    # An explicit null window switches sliding off.
    "mistral-null-window": dict(_SMALL, model_type="mistral", num_key_value_heads=2,
                                sliding_window=None),
    # Qwen2 defaults: 32 kv heads; a window in the file is ignored unless switched on.
    "qwen2-window-off": dict(_SMALL, model_type="qwen2", hidden_size=64, num_attention_heads=32,
                             sliding_window=4),
    # Switched on, it applies from max_window_layers on (here layer 1 only).
    "qwen2-window-on": dict(_SMALL, model_type="qwen2", num_key_value_heads=2,
                            use_sliding_window=True, sliding_window=4, max_window_layers=1),
    # Explicit layer_types win over max_window_layers.
    "qwen3-layer-types": dict(_SMALL, model_type="qwen3", num_key_value_heads=2, head_dim=8,
                              use_sliding_window=True, sliding_window=3, max_window_layers=5,
                              layer_types=["sliding_attention", "full_attention"]),
    # Qwen3 without head_dim: 128, whatever hidden / heads is. attention_bias covers o_proj too.
    "qwen3-default-head-dim": dict(_SMALL, model_type="qwen3", num_key_value_heads=2,
                                   attention_bias=True),
    "llama-bias": dict(_SMALL, model_type="llama", attention_bias=True, mlp_bias=True),
    # Mistral and Qwen2 ignore attention_bias / mlp_bias (their projections are fixed).
    "mistral-ignores-bias": dict(_SMALL, model_type="mistral", num_key_value_heads=2,
                                 attention_bias=True, mlp_bias=True),
    "qwen2-ignores-mlp-bias": dict(_SMALL, model_type="qwen2", num_key_value_heads=4,
                                   mlp_bias=True, tie_word_embeddings=True),
    # 4.x spelling, llama3 scaling; original_max_position_embeddings defaults to the context.
    "llama3.1-4x-no-original": dict(_SMALL, model_type="llama", max_position_embeddings=300,
                                    rope_theta=500000.0,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0}),
    # 4.x spelling with the legacy key `type`.
    "linear-legacy-type": dict(_SMALL, model_type="llama", rope_theta=20000.0,
                               rope_scaling={"type": "linear", "factor": 3.0}),
    # 5.x spelling.
    "llama3.1-5x": dict(_SMALL, model_type="llama", max_position_embeddings=1024,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                         "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 256}),
}


def _hf_model(cfg_dict):
    import transformers

    d = dict(cfg_dict)
    hf_cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    return transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)


def _hf_window(model, layer: int):
    """The sliding window HF applies on `layer`, read from the modeling code's own state."""
    attn = model.model.layers[layer].self_attn
    if hasattr(attn, "sliding_window"):          # Qwen2/Qwen3: decided per layer
        return attn.sliding_window
    if model.config.model_type == "mistral":     # Mistral: the config window on every layer
        return model.config.sliding_window
    return None


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parsed_config_matches_the_model_hf_builds(name):
    raw = CONFIGS[name]
    ours = parse_model_config(json.loads(json.dumps(raw)))
    hf = _hf_model(raw)
    attn = hf.model.layers[0].self_attn
    mlp = hf.model.layers[0].mlp
    assert ours.head_dim == attn.head_dim
    assert ours.num_heads * ours.head_dim == attn.q_proj.out_features
    assert ours.num_kv_heads * ours.head_dim == attn.k_proj.out_features
    assert ours.attention_bias == (attn.q_proj.bias is not None)
    assert ours.o_bias == (attn.o_proj.bias is not None)
    assert ours.mlp_bias == (mlp.gate_proj.bias is not None)
    assert ours.qk_norm == hasattr(attn, "q_norm")
    assert ours.tie_word_embeddings == (hf.lm_head.weight is hf.model.embed_tokens.weight)
    assert ours.max_position_embeddings == hf.config.max_position_embeddings
    assert [ours.window_of(i) for i in range(ours.num_layers)] == \
        [_hf_window(hf, i) for i in range(ours.num_layers)]
    torch.testing.assert_close(inverse_frequencies(ours), hf.model.rotary_emb.inv_freq,
                               rtol=1e-6, atol=0)
    assert hf.model.rotary_emb.attention_scaling == 1.0  # we never scale cos/sin


@pytest.mark.parametrize("family", ["llama3.1", "llama-linear", "llama3"])
def test_both_rope_spellings_give_the_same_config(tmp_path, family):
    """The installed transformers writes one spelling; the other is written by hand."""
    saved = make_checkpoint(tmp_path, family, name="saved")
    other = make_checkpoint(tmp_path, family, name="other")
    with open(f"{saved}/config.json") as f:
        written = json.load(f)
    rewritten = rewrite_config(other, other_rope_spelling)
    assert ("rope_parameters" in written) != ("rope_parameters" in rewritten)
    a, b = load_model_config(saved), load_model_config(other)
    assert a == b
    if family != "llama3":
        assert a.rope_scaling is not None and a.rope_scaling.rope_type == \
            written.get("rope_parameters", written.get("rope_scaling"))["rope_type"]
    # HF reads the hand-written spelling to the same frequencies.
    torch.testing.assert_close(_hf_model(rewritten).model.rotary_emb.inv_freq,
                               inverse_frequencies(b), rtol=1e-6, atol=0)


def test_generation_config_eos_wins_over_config_json(tmp_path):
    """HF generate stops on generation_config.json's eos when that file sets one."""
    folder = make_checkpoint(tmp_path, "llama3", eos_token_id=7)
    assert load_model_config(folder).eos_token_ids == (7,)
    with open(f"{folder}/generation_config.json") as f:
        gen = json.load(f)
    gen["eos_token_id"] = [11, 12]
    with open(f"{folder}/generation_config.json", "w") as f:
        json.dump(gen, f)
    import transformers
    assert transformers.GenerationConfig.from_pretrained(folder).eos_token_id == [11, 12]
    assert load_model_config(folder).eos_token_ids == (11, 12)
