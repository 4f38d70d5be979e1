"""Zoo building blocks: presets, corpus selection, tokenizer, the training Llama vs HF's."""
import dataclasses
import os
import sysconfig

import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.zoo.corpus import load_corpus, stdlib_python_files
from specpilot.zoo.llama_train_model import TrainLlama
from specpilot.zoo.presets import PRESETS, ModelDims, ZooError, get_preset
from specpilot.zoo.save_hf import load_train_model, save_checkpoint
from specpilot.zoo.tokenizer import SPECIAL_TOKEN, SPECIAL_TOKEN_ID, encode_documents, train_tokenizer

SNIPPET = ('from typing import List\n\n\ndef has_close_elements(numbers: List[float], t: float) -> bool:\n'
           '    """Check if any two numbers are closer than t. Ünïcode: λ → ∑"""\n'
           '\tfor i, a in enumerate(numbers):\n        if abs(a - numbers[0]) < t:  # ok\n'
           '            return True\n    return False\n')


def test_unknown_preset_is_a_user_error_naming_the_known_ones():
    with pytest.raises(SpecPilotError, match="micro.*tiny"):
        get_preset("huge-nonexistent")


def test_preset_dims_are_validated():
    with pytest.raises(ZooError, match="multiple of heads"):
        ModelDims(hidden=100, layers=1, heads=3, kv_heads=1, intermediate=8)
    with pytest.raises(ZooError, match="micro_batch_size"):
        dataclasses.replace(PRESETS["micro"], batch_size=10, micro_batch_size=4)


def test_corpus_is_stdlib_source_without_tests_and_deterministic():
    files = stdlib_python_files()
    parts = {p for f in files for p in f.split("/")[:-1]}
    assert not parts & {"test", "tests", "idlelib", "site-packages"}
    assert "os.py" in files and "json/decoder.py" in files
    a, b = load_corpus(100_000, 2), load_corpus(100_000, 2)
    assert [f.relpath for f in a.train] == [f.relpath for f in b.train]
    assert not {f.relpath for f in a.train} & {f.relpath for f in a.heldout}
    assert len(a.heldout) == 2 and 100_000 <= a.train_bytes < 100_000 + 200_000
    root = sysconfig.get_paths()["stdlib"]
    first = a.train[0]
    with open(os.path.join(root, first.relpath), encoding="utf-8") as fh:
        assert fh.read() == first.text


@pytest.fixture(scope="module")
def small_tokenizer():
    corpus = load_corpus(150_000, 1)
    return train_tokenizer([f.text for f in corpus.train], 400)


def test_tokenizer_round_trips_through_hf_auto_tokenizer(small_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    model = TrainLlama(PRESETS["micro"].drafter, small_tokenizer.get_vocab_size())
    save_checkpoint(model, small_tokenizer, tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    ids = hf(SNIPPET)["input_ids"]
    assert ids[0] == SPECIAL_TOKEN_ID == hf.bos_token_id == hf.eos_token_id
    assert ids == small_tokenizer.encode(SNIPPET).ids
    assert len(ids) < len(SNIPPET.encode()) * 0.8  # merges were learned, not raw bytes
    assert hf.decode(ids, skip_special_tokens=True) == SNIPPET
    assert hf.decode(ids).startswith(SPECIAL_TOKEN)


def test_encode_documents_separates_each_document(small_tokenizer):
    docs = ["x = 1\n", "def f():\n    pass\n"]
    stream = encode_documents(small_tokenizer, docs)
    assert stream.count(SPECIAL_TOKEN_ID) == 2 and stream[0] == SPECIAL_TOKEN_ID
    second = stream.index(SPECIAL_TOKEN_ID, 1)
    assert small_tokenizer.decode(stream[1:second]) == docs[0]


@pytest.mark.parametrize("dims", [
    ModelDims(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, rope_theta=500.0),
    ModelDims(hidden=48, layers=1, heads=3, kv_heads=3, intermediate=80, rms_norm_eps=1e-6),
])
def test_training_module_matches_hf_llama(dims, small_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    vocab = small_tokenizer.get_vocab_size()
    model = TrainLlama(dims, vocab)
    model.init_weights(torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()))))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # away from 1, so a mis-applied norm weight shows
                p.uniform_(0.5, 1.5)
            else:  # large enough that attention is far from uniform (RoPE and masking matter)
                p.mul_(6.0)
    save_checkpoint(model, small_tokenizer, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.dtype == torch.float32 and type(hf).__name__ == "LlamaForCausalLM"
    ids = torch.randint(0, vocab, (2, 37))
    with torch.no_grad():
        ours, ref = model.eval()(ids), hf(ids).logits
        reloaded = load_train_model(tmp_path)(ids)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    assert torch.equal(reloaded, ours)
