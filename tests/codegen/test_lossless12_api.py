"""The Python API: sizes and escape rates on realistic weights, input validation, devices."""
import math

import numpy as np
import pytest
import torch

from specpilot.codegen.formats.lossless12 import (
    Lossless12Error, Lossless12Tensor, decode_reference, escape_rate, pack_lossless12,
    packed_nbytes, unpack_lossless12)
from specpilot.codegen.formats.lossless12_numpy import pack_numpy
from specpilot.ir.errors import SpecPilotError


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("group_size", [None, "row", 128])
def test_packed_size_on_normal_init(group_size):
    n, k = 512, 1024
    w = (torch.randn(n, k, dtype=torch.float64) * 0.02).bfloat16()
    t = pack_lossless12(w, group_size)
    assert same_bits(unpack_lossless12(t), w)

    # The byte count, from the layout alone: 1 + 1/2 byte per weight, one base byte per group,
    # row_ptr, and int32 column + uint16 bits per escape (the count checked against numpy).
    ref = pack_numpy(w.view(torch.int16).numpy().view(np.uint16), t.group_size or 0)
    assert t.num_escapes == ref.col.size
    bases = {None: 1, "row": n, 128: n * math.ceil(k / 128)}[group_size]
    assert packed_nbytes(t) == n * k + n * (k // 2) + bases + 4 * (n + 1) + 6 * t.num_escapes
    assert escape_rate(t) == t.num_escapes / (n * k)

    # Escape bound. Some window of 15 exponents ends at the largest exponent E, and the chosen
    # window covers at least as many values, so escapes <= #{0 < |w| < 2^(E-14)} <= #{|w| < m 2^-14}
    # with m = max|w|. For normal(0, s) that has rate ~ 0.8 m/s 2^-14 < 3e-4 (m < 6s at this size);
    # per group the maximum is smaller, so fewer. 1e-3 leaves a wide margin.
    top = 2.0 ** (torch.frexp(w.abs().max().float()).exponent.item() - 1)
    assert t.num_escapes <= int(((w.abs() < top * 2.0 ** -14) & (w != 0)).sum())
    assert escape_rate(t) < 1e-3
    bytes_per_weight = packed_nbytes(t) / (n * k)
    assert 1.5 < bytes_per_weight < 1.5 + bases / (n * k) + 4 * (n + 1) / (n * k) + 6e-3


def test_decode_reference_equals_unpack_on_realistic_weights():
    w = (torch.randn(96, 200) / math.sqrt(200)).bfloat16()
    w[3, 7], w[50, 199], w[95, 0] = float("inf"), float("nan"), 1e30
    for group_size in (None, "row", 64):
        t = pack_lossless12(w, group_size)
        assert same_bits(decode_reference(t), unpack_lossless12(t))
        assert same_bits(decode_reference(t), w)


def test_accepts_views_and_parameters():
    linear = torch.nn.Linear(130, 40, dtype=torch.bfloat16)
    t = pack_lossless12(linear.weight)  # requires_grad
    assert t.shape == (40, 130)
    assert same_bits(unpack_lossless12(t), linear.weight.detach())
    wt = linear.weight.detach().t()  # non-contiguous
    assert same_bits(unpack_lossless12(pack_lossless12(wt, 16)), wt.contiguous())


def test_to_device_keeps_planes():
    t = pack_lossless12((torch.randn(8, 10) * 0.02).bfloat16(), 4)
    moved = t.to("cpu")
    assert moved.shape == t.shape and moved.group_size == 4
    assert same_bits(decode_reference(moved), unpack_lossless12(t))


@pytest.mark.parametrize("bad, what", [
    (torch.randn(4, 4), "bfloat16"),
    (torch.randn(4, 4).half(), "bfloat16"),
    (torch.randint(0, 9, (4, 4), dtype=torch.int16), "bfloat16"),
    (torch.randn(16).bfloat16(), "2-D"),
    (torch.randn(2, 3, 4).bfloat16(), "2-D"),
    (torch.tensor(1.0, dtype=torch.bfloat16), "2-D"),
    (torch.empty(0, 5, dtype=torch.bfloat16), "empty"),
    (torch.empty(5, 0, dtype=torch.bfloat16), "empty"),
    (np.ones((4, 4), dtype=np.float32), "torch.Tensor"),
])
def test_bad_weights_raise(bad, what):
    with pytest.raises(Lossless12Error, match=what) as info:
        pack_lossless12(bad)
    assert isinstance(info.value, SpecPilotError)


@pytest.mark.parametrize("group_size", [0, -2, 3, 2.0, True, "64", "rows"])
def test_bad_group_sizes_raise(group_size):
    with pytest.raises(Lossless12Error, match="group_size"):
        pack_lossless12(torch.randn(4, 4).bfloat16(), group_size)


def test_group_size_conventions():
    w = (torch.randn(5, 7) * 0.02).bfloat16()
    assert pack_lossless12(w).group_size == 7  # default: one base per row, stored as K
    assert pack_lossless12(w, "row").base.shape == (5, 1)
    assert pack_lossless12(w, None).base.shape == ()
    assert pack_lossless12(w, 9).base.shape == (5, 1)  # odd is fine when one group spans the row
    assert pack_lossless12(w, 4).base.shape == (5, 2)


def test_inconsistent_planes_raise():
    t = pack_lossless12((torch.randn(6, 9) * 0.02).bfloat16(), 4)
    with pytest.raises(Lossless12Error, match="expcode"):
        Lossless12Tensor(**{**t.__dict__, "expcode": t.expcode[:, :-1]})
    with pytest.raises(Lossless12Error, match="base"):
        Lossless12Tensor(**{**t.__dict__, "group_size": None})
    # A CSR list whose row_ptr decreases, or whose column is out of range, is refused by unpack.
    row_ptr = torch.tensor([0, 1, 0, 0, 0, 0, 0], dtype=torch.int32)
    bad = Lossless12Tensor(**{**t.__dict__, "escape_row_ptr": row_ptr})
    with pytest.raises(Lossless12Error, match="row_ptr"):
        unpack_lossless12(bad)
    one_escape_in_column_9 = {
        "num_escapes": 1, "escape_row_ptr": torch.tensor([0, 1, 1, 1, 1, 1, 1], dtype=torch.int32),
        "escape_col": torch.tensor([9], dtype=torch.int32),
        "escape_bits": torch.tensor([5], dtype=torch.uint16)}
    bad = Lossless12Tensor(**{**t.__dict__, **one_escape_in_column_9})
    with pytest.raises(Lossless12Error, match="column"):
        unpack_lossless12(bad)
