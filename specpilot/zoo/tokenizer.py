"""Byte-level BPE tokenizer for the zoo pair, trained with the `tokenizers` library.

One special token, `<|endoftext|>`, is both BOS and EOS: it separates documents in training and
the tokenizer prepends it to every encoded text (as Llama tokenizers prepend their BOS), so a
prompt looks like the start of a training document. Byte-level means every string encodes, and
decoding (skipping the special token) gives back exactly the text that was encoded.
"""
import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKEN = "<|endoftext|>"
SPECIAL_TOKEN_ID = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def train_tokenizer(texts, vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer of `vocab_size` entries (special token id 0) trained on `texts`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[SPECIAL_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    assert tok.token_to_id(SPECIAL_TOKEN) == SPECIAL_TOKEN_ID
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL_TOKEN} $A",
        pair=f"{SPECIAL_TOKEN} $A {SPECIAL_TOKEN} $B",
        special_tokens=[(SPECIAL_TOKEN, SPECIAL_TOKEN_ID)],
    )
    return tok


def encode_documents(tok: Tokenizer, texts) -> list:
    """One flat token stream: each document is preceded by the special token, as at inference."""
    stream = []
    for enc in tok.encode_batch(list(texts), add_special_tokens=False):
        stream.append(SPECIAL_TOKEN_ID)
        stream.extend(enc.ids)
    return stream


def encode_stream(tok: Tokenizer, texts, docs_per_batch: int = 1024) -> torch.Tensor:
    """`encode_documents` as an int64 tensor, for corpora of hundreds of MB.

    Documents are encoded `docs_per_batch` at a time with `encode_batch` (parallel in the
    tokenizers library) and copied into numpy right away, so neither the library's per-token
    records nor a Python list of every token id is ever held for the whole corpus.
    """
    texts = list(texts)
    parts = []
    for start in range(0, len(texts), docs_per_batch):
        for enc in tok.encode_batch(texts[start:start + docs_per_batch], add_special_tokens=False):
            parts.append(np.array([SPECIAL_TOKEN_ID], dtype=np.int64))
            parts.append(np.asarray(enc.ids, dtype=np.int64))
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))


def leading_texts(texts, max_bytes):
    """The first texts of `texts` holding at least `max_bytes` UTF-8 bytes in all (all if None)."""
    if max_bytes is None:
        return list(texts)
    out, used = [], 0
    for text in texts:
        if used >= max_bytes:
            break
        out.append(text)
        used += len(text.encode("utf-8"))
    return out


def tokenizer_config(model_max_length: int) -> dict:
    """The tokenizer_config.json HF `AutoTokenizer` needs to load tokenizer.json as a fast tokenizer."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKEN,
        "eos_token": SPECIAL_TOKEN,
        "pad_token": SPECIAL_TOKEN,
        "unk_token": None,
        "model_max_length": model_max_length,
        # Source code is whitespace-sensitive: never "clean up" spaces around punctuation.
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(SPECIAL_TOKEN_ID): {"content": SPECIAL_TOKEN, "lstrip": False, "normalized": False,
                                    "rstrip": False, "single_word": False, "special": True},
        },
    }


def save_tokenizer(tok: Tokenizer, folder: Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json into `folder`."""
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(model_max_length), indent=2, sort_keys=True) + "\n")
