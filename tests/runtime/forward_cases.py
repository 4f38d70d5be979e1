"""Forwards to compare two models' arithmetic on: caches of fresh random K/V, and tree
verification masks, each built directly from its definition."""
from typing import Sequence

import torch


def filled_cache(model, batch: int, capacity: int, seed: int):
    """A cache of `model` holding fresh random K/V, each slot's position its index."""
    cache = model.new_cache(batch, capacity)
    gen = torch.Generator().manual_seed(seed)
    for layer in range(len(cache.k)):
        cache.k[layer].copy_(torch.randn(cache.k[layer].shape, generator=gen))
        cache.v[layer].copy_(torch.randn(cache.v[layer].shape, generator=gen))
    cache.positions.copy_(torch.arange(capacity).expand(batch, capacity))
    return cache


def compare_forwards(ref, fast, tokens, positions, slots, mask, capacity=40, logits_at=None,
                     seed=0):
    """Run the same forward on both models over equal random caches: the logits, the K/V
    written and the cache positions agree (float32 tolerances). Returns `fast`'s logits."""
    caches = [filled_cache(m, tokens.shape[0], capacity, seed) for m in (ref, fast)]
    want = ref.forward(tokens, positions, slots, mask, caches[0], logits_at)
    got = fast.forward(tokens, positions, slots, mask, caches[1], logits_at)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert torch.equal(caches[0].positions, caches[1].positions)
    return got


def tree_mask(prefixes: Sequence[int], parents: Sequence[Sequence[int]], slots: int):
    """[B, T, slots] bool: request b sees its prefixes[b] committed slots, then each of its T
    new tokens (placed right after the prefix) sees itself and its ancestors by parents[b]
    (-1: the root's parent)."""
    width = len(parents[0])
    mask = torch.zeros(len(prefixes), width, slots, dtype=torch.bool)
    for b, (prefix, tree) in enumerate(zip(prefixes, parents)):
        for i in range(width):
            mask[b, i, :prefix] = True
            node = i
            while node >= 0:
                mask[b, i, prefix + node] = True
                node = tree[node]
    return mask
