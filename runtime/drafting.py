"""The drafter's half of a speculative step: expand the static tree level by level."""
from __future__ import annotations

from typing import Tuple

import torch

from .tree_plan import TreePlan, tree_mask


@torch.no_grad()
def draft_tree(drafter, cache, root_slots: torch.Tensor, root_logits: torch.Tensor,
               plan: TreePlan) -> Tuple[torch.Tensor, int]:
    """Fill every node of `plan` with a drafter token; returns (node_tokens [B, N], forwards).

    The drafter's cache must already hold the committed sequence through the root (slot
    `root_slots[b]`), and `root_logits` [B, V] are its logits there. Node i's token is the
    ranks[i]-th most probable drafter token after its parent; finding the children of depth d
    takes one forward over all nodes of depth d-1, written at slot root+1+i under the tree mask.
    The deepest level is never run through the drafter: its children are not needed.
    """
    b = root_slots.shape[0]
    device = root_slots.device
    ranks = torch.tensor(plan.shape.ranks, dtype=torch.int64, device=device)
    parent_pos = torch.tensor(plan.parent_pos, dtype=torch.int64, device=device)
    node_tokens = torch.zeros((b, plan.num_nodes), dtype=torch.int64, device=device)
    mask = tree_mask(root_slots, plan.ancestors, cache.capacity)
    logits = root_logits[:, None, :]                       # [B, nodes of the previous level, V]
    forwards = 0
    for depth, level in enumerate(plan.levels, start=1):
        idx = torch.tensor(level, dtype=torch.int64, device=device)
        top = torch.topk(logits, plan.branching(depth - 1), dim=-1).indices
        node_tokens[:, idx] = top[:, parent_pos[idx], ranks[idx]]
        if depth == len(plan.levels):
            break
        slots = root_slots[:, None] + 1 + idx[None, :]
        positions = (root_slots[:, None] + depth).expand_as(slots)
        logits = drafter.forward(node_tokens[:, idx], positions, slots, mask[:, idx + 1], cache)
        forwards += 1
    return node_tokens, forwards
