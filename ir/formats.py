"""Weight formats and compute dtypes: what each format is, what it costs in bytes, when it is legal.

A weight format is an IR attribute of each linear layer (never inferred from file names). The
dense formats (`bf16`, `fp32`) store the checkpoint's values as they are and must match the
model's compute dtype, so the weights the kernels read are exactly the ones the stock decoder
reads. `lossless12` stores a bfloat16 weight in 12 bits: a byte of sign and mantissa and a 4-bit
exponent code (exponent 0, or one of a 15-exponent window whose base is stored per row); a
weight whose exponent falls outside the window is an *escape*, kept exactly in a per-row patch
list, so decoding restores every bf16 value bit for bit (codegen/formats/lossless12.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

DTYPES = ("bfloat16", "float32")

# Bytes per element of each compute dtype (activations, embeddings, KV cache).
DTYPE_BYTES: Dict[str, int] = {"bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class WeightFormat:
    """One weight format.

    bits: storage bits per weight, escapes excluded.
    dtype: the only compute dtype the format may be used with.
    dense: the plain array of the checkpoint's values (no packing).
    lossless: decoding gives back exactly the checkpoint's values. A format that is not lossless
        may change the decoder's output, and a transformation selecting it must declare so.
    """
    name: str
    bits: int
    dtype: str
    dense: bool
    lossless: bool


WEIGHT_FORMATS: Dict[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", bits=16, dtype="bfloat16", dense=True, lossless=True),
    "fp32": WeightFormat("fp32", bits=32, dtype="float32", dense=True, lossless=True),
    "lossless12": WeightFormat("lossless12", bits=12, dtype="bfloat16", dense=False, lossless=True),
}

DENSE_FORMAT_FOR_DTYPE: Dict[str, str] = {"bfloat16": "bf16", "float32": "fp32"}
DENSE_FORMATS = frozenset(DENSE_FORMAT_FOR_DTYPE.values())    # a weight stored as it computes

# One patch-list entry of lossless12: an int32 column index plus the exact bf16 bits.
LOSSLESS12_ESCAPE_ENTRY_BYTES = 6
# Per row of lossless12: a uint8 window base and an int32 offset into the patch list.
LOSSLESS12_ROW_BYTES = 1 + 4

# Measured escape rate (parts per million of a linear's weights) above which SetWeightFormat
# refuses lossless12. Packing saves 0.5 B per weight (25% of bf16). At 2% escapes the patch list
# already costs 0.12 B per weight, a quarter of that saving, and the fused decode kernel's
# scattered patch pass grows with it; beyond that the format no longer pays for itself on a
# memory-bound step. The rate must be measured: without it the saving is a guess.
LOSSLESS12_MAX_ESCAPE_PPM = 20_000

PPM = 1_000_000


def weight_bytes(fmt: str, out_features: int, in_features: int,
                 escape_ppm: Optional[int] = None) -> int:
    """Bytes one linear's [out_features, in_features] weight occupies in format `fmt`.

    lossless12, as packed by codegen/formats/lossless12.py with its default per-row base: one byte
    of sign and mantissa per weight, a 4-bit exponent code per weight (rows padded to whole
    bytes), LOSSLESS12_ROW_BYTES per row plus one closing int32, and LOSSLESS12_ESCAPE_ENTRY_BYTES
    per escape, ceil(weights x ppm / 1e6) of them. An unknown escape rate is counted at
    LOSSLESS12_MAX_ESCAPE_PPM, the worst rate the format is allowed with, so a cost estimate never
    flatters an unmeasured packing.
    """
    spec = WEIGHT_FORMATS[fmt]
    numel = out_features * in_features
    if fmt != "lossless12":
        return numel * spec.bits // 8
    ppm = LOSSLESS12_MAX_ESCAPE_PPM if escape_ppm is None else escape_ppm
    escapes = (numel * ppm + PPM - 1) // PPM
    planes = numel + out_features * ((in_features + 1) // 2)
    return (planes + out_features * LOSSLESS12_ROW_BYTES + 4
            + escapes * LOSSLESS12_ESCAPE_ENTRY_BYTES)


def may_change_output(fmt: str) -> bool:
    """True when storing weights in `fmt` can change what the decoder outputs."""
    return not WEIGHT_FORMATS[fmt].lossless
