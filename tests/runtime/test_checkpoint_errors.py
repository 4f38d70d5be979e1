"""Bad checkpoints fail at load time with a typed error that names the file and the fix."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.checkpoint import (check_same_vocabulary, load_checkpoint,
                                          load_tokenizer)
from specpilot.runtime.config import load_model_config
from specpilot.runtime.errors import CheckpointError, TokenizerMismatch, UnsupportedModel
from specpilot.runtime.model import Transformer

from hf_factory import make_checkpoint, make_pair, make_tokenizer, rewrite_config


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    return {"single": make_checkpoint(root, "qwen3", name="single", seed=31),
            "sharded": make_checkpoint(root, "llama3", name="sharded", seed=32,
                                       max_shard_size="20KB")}


@pytest.fixture
def copy_of(pristine, tmp_path):
    def copy(kind="single"):
        dst = str(tmp_path / kind)
        shutil.copytree(pristine[kind], dst)
        return dst
    return copy


def _load_fails(folder, error, *phrases):
    with pytest.raises(error) as info:
        Transformer.from_checkpoint(folder)
    assert isinstance(info.value, SpecPilotError)
    for phrase in phrases:
        assert phrase in str(info.value)
    return str(info.value)


def test_the_pristine_checkpoints_load(pristine):
    for folder in pristine.values():
        assert Transformer.from_checkpoint(folder).config.num_layers == 2


def test_missing_folder(tmp_path):
    _load_fails(str(tmp_path / "nowhere"), CheckpointError, "does not exist",
                "pass the folder holding config.json")


def test_missing_config_json(copy_of):
    folder = copy_of()
    os.remove(os.path.join(folder, "config.json"))
    _load_fails(folder, CheckpointError, "has no config.json", "save_pretrained")


def test_corrupt_config_json(copy_of):
    folder = copy_of()
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write('{"model_type": "qwen3", "hidden_size": 48,')
    _load_fails(folder, CheckpointError, "config.json is not valid JSON", "repair the file")


def test_unsupported_model_type(copy_of):
    folder = copy_of()
    rewrite_config(folder, lambda c: dict(c, model_type="gpt2"))
    _load_fails(folder, UnsupportedModel, "model_type 'gpt2' is not supported",
                "supported: llama, mistral, qwen2, qwen3")


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])
def test_unsupported_rope_type(copy_of, spelling):
    folder = copy_of()
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
            "rope_theta": 10000.0}

    def edit(cfg):
        cfg.pop("rope_parameters", None)
        cfg[spelling] = yarn
        return cfg
    rewrite_config(folder, edit)
    _load_fails(folder, UnsupportedModel, "RoPE type 'yarn' is not supported",
                "supported: default, llama3, linear")


def test_llama3_rope_without_its_factors(copy_of):
    folder = copy_of()

    def edit(cfg):
        cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                  "low_freq_factor": 1.0}
        return cfg
    rewrite_config(folder, edit)
    _load_fails(folder, CheckpointError, "needs a numeric 'high_freq_factor'")


def test_unsupported_activation(copy_of):
    folder = copy_of()
    rewrite_config(folder, lambda c: dict(c, hidden_act="gelu"))
    _load_fails(folder, UnsupportedModel, "hidden_act 'gelu' is not supported")


def test_missing_safetensors(copy_of):
    folder = copy_of()
    os.remove(os.path.join(folder, "model.safetensors"))
    _load_fails(folder, CheckpointError, "has no *.safetensors weights")


def test_truncated_safetensors(copy_of):
    folder = copy_of()
    path = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    _load_fails(folder, CheckpointError, "model.safetensors is not a readable safetensors file",
                "truncated or corrupt")


def test_tensor_with_the_wrong_shape(copy_of):
    folder = copy_of()
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = torch.randn(tensors[name].shape[0] - 12, tensors[name].shape[1])
    save_file(tensors, path, metadata={"format": "pt"})
    _load_fails(folder, CheckpointError, f"tensor {name!r} has shape (24, 48)",
                "config.json implies (36, 48)")


def test_missing_tensor(copy_of):
    folder = copy_of()
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.0.self_attn.q_norm.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    _load_fails(folder, CheckpointError, "'model.layers.0.self_attn.q_norm.weight' is missing")


def test_untied_checkpoint_without_an_output_head(copy_of):
    folder = copy_of()
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    del tensors["lm_head.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    _load_fails(folder, CheckpointError, "'lm_head.weight' is missing",
                "tie_word_embeddings")


def test_index_naming_a_missing_shard(copy_of):
    folder = copy_of("sharded")
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        shard = sorted(set(json.load(f)["weight_map"].values()))[1]
    os.remove(os.path.join(folder, shard))
    _load_fails(folder, CheckpointError, shard, "named by model.safetensors.index.json is missing")


def test_malformed_shard_index(copy_of):
    folder = copy_of("sharded")
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": ["model-00001-of-00007.safetensors"]}, f)
    _load_fails(folder, CheckpointError, "index.json is malformed", "'weight_map'")


# --- target / drafter vocabulary -----------------------------------------------------------

def test_a_pair_from_the_factory_shares_its_vocabulary(tmp_path):
    target, drafter = make_pair(tmp_path, "qwen3")
    t, d = load_checkpoint(target).config, load_checkpoint(drafter).config
    assert t.hidden_size != d.hidden_size and t.vocab_size == d.vocab_size
    check_same_vocabulary(t, d, load_tokenizer(target), load_tokenizer(drafter), target, drafter)


def test_vocabulary_sizes_differ(tmp_path):
    target = make_checkpoint(tmp_path, "llama3", name="t", tokenizer=False)
    drafter = make_checkpoint(tmp_path, "llama3", name="d", tokenizer=False, vocab_size=90)
    with pytest.raises(TokenizerMismatch, match="vocab_size 97 but drafter .* has 90: the "
                                                "drafter must share the target's tokenizer"):
        check_same_vocabulary(load_model_config(target), load_model_config(drafter),
                              target_dir=target, drafter_dir=drafter)


def test_tokenizers_with_different_vocabularies(tmp_path):
    target = make_checkpoint(tmp_path, "llama3", name="t")
    drafter = make_checkpoint(tmp_path, "llama3", name="d", tokenizer=make_tokenizer(shuffle_seed=3))
    t_tok, d_tok = load_tokenizer(target), load_tokenizer(drafter)
    assert t_tok.get_vocab_size() == d_tok.get_vocab_size()  # same size, different ids
    assert t_tok.get_vocab() != d_tok.get_vocab()
    with pytest.raises(TokenizerMismatch, match="tokenizers of target .* differ"):
        check_same_vocabulary(load_model_config(target), load_model_config(drafter),
                              t_tok, d_tok, target, drafter)


def test_corrupt_tokenizer_json(copy_of):
    folder = copy_of()
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json is not a readable tokenizer"):
        load_tokenizer(folder)


def test_unknown_dtype_name(pristine):
    with pytest.raises(SpecPilotError, match="dtype 'fp32' is not supported: choose one of "
                                             "bfloat16, float16, float32"):
        Transformer.from_checkpoint(pristine["single"], "fp32")
