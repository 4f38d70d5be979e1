"""Our loader + forward + greedy AR against HF AutoModelForCausalLM, one case per configuration.

float32: greedy tokens equal HF `generate(do_sample=False)` token for token, and logits over a
prompt are close. bfloat16: logits are as close to HF's bf16 logits as HF's own bf16 rounding
is to float32 (no token-equality claim). Each case that exercises a feature also shows the
feature matters: switching it off in our config moves the logits away from HF's.
"""
import dataclasses
import os

import pytest
import torch

from specpilot.runtime.ar import generate_ar
from specpilot.runtime.checkpoint import load_checkpoint, load_state_dict
from specpilot.runtime.model import Transformer
from specpilot.runtime.steps import append_step

from hf_factory import hf_greedy, hf_logits, load_hf, make_checkpoint, random_prompts

NEW_TOKENS = 20
PROMPT_LENGTHS = (6, 13)  # both longer than the tiny sliding windows below

# id -> (family, HF config overrides, ModelConfig fields that switch the tested feature off)
CASES = {
    "llama2-no-gqa": ("llama2", {}, None),
    "llama3-gqa": ("llama3", {}, None),
    "llama3.1-rope-scaling": ("llama3.1", {}, {"rope_scaling": None}),
    "llama-linear-rope": ("llama-linear", {}, {"rope_scaling": None}),
    "llama-attention-and-mlp-bias": ("llama3", {"attention_bias": True, "mlp_bias": True},
                                     {"o_bias": False, "mlp_bias": False}),
    "llama-odd-heads": ("llama3", {"hidden_size": 60, "num_attention_heads": 6,
                                   "num_key_value_heads": 3}, None),
    "llama-tied": ("llama3", {"tie_word_embeddings": True}, None),
    "llama-sharded": ("llama3", {"max_shard_size": "20KB"}, None),
    "mistral-sliding-window": ("mistral", {}, {"sliding_window": None}),
    "qwen2-qkv-bias": ("qwen2", {}, {"attention_bias": False}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}, None),
    "qwen2-window-on-layer-1": ("qwen2", {"use_sliding_window": True, "sliding_window": 4,
                                         "max_window_layers": 1}, {"sliding_layers": None}),
    "qwen3-qk-norm-head-dim-12": ("qwen3", {}, {"qk_norm": False}),
    "qwen3-attention-bias": ("qwen3", {"attention_bias": True}, {"o_bias": False}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(folder, HF float32 model, our float32 model, ablation) for one configuration."""
    family, overrides, ablation = CASES[request.param]
    folder = make_checkpoint(tmp_path_factory.mktemp("ckpt"), family, seed=11, **overrides)
    return folder, load_hf(folder), Transformer.from_checkpoint(folder, "float32"), ablation


def _our_logits(model, prompt):
    cache = model.new_cache(1, len(prompt))
    lengths = torch.zeros(1, dtype=torch.int64)
    return append_step(model, cache, lengths, [prompt], logits_last_only=False)[0]


def test_greedy_tokens_equal_hf_generate(case):
    folder, hf, ours, _ = case
    prompts = random_prompts(PROMPT_LENGTHS, seed=5)
    result = generate_ar(ours, prompts, NEW_TOKENS)
    for prompt, tokens in zip(prompts, result.tokens):
        assert tokens == hf_greedy(hf, prompt, NEW_TOKENS)


def test_logits_close_to_hf_over_a_prompt(case):
    folder, hf, ours, ablation = case
    prompt = random_prompts((16,), seed=6)[0]
    reference = hf_logits(hf, prompt)
    torch.testing.assert_close(_our_logits(ours, prompt), reference, rtol=1e-4, atol=1e-4)
    if ablation:
        # The case exercises its feature: without it our logits are clearly not HF's.
        ckpt = load_checkpoint(folder)
        ablated = Transformer(dataclasses.replace(ckpt.config, **ablation), ckpt.tensors,
                              torch.float32)
        assert (_our_logits(ablated, prompt) - reference).abs().max() > 1e-2


def test_sharded_checkpoint_loads_the_same_tensors(tmp_path):
    single = make_checkpoint(tmp_path, "qwen3", name="single", seed=3)
    sharded = make_checkpoint(tmp_path, "qwen3", name="sharded", seed=3, max_shard_size="20KB")
    assert "model.safetensors.index.json" in os.listdir(sharded)
    assert sum(f.endswith(".safetensors") for f in os.listdir(sharded)) > 1
    a, b = load_state_dict(single), load_state_dict(sharded)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("family,overrides", [
    ("llama3.1", {}), ("mistral", {}), ("qwen3", {"attention_bias": True}),
    ("qwen2", {"tie_word_embeddings": True}),
])
def test_bfloat16_logits_close_to_hf_bfloat16(tmp_path, family, overrides):
    folder = make_checkpoint(tmp_path, family, seed=12, **overrides)
    prompt = random_prompts((16,), seed=7)[0]
    hf32 = hf_logits(load_hf(folder), prompt)
    hf16 = hf_logits(load_hf(folder, torch.bfloat16), prompt)
    ours16 = _our_logits(Transformer.from_checkpoint(folder, "bfloat16"), prompt)
    assert ours16.dtype == torch.float32 and torch.isfinite(ours16).all()
    hf_rounding = (hf16 - hf32).abs().max()
    assert (ours16 - hf16).abs().max() <= 2 * hf_rounding
    # and bf16 rounding is small against the spread of the logits (the comparison is meaningful)
    assert hf_rounding < 0.25 * hf32.std(dim=-1).min()
