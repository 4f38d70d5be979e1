"""Property tests: arbitrary bf16 bit matrices round-trip, and the C++ planes equal the numpy ones."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from specpilot.codegen.formats.lossless12 import decode_reference, pack_lossless12, unpack_lossless12
from specpilot.codegen.formats.lossless12_numpy import pack_numpy, unpack_numpy

shapes = st.tuples(st.integers(1, 24), st.integers(1, 70))
group_sizes = st.one_of(st.none(), st.just("row"), st.integers(1, 40).map(lambda h: 2 * h),
                        st.integers(70, 200))  # >= K: one group per row, odd allowed


def bit_matrix(draw_exponents: bool):
    """uint16 matrices of random shape; optionally with about half the exponents moved near typical
    weights (100..126) so that groups mix coded values, zeros/subnormals and escapes."""
    def build(shape):
        bits = arrays(np.uint16, shape, elements=st.integers(0, 0xFFFF))
        if not draw_exponents:
            return bits
        exponents = arrays(np.uint16, shape, elements=st.integers(100, 126))
        keep = arrays(np.bool_, shape, elements=st.booleans())
        return st.tuples(bits, exponents, keep).map(
            lambda p: np.where(p[2], p[0], (p[0] & 0x807F) | (p[1] << 7)).astype(np.uint16))
    return shapes.flatmap(build)


def as_bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def check_round_trip_and_planes(bits: np.ndarray, group_size) -> None:
    w = as_bf16(bits)
    t = pack_lossless12(w, group_size)
    # Compare bit patterns, not values: NaN != NaN and -0.0 == 0.0 would hide differences.
    assert torch.equal(unpack_lossless12(t).view(torch.int16), w.view(torch.int16))
    assert torch.equal(decode_reference(t).view(torch.int16), w.view(torch.int16))

    g = t.group_size or 0  # "row" is stored as K
    ref = pack_numpy(bits, g)
    ours = (t.signmant, t.expcode, t.base, t.escape_row_ptr, t.escape_col, t.escape_bits)
    for name, mine, theirs in zip(ref._fields, ours, ref):
        mine = mine.numpy()
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert mine.tobytes() == theirs.tobytes(), name
    assert np.array_equal(unpack_numpy(ref, g), bits)


@settings(max_examples=300, deadline=None)
@given(bits=bit_matrix(draw_exponents=False), group_size=group_sizes)
def test_arbitrary_bit_matrices(bits, group_size):
    check_round_trip_and_planes(bits, group_size)


@settings(max_examples=300, deadline=None)
@given(bits=bit_matrix(draw_exponents=True), group_size=group_sizes)
def test_weight_like_bit_matrices(bits, group_size):
    check_round_trip_and_planes(bits, group_size)


@settings(max_examples=50, deadline=None)
@given(shape=shapes, group_size=group_sizes, scale=st.sampled_from([1e-30, 1e-3, 0.02, 1.0, 1e30]),
       seed=st.integers(0, 2**32 - 1))
def test_heavy_tailed_matrices(shape, group_size, scale, seed):
    rng = np.random.default_rng(seed)
    w = torch.from_numpy((rng.standard_t(2.0, shape) * scale).astype(np.float32)).bfloat16()
    check_round_trip_and_planes(w.view(torch.int16).numpy().view(np.uint16), group_size)
