"""HF transformers as benchmark baselines: greedy `generate` (`hf_ar`) and assisted generation
with the same drafter (`hf_assisted`, HF's stock speculative decoding, batch 1 only).

Both load the pair's checkpoints with `AutoModelForCausalLM` in the bench's dtype and device,
once, shared, and released after the last HF system ran. Target forwards are counted with a
forward hook. Their kernels differ from ours, so their output is compared to the reference by
exact match only.
"""
from __future__ import annotations

import os
from typing import List, Optional

import torch

from specpilot.ir.errors import SpecPilotError

from .correctness import exact_match
from .systems import RunOutput, System
from .workload import batches


class HFModels:
    """The pair as HF models, loaded on first use."""

    def __init__(self, pair_dir: str, dtype: torch.dtype, device: str, eos_ids):
        self.pair_dir, self.dtype, self.device = pair_dir, dtype, device
        self.eos_ids = list(eos_ids)
        self.target = self.drafter = None
        self.target_calls = 0

    def _load(self, role: str):
        try:
            import transformers
        except ImportError:
            raise SpecPilotError("the HF baselines need the 'transformers' package: "
                                 "pip install transformers") from None
        folder = os.path.join(self.pair_dir, role)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype)
        return model.to(self.device).eval()

    def load(self, with_drafter: bool) -> None:
        if self.target is None:
            self.target = self._load("target")
            self.target.register_forward_hook(self._count)
        if with_drafter and self.drafter is None:
            self.drafter = self._load("drafter")

    def _count(self, *_):
        self.target_calls += 1

    def release(self) -> None:
        self.target = self.drafter = None

    def generation_config(self, max_new_tokens: int):
        import transformers

        # A fresh config, not the checkpoint's: greedy, stop only at the pair's EOS.
        return transformers.GenerationConfig(
            do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_new_tokens=0,
            eos_token_id=self.eos_ids or None, pad_token_id=self.pad_id)

    @property
    def pad_id(self) -> int:
        return self.eos_ids[0] if self.eos_ids else 0

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens: int, assistant: bool) -> List[List[int]]:
        """Greedy new tokens per prompt, left-padded into one batch, cut after the first EOS."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.int64)
        attention = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.int64)
            attention[row, width - len(p):] = 1
        extra = {"assistant_model": self.drafter} if assistant else {}
        out = self.target.generate(ids.to(self.device), attention_mask=attention.to(self.device),
                                   generation_config=self.generation_config(max_new_tokens),
                                   **extra)
        return [_cut(row, set(self.eos_ids), max_new_tokens) for row in out[:, width:].tolist()]


def _cut(row: List[int], eos: set, max_new_tokens: int) -> List[int]:
    for i, tok in enumerate(row[:max_new_tokens]):
        if tok in eos:
            return row[:i + 1]
    return row[:max_new_tokens]


class HFSystem(System):
    family = "hf"

    def __init__(self, models: HFModels):
        super().__init__()
        self.models = models

    assistant = False     # assisted generation with the pair's drafter

    def setup(self, batch_size, prompts, max_new_tokens):
        self.models.load(with_drafter=self.assistant)

    def run(self, prompts, batch_size, max_new_tokens):
        self.models.target_calls = 0
        tokens = []
        for chunk in batches(prompts, batch_size):
            tokens += self.models.generate(chunk, max_new_tokens, assistant=self.assistant)
        return RunOutput(tokens, self.models.target_calls)

    def check(self, prompts, batch_size, reference, output):
        return {"exact_match": exact_match(output.tokens, reference.tokens)}


class HFGreedy(HFSystem):
    name = "hf_ar"
    description = "HF transformers greedy generate (left-padded batches)"


class HFAssisted(HFSystem):
    name = "hf_assisted"
    description = "HF transformers assisted generation with the same drafter (assistant_model=)"
    assistant = True

    def unavailable(self, batch_size) -> Optional[str]:
        if batch_size != 1:
            return "HF assisted generation supports batch size 1 only"
        return None
