"""Plain numpy reference of the `lossless12` format, written independently of the C++ packer.

It spells the format out as array operations (see docs/lossless12.md) so the fast packer in
`csrc/lossless12.cpp` can be checked against it byte for byte. It favours clarity over speed and
imports nothing else of ours.

Format, for bf16 bit patterns v (sign s = v >> 15, exponent e = (v >> 7) & 0xFF, mantissa m = v & 0x7F):

* every group (the whole tensor, or `group_size` consecutive columns of one row) has a base
  exponent b: the smallest b in [1, 241] that maximises the number of its values with
  b <= e <= b + 14;
* a value with e == 0 gets code 0; a value with b <= e <= b + 14 gets code e - b + 1 (1..15);
  both keep `signmant = s << 7 | m`;
* any other value is an escape: code 0 and signmant 0 (the main planes decode it to +0.0), and its
  exact bits go to a CSR list (row_ptr, col, bits) in row-major order.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

WINDOW = 15                  # exponent values covered by codes 1..15
MAX_BASE = 256 - WINDOW      # 241: the window [b, b + 14] ends at exponent 255 at most


class Lossless12Arrays(NamedTuple):
    """The planes of a packed [N, K] weight, as numpy arrays."""

    signmant: np.ndarray  # uint8[N, K]
    expcode: np.ndarray   # uint8[N, (K + 1) // 2]; low nibble = even column
    base: np.ndarray      # uint8[] (per tensor) or uint8[N, ceil(K / group_size)]
    row_ptr: np.ndarray   # int32[N + 1]
    col: np.ndarray       # int32[nnz]
    bits: np.ndarray      # uint16[nnz]


def _group_ids(n: int, k: int, group_size: int) -> tuple[np.ndarray, int]:
    """Index of each element's group (row-major) and the number of groups."""
    if group_size == 0:
        return np.zeros((n, k), dtype=np.int64), 1
    per_row = -(-k // group_size)
    ids = np.arange(n)[:, None] * per_row + (np.arange(k) // group_size)[None, :]
    return ids, n * per_row


def choose_bases(exponent: np.ndarray, group_ids: np.ndarray, num_groups: int) -> np.ndarray:
    """Per group, the smallest base in [1, 241] covering the most nonzero exponents."""
    hist = np.bincount((group_ids * 256 + exponent).ravel(), minlength=num_groups * 256)
    hist = hist.reshape(num_groups, 256)
    hist[:, 0] = 0  # exponent 0 has its own code and never needs the window
    cum = np.concatenate([np.zeros((num_groups, 1), dtype=np.int64), np.cumsum(hist, axis=1)], axis=1)
    candidates = np.arange(1, MAX_BASE + 1)
    coverage = cum[:, candidates + WINDOW] - cum[:, candidates]  # count in [b, b + WINDOW - 1]
    return candidates[np.argmax(coverage, axis=1)]  # argmax takes the first (smallest) maximum


def pack_numpy(bits: np.ndarray, group_size: int = 0) -> Lossless12Arrays:
    """Pack a uint16[N, K] array of bf16 bits; group_size 0 means one base for the tensor.

    Groups never split a byte of codes: group_size is even, or covers the whole row (>= K).
    """
    assert bits.dtype == np.uint16 and bits.ndim == 2 and bits.size > 0
    n, k = bits.shape
    assert group_size == 0 or (group_size > 0 and (group_size % 2 == 0 or group_size >= k))
    v = bits.astype(np.int64)
    sign, exponent, mantissa = v >> 15, (v >> 7) & 0xFF, v & 0x7F

    group_ids, num_groups = _group_ids(n, k, group_size)
    group_base = choose_bases(exponent, group_ids, num_groups)
    b = group_base[group_ids]

    in_window = (exponent >= b) & (exponent <= b + WINDOW - 1)
    escaped = (exponent != 0) & ~in_window
    code = np.where(in_window, exponent - b + 1, 0)
    signmant = np.where(escaped, 0, (sign << 7) | mantissa).astype(np.uint8)

    if k % 2:  # pad with code 0 so columns pair up into bytes
        code = np.concatenate([code, np.zeros((n, 1), dtype=code.dtype)], axis=1)
    expcode = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)

    rows, cols = np.nonzero(escaped)  # row-major order: rows ascending, columns ascending
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(np.int32)
    base = (np.array(group_base[0]) if group_size == 0 else group_base.reshape(n, -1)).astype(np.uint8)
    return Lossless12Arrays(signmant, expcode, base, row_ptr, cols.astype(np.int32), bits[escaped])


def unpack_numpy(a: Lossless12Arrays, group_size: int = 0) -> np.ndarray:
    """Rebuild the uint16[N, K] bf16 bits from the planes."""
    n, k = a.signmant.shape
    code = np.stack([a.expcode & 0xF, a.expcode >> 4], axis=2).reshape(n, -1)[:, :k].astype(np.int64)
    if group_size == 0:
        b = np.full((n, k), int(a.base), dtype=np.int64)
    else:
        b = np.repeat(a.base.astype(np.int64), group_size, axis=1)[:, :k]
    exponent = np.where(code == 0, 0, b + code - 1)
    sm = a.signmant.astype(np.int64)
    out = (((sm >> 7) << 15) | (exponent << 7) | (sm & 0x7F)).astype(np.uint16)
    rows = np.repeat(np.arange(n), np.diff(a.row_ptr))
    out[rows, a.col] = a.bits
    return out
