"""Two-level verification: a cheaper path through the target prunes each drafted tree, then the
full target verifies what survives.

The cheap verifier is the target itself, cut down as `verify.prune` declares (ir/prune.py):
only some of its layers (`layer_skip`, the same weights) or its weights cast to a lower precision
(`low_precision`). It keeps its own KV cache, catching up on committed tokens like the drafter.
In one forward over [the tokens its cache lacks, root last] + the tree it scores every node; a
node survives when its token is among the cheap verifier's top-k after its parent and the parent
survived. Pruning only removes candidates: the full target still decides every committed token,
so the output is the target's own greedy output whatever the cheap verifier says.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import List, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.prune import LayerSkipPrune, LowPrecisionPrune

from .batch_layout import feed, run_feeds
from .model import DTYPES
from .row_tree import RowTree
from .tree_drafting import Active


def layer_skip_model(target, keep_layers: Sequence[int]):
    """The target running only `keep_layers` (weights shared, not copied)."""
    n = target.config.num_layers
    keep = list(keep_layers)
    if not keep or keep != sorted(set(keep)) or keep[0] < 0 or keep[-1] >= n:
        raise SpecPilotError(f"keep_layers {keep} must be increasing layer indices of the "
                             f"target's {n} layers")
    cfg = target.config
    sliding = cfg.sliding_layers
    if sliding is not None:
        sliding = tuple(j for j, i in enumerate(keep) if i in sliding)
    cheap = copy.copy(target)
    cheap.layers = [target.layers[i] for i in keep]
    cheap.config = replace(cfg, num_layers=len(keep), sliding_layers=sliding)
    return cheap


def _cast(value, dtype: torch.dtype, backend_name: str):
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype, backend_name) for v in value)
    raise SpecPilotError(f"low-precision pruning casts dense weights; the {backend_name} backend "
                         f"prepares them as {type(value).__name__}: use kernels.backend 'torch'")


def low_precision_model(target, dtype: str):
    """The target with its weights (and so its activations and KV cache) in `dtype`."""
    if dtype not in DTYPES:
        raise SpecPilotError(f"unknown dtype {dtype!r} (known: {', '.join(sorted(DTYPES))})")
    torch_dtype = DTYPES[dtype]
    name = getattr(target.backend, "name", type(target.backend).__name__)
    cheap = copy.copy(target)
    cheap.dtype = torch_dtype
    cheap.embed = _cast(target.embed, torch_dtype, name)
    cheap.final_norm = _cast(target.final_norm, torch_dtype, name)
    cheap.lm_head = _cast(target.lm_head, torch_dtype, name)
    cheap.layers = [replace(layer,
                            input_norm=_cast(layer.input_norm, torch_dtype, name),
                            post_norm=_cast(layer.post_norm, torch_dtype, name),
                            linears={k: _cast(v, torch_dtype, name)
                                     for k, v in layer.linears.items()},
                            q_norm=_cast(layer.q_norm, torch_dtype, name),
                            k_norm=_cast(layer.k_norm, torch_dtype, name))
                    for layer in target.layers]
    return cheap


def cheap_verifier(target, prune):
    """The model `prune` (a LayerSkipPrune or LowPrecisionPrune) describes."""
    if isinstance(prune, LayerSkipPrune):
        return layer_skip_model(target, prune.keep_layers)
    if isinstance(prune, LowPrecisionPrune):
        return low_precision_model(target, prune.dtype)
    raise SpecPilotError(f"unknown prune spec {prune!r}")


def surviving_nodes(tree: RowTree, cheap_logits: torch.Tensor, top_k: int) -> List[int]:
    """Nodes whose token is in the cheap top-`top_k` after their parent, parent surviving too.
    cheap_logits [1 + N, V]: row 0 at the root, row i+1 at node i."""
    top = torch.topk(cheap_logits, min(top_k, cheap_logits.shape[-1]), dim=-1).indices.tolist()
    alive = []
    kept = set()
    for i in range(tree.num_nodes):
        p = tree.parents[i]
        if (p == -1 or p in kept) and tree.tokens[i] in top[p + 1]:
            kept.add(i)
            alive.append(i)
    return alive


class TreePruner:
    """The cheap verifier of a Program's `verify.prune`, with its cache of `capacity` slots."""

    def __init__(self, model, top_k: int, batch: int, capacity: int):
        self.model = model
        self.top_k = top_k
        self.cache = model.new_cache(batch, capacity)

    def prune(self, active: Active, requests, trees: Sequence[RowTree],
              layout: str) -> Tuple[List[RowTree], int]:
        """Each request's surviving subtree; returns (trees, cheap forwards run). Advances each
        request's `cheap_len` to its committed length."""
        feeds = [feed(row, committed[r.cheap_len:], r.cheap_len, tree)
                 for (row, committed), r, tree in zip(active, requests, trees)]
        logits = run_feeds(self.model, self.cache, feeds, layout)
        out = []
        for i, ((row, committed), r, tree) in enumerate(zip(active, requests, trees)):
            r.cheap_len = len(committed)
            out.append(tree.subtree(surviving_nodes(tree, logits[i], self.top_k)))
        return out, 1
