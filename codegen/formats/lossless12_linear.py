"""The `linear_lossless12` kernel family: y = x @ W^T with W stored as lossless12, decoded on the fly.

Importing this module registers the family (`specpilot.codegen.formats` imports it), so
`kernel_spec("linear_lossless12", ...)` works like any dense family.

Launcher contract (templates/triton/linear_lossless12.py.j2):

    launch(x, w, out, bias=None)
        x [M, K] bf16, out [M, N] bf16 (last dimension contiguous), w a Lossless12Tensor of shape
        (N, K) whose planes are contiguous on x's device, bias [N] bf16 only and always when
        HAS_BIAS. BASE=row takes weights packed with one base per row (group_size >= K, the
        default), BASE=group any group size (per row included, slower), BASE=tensor group_size
        None. out = x @ W.T (+ bias) with float32 accumulation: the dense planes first (escapes
        read as +0.0), then x[:, col] * value for each escape, rounded once.

The torch reference is `runtime.reference_ops.linear_ref(x, decode_reference(w), bias)`.
"""
from __future__ import annotations

from typing import Mapping, Optional

from specpilot.codegen.families import check_matmul_tiles
from specpilot.codegen.kernel_spec import register_family
from specpilot.codegen.params import BoolParam, EnumParam, FamilySchema, IntParam, Value


def _check_tiles(p: Mapping[str, Value]) -> Optional[str]:
    # The kernel splits each K step into even and odd columns: two dots of BLOCK_K / 2.
    return check_matmul_tiles(p, min_dot_k=32)


LINEAR_LOSSLESS12 = register_family(FamilySchema(
    name="linear_lossless12", backend="triton",
    summary="y = x @ W.T (+ bias) for 1..64 rows of x, W in lossless12 decoded in registers",
    launcher="launch(x, w, out, bias=None)",
    params=(
        IntParam("BLOCK_M", 1, 64, 1, power_of_two=True, doc="rows of x per program"),
        IntParam("BLOCK_N", 8, 256, 32, power_of_two=True, doc="output columns (weight rows) per program"),
        # Even, so a step never splits a byte of exponent codes (a power of two >= 16 is).
        IntParam("BLOCK_K", 16, 1024, 128, power_of_two=True, doc="reduction step"),
        BoolParam("USE_DOT", False, doc="tl.dot (tensor cores, BLOCK_M >= 16) or a multiply-add"),
        EnumParam("BASE", ("row", "group", "tensor"), "row",
                  doc="one base per row (the packer's default), per group of columns, or per tensor"),
        BoolParam("HAS_BIAS", False),
        IntParam("num_warps", 1, 16, 4, power_of_two=True, doc="warps per program"),
        IntParam("num_stages", 1, 6, 3, doc="software pipelining depth of the K loop"),
    ),
    check=_check_tiles))
