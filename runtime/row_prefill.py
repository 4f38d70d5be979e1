"""One newcomer's prefill into one row of a running batch's caches, as a graph per bucket.

Continuous refill (runtime/graphed_refill.py) prefills each newcomer on its own, between two
replays of the batch's round graphs. Run eagerly, that prefill was the refill's cost: on an
H200, with 64 HumanEval prompts on 4 and 16 slots of a 161M/12.6M pair, each refill added about
26 ms, so plain AR with refill ran at 0.48-0.70x the padded loop although it needed 20-35 %
fewer target forwards; the eager prefill alone took 17.6-23.5 ms on those shapes, the graph
below 1.7 ms (BENCHMARKS.md, fourth set). Here both models prefill the prompt at batch 1 into
scratch caches, padded to a bucket width (runtime/graphed_prefill.py), and the bucket's slots
are copied into the row named by a device index: one graph per bucket serves every row, and a
refill is one replay plus the row's state writes.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .graphed_prefill import StaticPrefill
from .kv_cache import KVCache


class RowPrefill:
    """Prefill of one prompt into a chosen row of each (model, cache) of `models`; `run`
    returns the first model's float32 logits at the prompt's last token, [1, V]."""

    def __init__(self, models: Sequence[Tuple[object, KVCache]], capacity: int, capture: bool):
        self.device = models[0][0].device
        self.row = torch.zeros(1, dtype=torch.int64, device=self.device)
        # (the batch's cache, this prefill's one-row scratch cache) per model
        self.caches = [(cache, model.new_cache(1, capacity)) for model, cache in models]
        scratch = [(model, mine) for (model, _), (_, mine) in zip(models, self.caches)]
        self._prefill = StaticPrefill(scratch, 1, capacity, capture, after=self._copy)

    def _copy(self, width: int) -> None:
        """The bucket's slots of the scratch caches into row `self.row` of the batch's caches
        (slots past the prompt hold padding, as a batch prefill leaves them)."""
        for cache, scratch in self.caches:
            for dst, src in zip(cache.k + cache.v + [cache.positions],
                                scratch.k + scratch.v + [scratch.positions]):
                dst[:, :width].index_copy_(0, self.row, src[:, :width])

    def prepare(self, lengths: Sequence[int]) -> None:
        """Build (capture) the buckets of these prompt lengths now, e.g. before timing."""
        self._prefill.prepare(lengths)

    def run(self, row: int, prompt: Sequence[int]) -> torch.Tensor:
        """Prefill `prompt` into `row` of every cache; the logits at its last token."""
        self.row.fill_(row)
        return self._prefill.run([list(prompt)])
