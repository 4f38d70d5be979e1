"""The target's half of a speculative step: one forward over root + tree, and KV compaction."""
from __future__ import annotations

from typing import Sequence

import torch

from .tree_plan import TreePlan, tree_mask


@torch.no_grad()
def verify_tree(target, cache, root_slots: torch.Tensor, root_tokens: torch.Tensor,
                node_tokens: torch.Tensor, plan: TreePlan) -> torch.Tensor:
    """Target logits [B, N+1, V] at the root (row 0) and every tree node (row i+1).

    The target's cache must hold the committed sequence before the root; the root is written at
    `root_slots[b]` (its position), node i at root+1+i with position root+depth(i)."""
    device = root_slots.device
    tokens = torch.cat([root_tokens[:, None], node_tokens], dim=1)
    offsets = torch.arange(plan.num_nodes + 1, device=device)[None, :]
    slots = root_slots[:, None] + offsets
    positions = root_slots[:, None] + plan.depth_offsets.to(device)[None, :]
    mask = tree_mask(root_slots, plan.ancestors, cache.capacity)
    return target.forward(tokens, positions, slots, mask, cache)


def compact_path(cache, row: int, root_slot: int, nodes: Sequence[int]) -> bool:
    """Move the K/V of accepted `nodes` (root-first path) to slots root+1, root+2, ...

    Returns whether anything moved: a path of nodes 0, 1, 2, ... already sits there (every
    chain's does) and is left alone."""
    if not nodes or list(nodes) == list(range(len(nodes))):
        return False
    src = torch.tensor([root_slot + 1 + n for n in nodes], device=cache.positions.device)
    dst = root_slot + 1 + torch.arange(len(nodes), device=cache.positions.device)
    cache.copy_slots(row, src, dst)
    return True
