"""The fused-decode lossless12 linear equals the dense linear on the unpacked weights bit for
bit when both accumulate in the same order (same tiles, no escapes: the escape patch list is
added after the dense dot, which changes the order), and within bf16 rounding otherwise."""
import pytest
import torch

from kernel_checks import assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.formats.lossless12 import pack_lossless12, unpack_lossless12
from specpilot.codegen.kernel_spec import kernel_spec

TILES = [dict(BLOCK_M=1, BLOCK_N=8, BLOCK_K=32), dict(BLOCK_M=2, BLOCK_N=16, BLOCK_K=64)]


def _pair(tiles, kernel_cache):
    fused = build_triton_module(kernel_spec("linear_lossless12", **tiles), kernel_cache)
    dense = build_triton_module(kernel_spec("linear", USE_DOT=False, **tiles), kernel_cache)
    return fused, dense


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("M,N,K", [(1, 24, 96), (3, 17, 80)])
def test_same_order_is_bit_identical(tiles, M, N, K, kernel_cache, device):
    fused, dense = _pair(tiles, kernel_cache)
    w = (randn(N, K, dtype=torch.float32, device="cpu") * 0.02).bfloat16()
    packed = pack_lossless12(w, "row")
    assert packed.num_escapes == 0, "the same-order claim holds without escapes"
    x = randn(M, K, dtype=torch.bfloat16, device=device)
    a, b = poisoned((M, N), torch.bfloat16, device), poisoned((M, N), torch.bfloat16, device)
    fused.launch(x, packed.to(device), a)
    dense.launch(x, unpack_lossless12(packed).to(device), b)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_with_escapes_within_bf16_rounding(kernel_cache, device):
    fused, dense = _pair(TILES[0], kernel_cache)
    w = (randn(20, 96, dtype=torch.float32, device="cpu") * 0.02).bfloat16()
    w[3, 5], w[11, 40] = 3.0e4, -1.0e-30   # outside the exponent window: stored as escapes
    packed = pack_lossless12(w, "row")
    assert packed.num_escapes >= 2
    x = randn(2, 96, dtype=torch.bfloat16, device=device)
    a, b = poisoned((2, 20), torch.bfloat16, device), poisoned((2, 20), torch.bfloat16, device)
    fused.launch(x, packed.to(device), a)
    dense.launch(x, unpack_lossless12(packed).to(device), b)
    assert_matches(a, b, "bf16")
