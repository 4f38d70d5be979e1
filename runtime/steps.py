"""Shared building blocks of every decode loop: capacity checks, padded prefill, and the
padded "append tokens" step that AR decode and the drafter's catch-up both use."""
from __future__ import annotations

from typing import List, Sequence

import torch

from .errors import CapacityError


def check_capacity(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, slack: int) -> int:
    """Cache capacity for these prompts; a CapacityError naming the fix if the model can't hold them."""
    if not prompts:
        raise CapacityError("no prompts given")
    if any(len(p) == 0 for p in prompts):
        raise CapacityError("a prompt is empty: every prompt needs at least one token")
    if max_new_tokens < 1:
        raise CapacityError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    longest = max(len(p) for p in prompts)
    limit = model.config.max_position_embeddings
    if longest + max_new_tokens > limit:
        raise CapacityError(
            f"a prompt of {longest} tokens plus {max_new_tokens} new tokens exceeds the model's "
            f"context of {limit} positions: shorten the prompt or lower max_new_tokens")
    return longest + max_new_tokens + slack


def append_step(model, cache, lengths: torch.Tensor, new_tokens: List[List[int]],
                logits_last_only: bool = True) -> torch.Tensor:
    """Append each row's `new_tokens[b]` (any count ≥ 1) after its `lengths[b]` committed tokens.

    Rows are padded to a common width; pad tokens are written past the row's length, where
    nothing reads them before they are overwritten. Returns float32 logits: at each row's last
    new token ([B, V]) or, with logits_last_only=False, at every new token ([B, T, V]).
    `lengths` is not modified.
    """
    b = len(new_tokens)
    width = max(len(t) for t in new_tokens)
    device = lengths.device
    tokens = torch.zeros((b, width), dtype=torch.int64, device=device)
    for row, toks in enumerate(new_tokens):
        tokens[row, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
    offs = torch.arange(width, device=device)[None, :]
    slots = lengths[:, None] + offs
    s = torch.arange(cache.capacity, device=device)[None, None, :]
    mask = s <= slots[:, :, None]
    if logits_last_only:
        last = torch.tensor([len(t) - 1 for t in new_tokens], device=device)[:, None]
        return model.forward(tokens, slots, slots, mask, cache, logits_at=last)[:, 0]
    return model.forward(tokens, slots, slots, mask, cache)


@torch.no_grad()
def teacher_forced_logits(model, tokens: Sequence[int]) -> torch.Tensor:
    """[T, V] float32: `model`'s logits at each of `tokens`, one pass over them from an empty
    cache of their own (what the ranks and the prompt features are read from)."""
    cache = model.new_cache(1, len(tokens) + 1)
    start = torch.zeros(1, dtype=torch.int64, device=model.device)
    return append_step(model, cache, start, [list(tokens)], logits_last_only=False)[0]


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """top-1 minus top-2 logit along the last dim (the near-tie measure of token forcing)."""
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def greedy_tokens(model, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                  mask: torch.Tensor, cache, logits_at=None) -> torch.Tensor:
    """The argmax over the vocabulary of `model.forward`'s logits, [B, T] (or [B, R]) int64:
    by the model's own `greedy` where its class has one (a fused forward finds it in its LM
    head's kernel, runtime/fused_forward.py), else torch.argmax of the logits."""
    if hasattr(type(model), "greedy"):
        return model.greedy(tokens, positions, slots, mask, cache, logits_at)
    return torch.argmax(model.forward(tokens, positions, slots, mask, cache, logits_at), dim=-1)
