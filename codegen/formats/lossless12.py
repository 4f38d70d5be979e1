"""The `lossless12` bf16 weight format: 12 bits per weight plus exact escapes, bit-exact round trip.

A bf16 weight W[N, K] (out_features, in_features, like `torch.nn.Linear.weight`) is stored as

* `signmant`  uint8[N, K]: sign bit << 7 | the 7 mantissa bits;
* `expcode`   uint8[N, (K+1)//2]: a 4-bit exponent code per weight, low nibble = even column,
  odd K padded with code 0. Code 0 means exponent field 0 (±0 and subnormals, exact from the
  mantissa byte); code c in 1..15 means exponent `base + c - 1`;
* `base`      uint8: one window base per tensor (0-d) or per group of `group_size` columns of a
  row ([N, ceil(K/group_size)]; group_size = K is one base per row, the default);
* escapes, CSR by row: `escape_row_ptr` int32[N+1], `escape_col` int32[nnz], `escape_bits`
  uint16[nnz] — the exact bits of every value whose exponent is outside its group's window
  (±inf and NaN included when they fall outside). The main planes hold signmant 0 / code 0 there,
  so they decode an escape to +0.0 and a GEMV adds `x[col] * value` per escape afterwards.

docs/lossless12.md gives the measurements behind the choices. Packing runs in C++
(`specpilot._C`); `decode_reference` is the readable torch decoder that fused kernels are tested
against.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from specpilot.ir.errors import SpecPilotError

#: One base per row: within 0.0001 byte/weight of the best choice on normal and Student-t(3)
#: weights, and robust to rows of different scales (measurements in docs/lossless12.md).
DEFAULT_GROUP_SIZE = "row"


class Lossless12Error(SpecPilotError):
    """A weight that cannot be packed, or packed planes that are inconsistent."""


@dataclasses.dataclass(frozen=True, eq=False)
class Lossless12Tensor:
    """A bf16 weight [N, K] packed as `lossless12` (field layout in the module docstring).

    `group_size` None means one base for the whole tensor; otherwise the number of consecutive
    columns of a row sharing a base (the last group of a row may be shorter): an even number, or
    K or more for one base per row.
    """

    shape: tuple[int, int]
    group_size: int | None
    signmant: torch.Tensor
    expcode: torch.Tensor
    base: torch.Tensor
    escape_row_ptr: torch.Tensor
    escape_col: torch.Tensor
    escape_bits: torch.Tensor
    num_escapes: int

    def __post_init__(self) -> None:
        n, k = self.shape
        _check_group_size(self.group_size, k)
        expected = {
            "signmant": (torch.uint8, (n, k)),
            "expcode": (torch.uint8, (n, (k + 1) // 2)),
            "base": (torch.uint8, () if self.group_size is None else (n, _num_groups(k, self.group_size))),
            "escape_row_ptr": (torch.int32, (n + 1,)),
            "escape_col": (torch.int32, (self.num_escapes,)),
            "escape_bits": (torch.uint16, (self.num_escapes,)),
        }
        for name, (dtype, shape) in expected.items():
            plane = getattr(self, name)
            if not isinstance(plane, torch.Tensor) or plane.dtype != dtype or tuple(plane.shape) != shape:
                got = (f"{plane.dtype} {tuple(plane.shape)}" if isinstance(plane, torch.Tensor)
                       else type(plane).__name__)
                raise Lossless12Error(
                    f"Lossless12Tensor.{name} must be {dtype} of shape {shape} for a weight of shape "
                    f"{self.shape} (group_size={self.group_size}), got {got}")

    def to(self, device: torch.device | str) -> Lossless12Tensor:
        """The same packed weight with every plane on `device`."""
        planes = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                  if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **planes)


def _num_groups(k: int, group_size: int) -> int:
    return -(-k // group_size)


def _extension():
    try:
        from specpilot import _C
    except ImportError as exc:
        raise Lossless12Error(
            "the C++ extension specpilot._C is not built; run `pip install -e .` in the repository "
            f"root ({exc})") from exc
    return _C


def _check_group_size(group_size, k: int) -> int:
    """The C++/numpy convention for a valid group size: 0 for per tensor, else the group size."""
    if group_size is None:
        return 0
    is_int = isinstance(group_size, int) and not isinstance(group_size, bool)
    if not is_int or group_size < 1 or (group_size % 2 and group_size < k):
        raise Lossless12Error(
            "lossless12 group_size must be None (one base per tensor), 'row' (one per row), an even "
            f"int, or an int >= K = {k} (one group per row), got {group_size!r}")
    return group_size


def pack_lossless12(w: torch.Tensor,
                    group_size: int | str | None = DEFAULT_GROUP_SIZE) -> Lossless12Tensor:
    """Pack a 2-D bf16 tensor; `unpack_lossless12` returns its exact bits (NaN payloads included).

    `group_size`: "row" (one base per row, stored as group_size = K), None (one base for the
    tensor), or a number of columns per base (even, or >= K). The planes are CPU tensors whatever
    the device of `w` (move them with `.to(device)`).
    Raises Lossless12Error for anything but a non-empty 2-D bf16 tensor or a bad group_size.
    """
    if not isinstance(w, torch.Tensor):
        raise Lossless12Error(f"pack_lossless12 expects a torch.Tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise Lossless12Error(f"pack_lossless12 expects a bfloat16 weight, got {w.dtype}; convert it "
                              "with .to(torch.bfloat16) first (lossless12 is exact only for bf16 values)")
    if w.dim() != 2:
        raise Lossless12Error(f"pack_lossless12 expects a 2-D weight [out_features, in_features], "
                              f"got shape {tuple(w.shape)}")
    if w.numel() == 0:
        raise Lossless12Error(f"pack_lossless12 got an empty weight of shape {tuple(w.shape)}")
    if isinstance(group_size, str) and group_size == "row":
        group_size = int(w.shape[1])
    g = _check_group_size(group_size, int(w.shape[1]))
    bits = w.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
    try:
        planes = _extension().lossless12_pack(bits, g)
    except ValueError as exc:
        raise Lossless12Error(str(exc)) from exc
    signmant, expcode, base, row_ptr, col, escape_bits = (torch.from_numpy(p) for p in planes)
    return Lossless12Tensor(shape=(int(w.shape[0]), int(w.shape[1])), group_size=group_size,
                            signmant=signmant, expcode=expcode, base=base, escape_row_ptr=row_ptr,
                            escape_col=col, escape_bits=escape_bits, num_escapes=int(col.numel()))


def unpack_lossless12(t: Lossless12Tensor) -> torch.Tensor:
    """The original bf16 weight, bit for bit, as a CPU tensor (fast C++ path)."""
    planes = [getattr(t, name).cpu().contiguous().numpy() for name in
              ("signmant", "expcode", "base", "escape_row_ptr", "escape_col")]
    planes.append(t.escape_bits.cpu().contiguous().view(torch.int16).numpy().view(np.uint16))
    try:
        bits = _extension().lossless12_unpack(*planes, _check_group_size(t.group_size, t.shape[1]))
    except ValueError as exc:
        raise Lossless12Error(str(exc)) from exc
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def escape_rate(t: Lossless12Tensor) -> float:
    """Fraction of the weights stored as escapes."""
    n, k = t.shape
    return t.num_escapes / (n * k)


def packed_nbytes(t: Lossless12Tensor) -> int:
    """Bytes of every plane together: 1.5 per weight, the bases, row_ptr and 6 per escape."""
    planes = (t.signmant, t.expcode, t.base, t.escape_row_ptr, t.escape_col, t.escape_bits)
    return sum(p.numel() * p.element_size() for p in planes)


def decode_main_planes(t: Lossless12Tensor) -> torch.Tensor:
    """The bf16 bits the dense planes encode, as int32 in [0, 65535]; escapes come out as 0 (+0.0).

    This is what a fused kernel computes per weight before it adds the escapes.
    """
    n, k = t.shape
    signmant = t.signmant.to(torch.int32)
    packed = t.expcode.to(torch.int32)
    code = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, -1)[:, :k]  # even k = low nibble
    base = t.base.to(torch.int32)
    if t.group_size is not None:
        base = base.repeat_interleave(t.group_size, dim=1)[:, :k]
    exponent = torch.where(code == 0, torch.zeros_like(code), base + code - 1)
    sign = (signmant >> 7) << 15
    return sign | (exponent << 7) | (signmant & 0x7F)


def decode_reference(t: Lossless12Tensor) -> torch.Tensor:
    """The bf16 weight rebuilt with plain torch ops, on the planes' device; equals unpack_lossless12."""
    bits = decode_main_planes(t)
    n, _ = t.shape
    rows = torch.repeat_interleave(torch.arange(n, device=bits.device),
                                   (t.escape_row_ptr[1:] - t.escape_row_ptr[:-1]).long())
    escape_values = t.escape_bits.view(torch.int16).to(torch.int32) & 0xFFFF
    bits[rows, t.escape_col.long()] = escape_values
    as_int16 = torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16)  # same 16 bits
    return as_int16.view(torch.bfloat16)
