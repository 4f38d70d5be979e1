"""Two-level verification with every round on the device (one CUDA graph per round).

The eager mechanism (runtime/two_level.py) lets a cheaper path through the target prune each
drafted tree, then has the full target verify what survives. With static shapes the survivors
must be of a fixed size, so this runtime takes the `layer_skip` cheap verifier with top-1
pruning: a node survives when its token is the cheap verifier's argmax after its parent and the
parent survived, which leaves at most one path, root to some depth. A round:

  1. the drafter drafts the static tree (runtime/graphed_tree.py);
  2. the cheap verifier (the target's `keep_layers`, its own KV cache) scores the root and every
     tree node in one forward under the tree mask; its greedy walk down the tree is the
     surviving path;
  3. the full target verifies root + that path as a chain of the tree's depth D (the path's
     tokens, padded where it is shorter), so it runs D + 1 tokens instead of the tree's N + 1;
  4. the target's greedy acceptance along the path, capped at the path's length, commits as a
     chain round does: the full target decides every committed token, so the output is the
     target's greedy output whatever the cheap verifier says.

The full target's K/V lands at the committed positions already (a chain); the drafter's and the
cheap verifier's K/V of the path's nodes are moved there from their tree slots, as the tree
decoder moves its caches'. Forced rounds are the chain's of length D (the full target's
verification of D + 1 reference tokens, which is the forward a round runs); like the chain's,
they keep neither the drafter's nor the cheap verifier's cache.

Whether it pays: the cheap pass streams the kept layers' weights once more per round and saves
the full target N - D tokens; that can pay only where the target's verification is
compute-bound (large batches, large trees). On the 161M trained pair it does not: its rounds are
bound by their kernel count, so the cheap pass adds time, and 6 of 12 layers pick the target's
path less often (BENCHMARKS.md, eighth set: 0.45x / 0.38x strong AR at batch 16 / 64, where the
tree it prunes ran 0.83x / 0.67x). The 8B estimate there puts the break-even near batch 64.

`generate` counts the cheap passes (one per round, as the eager mechanism counts them) in its
stats as `cheap_forwards`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .graphed_chain import GraphedChainDecoder
from .graphed_loop import rounds_run
from .graphed_tree import GraphedTreeDecoder
from .two_level import layer_skip_model


class GraphedTwoLevelDecoder(GraphedTreeDecoder):
    """Static-tree (`shape`) speculation pruned by the target's `keep_layers` (top-1) before the
    full target verifies the surviving path, for up to `batch` requests."""

    def __init__(self, target, drafter, batch: int, capacity: int, shape,
                 keep_layers: Sequence[int], eos_ids: Sequence[int] = (), capture: bool = True,
                 rounds_per_replay=None):
        # Before the decoders' set-up: the prefill fills its cache with the others'.
        self.cheap = layer_skip_model(target, keep_layers)
        self.ccache = self.cheap.new_cache(batch, capacity)
        super().__init__(target, drafter, batch, capacity, shape, eos_ids, capture,
                         rounds_per_replay=rounds_per_replay)

    def _prefill_models(self):
        return super()._prefill_models() + [(self.cheap, self.ccache)]

    def _cheap_path(self, base: torch.Tensor, nodes: torch.Tensor, mask: torch.Tensor):
        """The cheap verifier's greedy walk down the tree (`mask` the round's): (node per
        depth or -1 [B, D], its length [B]). Its cache holds every committed token but the
        root: the prefill, then each round's path moved down (`_round`), so one forward of
        root + tree serves."""
        logits = self._tree_forward(self.cheap, self.ccache, base, nodes, mask)
        return self._walk(nodes, torch.argmax(logits, dim=-1))

    def _round(self, k: int) -> None:
        base = self._base()
        mask = self._round_mask(base)
        nodes = self._draft_tree(base, mask)
        path, path_len = self._cheap_path(base, nodes, mask)
        # Past a short path the drafts repeat some node: the cap at the path's length below
        # keeps them from being accepted, and the causal mask from the tokens before them.
        drafts = nodes.gather(1, path.clamp(min=0))
        g = self._verify(drafts)                 # the full target, root + the path as a chain
        n = torch.minimum(self._accepted(drafts, g), path_len)
        self._move_path(base, path, ((self.dcache, path), (self.ccache, path)))
        self._commit(g, n)

    # The chain's forced round of length D: the full target's verification forward of a round.
    _forced_round = GraphedChainDecoder._forced_round

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens):
        r = super().generate(prompts, max_new_tokens)
        r.stats["cheap_forwards"] = rounds_run(r.stats)
        return r
