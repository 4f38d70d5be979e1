"""Greedy autoregressive decoding: the stock decoder whose output every candidate must match."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import torch

from .steps import append_step, check_capacity, top2_margin


@dataclass
class ARResult:
    tokens: List[List[int]]                 # generated tokens per request (EOS included if hit)
    margins: List[List[float]] = field(default_factory=list)  # top1-top2 logit margin per token
    target_forwards: int = 0


@torch.no_grad()
def generate_ar(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                eos_ids: Sequence[int] = ()) -> ARResult:
    """Greedy decode every prompt (batched, padded); each request stops at its own EOS/length."""
    capacity = check_capacity(model, prompts, max_new_tokens, slack=1)
    b = len(prompts)
    cache = model.new_cache(b, capacity)
    lengths = torch.zeros(b, dtype=torch.int64, device=model.device)
    logits = append_step(model, cache, lengths, [list(p) for p in prompts])
    lengths += torch.tensor([len(p) for p in prompts], device=model.device)
    eos = set(eos_ids)
    out = [[] for _ in range(b)]
    margins = [[] for _ in range(b)]
    done = [False] * b
    forwards = 1
    while True:
        nxt = torch.argmax(logits, dim=-1).tolist()
        marg = top2_margin(logits).tolist()
        for row in range(b):
            if done[row]:
                continue
            out[row].append(nxt[row])
            margins[row].append(marg[row])
            if nxt[row] in eos or len(out[row]) >= max_new_tokens:
                done[row] = True
        if all(done):
            break
        logits = append_step(model, cache, lengths, [[t] for t in nxt])
        lengths += 1
        forwards += 1
    return ARResult(out, margins, forwards)
