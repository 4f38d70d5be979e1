"""Prefill as CUDA graphs: prompts padded to a bucket width, one graph per bucket.

A prefill's shape is the batch's longest prompt, so it cannot be one graph; but padded up to a
multiple of `BUCKET` tokens it takes a handful of shapes, each captured once (all buckets share
one memory pool: their graphs never run at the same time). Padding is what the eager prefill
does anyway (runtime/steps.append_step): pad tokens write K/V past each prompt's end, where
nothing reads them before the decode overwrites them. Run eagerly (capture=False) the same
static buffers serve, so the padding logic is tested without a GPU.

With `bounded`, each bucket's forward sees only the bucket's first `width` slots of the caches
(views of them): a prefill into an empty cache has nothing past them to attend to, and the
attention then walks `width` slots, not the whole cache (on an H200, cuDNN's attention over
457 slots was a fifth of a 64-token refill's kernel time, BENCHMARKS.md twelfth set).

`run(rows, first_only=True)` prefills the first model alone (its own graphs, in the same pool): a
padded adaptive batch that starts with speculation off for good never runs its drafter, so its
drafter's prefill would be wasted work (as large as the target's with a target-sized drafter).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from .cuda_graphs import capture_graph, to_device

BUCKET = 64   # prompt tokens per bucket step: few shapes, at most 63 wasted positions per row


class StaticPrefill:
    """Prefill of up to `batch` prompts into each (model, cache) of `models` (or the first
    alone); `run` returns the first model's float32 logits at each row's last prompt token,
    [batch, V]. With `bounded` a bucket's forward attends over its own `width` slots only;
    `stream` is the stream its graphs are captured on (runtime/cuda_graphs.capture_graph)."""

    def __init__(self, models: Sequence[Tuple[object, object]], batch: int, capacity: int,
                 capture: bool, bounded: bool = False, stream=None):
        self.models, self.batch, self.capacity, self.capture = list(models), batch, capacity, capture
        self.bounded, self.stream = bounded, stream
        self.device = self.models[0][0].device
        self._buckets: Dict[Tuple[int, bool], dict] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def width_for(self, longest: int) -> int:
        return min(-(-longest // BUCKET) * BUCKET, self.capacity)

    def prepare(self, lengths: Sequence[int], first_only: bool = False) -> None:
        """Build (capture) the buckets of these prompt lengths now, e.g. before timing."""
        for width in sorted({self.width_for(n) for n in lengths}):
            self._bucket(width, first_only)

    def _bucket(self, width: int, first_only: bool) -> dict:
        # With one model the first alone is all of them: one graph serves both requests.
        key = (width, first_only and len(self.models) > 1)
        if key in self._buckets:
            return self._buckets[key]
        dev, b = self.device, self.batch
        models = self.models[:1] if key[1] else self.models
        seen = self.capacity
        if self.bounded:
            models = [(model, cache.view(slots=slice(0, width))) for model, cache in models]
            seen = width
        pos = torch.arange(width, dtype=torch.int64, device=dev)[None, :].expand(b, width).clone()
        static = {"tokens": torch.zeros((b, width), dtype=torch.int64, device=dev),
                  "positions": pos,
                  "mask": torch.arange(seen, device=dev)[None, None, :] <= pos[:, :, None],
                  "last": torch.zeros((b, 1), dtype=torch.int64, device=dev)}

        def body():
            out = None
            for model, cache in models:
                logits = model.forward(static["tokens"], static["positions"], static["positions"],
                                       static["mask"], cache, static["last"])
                out = logits if out is None else out
            return out[:, 0]

        static["body"] = body
        if self.capture:
            static["graph"], static["logits"] = capture_graph(body, dev, self._pool, self.stream)
        self._buckets[key] = static
        return static

    def run(self, rows: List[List[int]], first_only: bool = False) -> torch.Tensor:
        """Prefill `rows` (exactly `batch` prompts) into every model's cache, or with
        `first_only` the first model's alone; logits at each row's last token."""
        width = self.width_for(max(len(r) for r in rows))
        static = self._bucket(width, first_only)
        table = torch.zeros((self.batch, width), dtype=torch.int64)
        for i, r in enumerate(rows):
            table[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
        static["tokens"].copy_(to_device(table, self.device))
        static["last"].copy_(to_device(torch.tensor([[len(r) - 1] for r in rows],
                                                    dtype=torch.int64), self.device))
        if self.capture:
            static["graph"].replay()
            return static["logits"]
        return static["body"]()
