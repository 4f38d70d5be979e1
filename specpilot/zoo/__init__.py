"""The model zoo: small real target/drafter pairs trained on local Python source.

`ensure_pair(preset, seed)` returns (target_dir, drafter_dir), two HF checkpoint folders sharing a
tokenizer, training them once and reusing the cached pair afterwards. Presets are data
(`PRESETS`); the modules, in pipeline order: corpus (and env_corpus, the larger corpus of the
GPU preset), tokenizer, llama_train_model, train (with stage_clock, the per-stage time limit),
evaluate, save_hf, speculation_eval (chain speculation of the saved pair on HumanEval prompts),
pair (one training run), cache (reuse and atomic placement).
"""

_EXPORTS = {
    "ensure_pair": "specpilot.zoo.cache",
    "place_pair": "specpilot.zoo.cache",
    "pair_key": "specpilot.zoo.cache",
    "train_pair": "specpilot.zoo.pair",
    "PRESETS": "specpilot.zoo.presets",
    "ZooPreset": "specpilot.zoo.presets",
    "ZooError": "specpilot.zoo.presets",
    "get_preset": "specpilot.zoo.presets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    # Loaded on first use so that importing the package does not import torch.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specpilot.zoo' has no attribute {name!r}")
