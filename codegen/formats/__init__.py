"""Weight formats: packing, unpacking and torch reference decoders (one module per format), and
the kernel families that read them (importing this package registers those families)."""
from specpilot.codegen.formats.lossless12 import (
    Lossless12Error,
    Lossless12Tensor,
    decode_reference,
    escape_rate,
    pack_lossless12,
    packed_nbytes,
    unpack_lossless12,
)
from specpilot.codegen.formats.lossless12_linear import LINEAR_LOSSLESS12

__all__ = ["LINEAR_LOSSLESS12", "Lossless12Error", "Lossless12Tensor", "decode_reference", "escape_rate",
           "pack_lossless12", "packed_nbytes", "unpack_lossless12"]
