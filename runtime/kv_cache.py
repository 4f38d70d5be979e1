"""Static, preallocated KV cache: a K and a V tensor per layer, [B, S, Hkv, D].

`allocate` takes every layer's K from one [L, B, S, Hkv, D] buffer (and V from another), so a
tree's compaction moves a round's accepted nodes in all layers with one gather and one scatter
per buffer (`move_slots`): under a CUDA graph at small batch a round is bound by its kernel
count, and one copy a layer made compaction cost 4L kernels a round. K and V stay separate
buffers so that no two of a layer's inputs alias each other (a compiled layer mutates both).
The layers must stay those aliases: a layer replaced by another tensor would leave the stacked
buffer stale, so the cache checks that they share its storage when it is made, and nothing may
assign a layer afterwards.

Slots are addressed explicitly by the decode loops: committed tokens sit at slot == position,
drafted (chain or tree) tokens are written past the committed length and either kept (chain),
compacted (tree) or simply left to be overwritten. `positions[b, s]` is the position of the token
in slot s; it is needed for sliding-window masks, where slot and position can differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch


@dataclass
class KVCache:
    k: List[torch.Tensor]
    v: List[torch.Tensor]
    positions: torch.Tensor  # [B, S] int64
    # [L, B, S, Hkv, D] buffers whose [i] are k[i] / v[i] (None: layers held separately)
    stacked_k: Optional[torch.Tensor] = None
    stacked_v: Optional[torch.Tensor] = None

    def __post_init__(self):
        for layers, stacked in ((self.k, self.stacked_k), (self.v, self.stacked_v)):
            if stacked is not None and (
                    len(layers) != stacked.shape[0] or
                    any(t.data_ptr() != s.data_ptr() for t, s in zip(layers, stacked))):
                raise ValueError("a KVCache's layers must be its stacked buffer's layers")

    @classmethod
    def allocate(cls, num_layers: int, batch: int, capacity: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device="cpu") -> "KVCache":
        shape = (num_layers, batch, capacity, num_kv_heads, head_dim)
        k = torch.zeros(shape, dtype=dtype, device=device)
        v = torch.zeros(shape, dtype=dtype, device=device)
        return cls(k=_layer_aliases(k), v=_layer_aliases(v),
                   positions=torch.zeros((batch, capacity), dtype=torch.int64, device=device),
                   stacked_k=k, stacked_v=v)

    @property
    def batch(self) -> int:
        return self.positions.shape[0]

    @property
    def capacity(self) -> int:
        return self.positions.shape[1]

    def view(self, rows: slice = slice(None), slots: slice = slice(None)) -> "KVCache":
        """`rows` and `slots` of every layer's K/V and of the positions, as views: what a
        forward writes into the view lands in this cache."""
        stacked = (None, None) if self.stacked_k is None else (
            self.stacked_k[:, rows, slots], self.stacked_v[:, rows, slots])
        return KVCache(k=[t[rows, slots] for t in self.k], v=[t[rows, slots] for t in self.v],
                       positions=self.positions[rows, slots],
                       stacked_k=stacked[0], stacked_v=stacked[1])

    def move_slots(self, rows, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every layer's K/V at slots `src` [B, N] of rows `rows` [B, 1] copied to slots `dst`
        [B, N], or, for one row `rows` (an int), at slots `src` [N] to `dst` [N] (gathered
        before scattering: overlapping ranges are safe); positions untouched."""
        if self.stacked_k is not None:
            for buffer in (self.stacked_k, self.stacked_v):
                buffer[:, rows, dst] = buffer[:, rows, src]
            return
        for layer in range(len(self.k)):
            for buffer in (self.k[layer], self.v[layer]):
                buffer[rows, dst] = buffer[rows, src]

    def copy_row_from(self, row: int, source: "KVCache", source_row: int, width: int) -> None:
        """The first `width` slots of `source`'s row `source_row` (every layer's K/V and the
        positions) into this cache's row `row`. Where both caches keep their layers stacked,
        one copy for K and one for V, as `move_slots` moves them (a view a layer and side
        would be four host operations a layer, at every refill's admission); else one
        multi-tensor copy of every layer's."""
        if self.stacked_k is not None and source.stacked_k is not None:
            dst = [self.stacked_k[:, row, :width], self.stacked_v[:, row, :width]]
            src = [source.stacked_k[:, source_row, :width], source.stacked_v[:, source_row, :width]]
        else:
            dst = [t[row, :width] for t in self.k + self.v]
            src = [t[source_row, :width] for t in source.k + source.v]
        torch._foreach_copy_(dst, src)
        self.positions[row, :width].copy_(source.positions[source_row, :width])

    def copy_slots(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move entries of request `row` from slots `src` to slots `dst` (tree compaction),
        positions included: `move_slots` for one row.

        Gathered before scattering, so overlapping source and destination ranges are safe."""
        self.move_slots(row, src, dst)
        self.positions[row, dst] = self.positions[row, src].clone()


def _layer_aliases(stacked: torch.Tensor) -> List[torch.Tensor]:
    """Each layer of `stacked` [L, ...] as a tensor on its storage that is not a view of it:
    the compiled layers (SPECPILOT_FAST_OPS=layers) given views compiled again for new batch
    and cache sizes (tests/runtime/test_compiled_layers.py); given these they do not."""
    step, shape, stride = stacked.stride(0), stacked.shape[1:], stacked.stride()[1:]
    return [torch.empty(0, dtype=stacked.dtype, device=stacked.device).set_(
                stacked.untyped_storage(), stacked.storage_offset() + i * step, shape, stride)
            for i in range(stacked.shape[0])]
