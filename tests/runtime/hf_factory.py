"""Tiny random HF checkpoints for tests, built with transformers itself (the reference).

    make_checkpoint(tmp_path, "qwen3")                 -> folder with config.json, safetensors,
                                                          generation_config.json, tokenizer.json
    make_checkpoint(tmp_path, "llama3", tie_word_embeddings=True, max_shard_size="20KB")
    make_pair(tmp_path, "llama3")                      -> (target_dir, drafter_dir), same vocabulary
    load_hf(folder) / hf_greedy(model, prompt, n)      -> the HF reference to compare against

Weights are drawn fresh from a seeded generator with a scale that gives decisive greedy choices
(HF's default init of N(0, 0.02), unit norms and zero biases would hide a missing bias or norm
and make every logit a near tie).
"""
from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch

VOCAB_SIZE = 97  # not a power of two, shared by every family so pairs can mix sizes
# Overrides that give head_dim 32: the fused layer kernels' tensor-core path
# (runtime/fused_forward.py takes head_dim 16 to 256; the tiny presets have 8).
FUSABLE = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96)

_TINY = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
             rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             tie_word_embeddings=False)

# family name -> HF config kwargs (model_type included). Each preset isolates one feature.
FAMILIES: Dict[str, dict] = {
    # Llama 2: no GQA, default RoPE.
    "llama2": dict(_TINY, model_type="llama", num_key_value_heads=4,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # Llama 3: GQA, large theta.
    "llama3": dict(_TINY, model_type="llama",
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    # Llama 3.1: llama3 scaling. With head_dim 8 the wavelengths are 6.3, 167, 4.4e3, 1.2e5, so
    # original_max_position_embeddings=256 puts one in each branch (kept, blended, divided).
    "llama3.1": dict(_TINY, model_type="llama", max_position_embeddings=1024,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 256}),
    "llama-linear": dict(_TINY, model_type="llama",
                         rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                          "factor": 4.0}),
    # Mistral: a window much shorter than the test sequences, so it changes the output.
    "mistral": dict(_TINY, model_type="mistral", sliding_window=5,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # Qwen2: QKV bias.
    "qwen2": dict(_TINY, model_type="qwen2",
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # Qwen3: q/k norm; 6 heads x head_dim 12 over hidden 48 (head_dim != hidden / heads), 3 kv heads.
    "qwen3": dict(_TINY, model_type="qwen3", hidden_size=48, num_attention_heads=6,
                  num_key_value_heads=3, head_dim=12,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}


def hf_config(family: str, **overrides):
    """The transformers config object of a preset family, with `overrides` applied."""
    import transformers

    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    kwargs = dict(FAMILIES[family])
    kwargs.update(overrides)
    model_type = kwargs.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **kwargs)


def randomize_(model, seed: int) -> None:
    """Overwrite every parameter with fresh seeded values at a scale with decisive logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = param.shape
            if name.endswith("norm.weight"):
                value = 0.5 + torch.rand(shape, generator=gen)
            elif name.endswith(".bias"):
                value = 0.5 * torch.randn(shape, generator=gen)
            elif name.endswith("embed_tokens.weight"):
                value = torch.randn(shape, generator=gen)
            else:  # a linear weight [out, in]
                value = 1.5 * torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
            param.copy_(value.to(param.dtype))


def make_tokenizer(vocab_size: int = VOCAB_SIZE, shuffle_seed: Optional[int] = None):
    """A word-level `tokenizers.Tokenizer` over words w0..w{n-1}; ids follow the word number,
    or a seeded shuffle of it (same size, different vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    ids = list(range(vocab_size))
    if shuffle_seed is not None:
        ids = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(shuffle_seed)).tolist()
    vocab = {f"w{i}": ids[i] for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def make_checkpoint(tmp_path, family: str = "llama3", *, name: Optional[str] = None, seed: int = 0,
                    max_shard_size: Optional[str] = None, save_dtype: torch.dtype = torch.float32,
                    tokenizer=True, **overrides) -> str:
    """Write a tiny random HF checkpoint of `family` (a FAMILIES key) under `tmp_path`.

    `overrides` are HF config fields. `max_shard_size` (e.g. "20KB") writes sharded
    safetensors with an index. `tokenizer` is True (the default word-level tokenizer), False
    (none) or a `tokenizers.Tokenizer` to save. Returns the folder path.
    """
    import transformers

    cfg = hf_config(family, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize_(model, seed)
    model = model.to(save_dtype)
    folder = os.path.join(str(tmp_path), name or f"{family}-{seed}")
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    if tokenizer is True:
        tokenizer = make_tokenizer(cfg.vocab_size)
    if tokenizer:
        tokenizer.save(os.path.join(folder, "tokenizer.json"))
    return folder


def make_pair(tmp_path, family: str = "llama3", *, seed: int = 0) -> Tuple[str, str]:
    """A (target, drafter) pair of one family: same vocabulary and tokenizer, different sizes
    (target hidden 64 with 2 layers, drafter hidden 32 with 1 layer), independent weights."""
    big = {"hidden_size": 64, "intermediate_size": 128}
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    if family == "qwen3":  # explicit head_dim; keep it and change the head count instead
        big.update(num_attention_heads=6, num_key_value_heads=3)
        small.update(num_attention_heads=4, num_key_value_heads=2)
    target = make_checkpoint(tmp_path, family, name=f"{family}-target-{seed}", seed=seed, **big)
    drafter = make_checkpoint(tmp_path, family, name=f"{family}-drafter-{seed}", seed=seed + 1,
                              **small)
    return target, drafter


def other_rope_spelling(config: dict) -> dict:
    """The same config.json with its RoPE settings written in the other transformers spelling:
    5.x `rope_parameters` <-> 4.x top-level `rope_theta` + `rope_scaling` (null if unscaled)."""
    out = dict(config)
    params = out.pop("rope_parameters", None)
    if params is not None:
        params = dict(params)
        out["rope_theta"] = params.pop("rope_theta")
        out["rope_scaling"] = None if params.get("rope_type") == "default" else params
        return out
    scaling = dict(out.pop("rope_scaling", None) or {"rope_type": "default"})
    scaling["rope_theta"] = out.pop("rope_theta", 10000.0)
    out["rope_parameters"] = scaling
    return out


def rewrite_config(folder: str, edit) -> dict:
    """Apply `edit(dict) -> dict` to `folder/config.json` in place; returns the new dict."""
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = edit(json.load(f))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return cfg


def load_hf(folder: str, dtype: torch.dtype = torch.float32):
    """The HF reference model for a checkpoint folder, in eval mode."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.eval()


@torch.no_grad()
def hf_greedy(model, prompt: Sequence[int], max_new_tokens: int,
              eos_ids: Sequence[int] = ()) -> List[int]:
    """HF `generate(do_sample=False)` on one prompt; the new tokens (EOS included if hit).

    With `eos_ids` empty, HF stops on the checkpoint's own generation-config EOS (if any)."""
    ids = torch.tensor([list(prompt)], dtype=torch.int64)
    extra = {"eos_token_id": list(eos_ids)} if eos_ids else {}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, min_new_tokens=0, pad_token_id=0,
                         num_beams=1, top_k=None, top_p=None, temperature=None, **extra)
    return out[0, ids.shape[1]:].tolist()


@torch.no_grad()
def hf_logits(model, prompt: Sequence[int]) -> torch.Tensor:
    """HF logits [T, V] (float32) at every position of one prompt, without a cache."""
    ids = torch.tensor([list(prompt)], dtype=torch.int64)
    return model(ids, use_cache=False).logits[0].float()


def random_prompts(lengths: Sequence[int], seed: int, vocab_size: int = VOCAB_SIZE) -> List[List[int]]:
    """Fresh seeded prompts of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def noisy_checkpoint(folder: str, name: str, noise: float, seed: int) -> str:
    """A copy of checkpoint `folder` (as a sibling folder `name`) with Gaussian noise of `noise`
    times each matrix's std on every matrix: a drafter that agrees with the target often, not
    always. Returns the new folder."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = os.path.join(os.path.dirname(folder), name)
    shutil.copytree(folder, out)
    path = os.path.join(out, "model.safetensors")
    save_file(with_noise(load_file(path), noise, seed), path, metadata={"format": "pt"})
    return out


def with_noise(tensors, noise: float, seed: int):
    """`tensors` (name → tensor) with Gaussian noise of `noise` times each matrix's std added to
    every matrix, drawn in the mapping's order from a generator seeded with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return {k: t + noise * t.std() * torch.randn(t.shape, generator=gen) if t.dim() == 2 else t
            for k, t in tensors.items()}


def kernel_device() -> str:
    """Where generated Triton kernels run in this test run, and so where their tensors go: the
    CPU under Triton's interpreter (tests/conftest.py sets it where there is no CUDA), else the
    GPU."""
    from specpilot.codegen.cache import triton_interpreting
    return "cpu" if triton_interpreting() else "cuda"


def fusable_pair(folder: str, seed: int, noise_seed: int):
    """(target, drafter) of FUSABLE shape in float32 on `kernel_device()`: a random llama3
    checkpoint made in `folder` and a copy with 10 % noise on every matrix, which agrees with
    it often, so chains accept drafts (what the bench scripts' end-to-end tests decode with)."""
    from specpilot.runtime.checkpoint import load_checkpoint
    from specpilot.runtime.model import Transformer

    ckpt = load_checkpoint(make_checkpoint(folder, "llama3", seed=seed, **FUSABLE))
    device = kernel_device()
    return (Transformer(ckpt.config, ckpt.tensors, torch.float32, device),
            Transformer(ckpt.config, with_noise(ckpt.tensors, 0.1, noise_seed), torch.float32,
                        device))
