"""Write and read the zoo's HF checkpoint folders.

A folder holds config.json, model.safetensors, generation_config.json, tokenizer.json and
tokenizer_config.json — what HF transformers' `AutoModelForCausalLM` / `AutoTokenizer` load, and
what our own runtime loader reads.
"""
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpilot.zoo.llama_train_model import TrainLlama
from specpilot.zoo.presets import ModelDims, ZooError
from specpilot.zoo.tokenizer import SPECIAL_TOKEN_ID, save_tokenizer

WEIGHTS_FILE = "model.safetensors"


def hf_config(dims: ModelDims, vocab_size: int) -> dict:
    """config.json of a float32 LlamaForCausalLM with these dimensions."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": dims.hidden,
        "intermediate_size": dims.intermediate,
        "num_hidden_layers": dims.layers,
        "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.kv_heads,
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": dims.max_position_embeddings,
        "rms_norm_eps": dims.rms_norm_eps,
        # transformers 4.x reads rope_theta; 5.x reads rope_parameters (and converts rope_theta).
        "rope_theta": dims.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": dims.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": SPECIAL_TOKEN_ID,
        "eos_token_id": SPECIAL_TOKEN_ID,
        "pad_token_id": SPECIAL_TOKEN_ID,
        "use_cache": True,
        "torch_dtype": "float32",
        "dtype": "float32",
    }


def generation_config() -> dict:
    return {"bos_token_id": SPECIAL_TOKEN_ID, "eos_token_id": SPECIAL_TOKEN_ID,
            "pad_token_id": SPECIAL_TOKEN_ID, "do_sample": False}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_checkpoint(model: TrainLlama, tokenizer, folder: Path) -> Path:
    """Write `model` (as float32 on CPU) and `tokenizer` into `folder` as an HF checkpoint."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dims = model.dims
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    os.chmod(folder / WEIGHTS_FILE, 0o644)  # safetensors writes it owner-only
    _write_json(folder / "config.json", hf_config(dims, model.vocab_size))
    _write_json(folder / "generation_config.json", generation_config())
    save_tokenizer(tokenizer, folder, dims.max_position_embeddings)
    return folder


def dims_from_config(cfg: dict) -> ModelDims:
    """The ModelDims a zoo config.json describes."""
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return ModelDims(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                     heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
                     intermediate=cfg["intermediate_size"], rope_theta=float(theta),
                     rms_norm_eps=cfg["rms_norm_eps"],
                     max_position_embeddings=cfg["max_position_embeddings"])


def load_train_model(folder: Path) -> TrainLlama:
    """Rebuild the training module from a checkpoint folder written by `save_checkpoint`."""
    folder = Path(folder)
    config_path, weights_path = folder / "config.json", folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise ZooError(f"{folder} is not a zoo checkpoint (needs config.json and {WEIGHTS_FILE})")
    cfg = json.loads(config_path.read_text())
    model = TrainLlama(dims_from_config(cfg), cfg["vocab_size"])
    model.load_state_dict(load_file(str(weights_path)), strict=True)
    return model.eval()
