"""Static, preallocated KV cache: one K and one V buffer per layer, [B, S, Hkv, D].

Slots are addressed explicitly by the decode loops: committed tokens sit at slot == position,
drafted (chain or tree) tokens are written past the committed length and either kept (chain),
compacted (tree) or simply left to be overwritten. `positions[b, s]` is the position of the token
in slot s; it is needed for sliding-window masks, where slot and position can differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch


@dataclass
class KVCache:
    k: List[torch.Tensor]
    v: List[torch.Tensor]
    positions: torch.Tensor  # [B, S] int64

    @classmethod
    def allocate(cls, num_layers: int, batch: int, capacity: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device="cpu") -> "KVCache":
        shape = (batch, capacity, num_kv_heads, head_dim)
        return cls(k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                   v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                   positions=torch.zeros((batch, capacity), dtype=torch.int64, device=device))

    @property
    def batch(self) -> int:
        return self.positions.shape[0]

    @property
    def capacity(self) -> int:
        return self.positions.shape[1]

    def view(self, rows: slice = slice(None), slots: slice = slice(None)) -> "KVCache":
        """`rows` and `slots` of every layer's K/V and of the positions, as views: what a
        forward writes into the view lands in this cache."""
        return KVCache(k=[t[rows, slots] for t in self.k], v=[t[rows, slots] for t in self.v],
                       positions=self.positions[rows, slots])

    def copy_slots(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move entries of request `row` from slots `src` to slots `dst` (tree compaction).

        Gathered before scattering, so overlapping source and destination ranges are safe."""
        for layer in range(len(self.k)):
            self.k[layer][row, dst] = self.k[layer][row, src].clone()
            self.v[layer][row, dst] = self.v[layer][row, src].clone()
        self.positions[row, dst] = self.positions[row, src].clone()
