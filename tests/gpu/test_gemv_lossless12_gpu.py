"""The CUDA lossless12 GEMV (both MATH variants) against decode_reference + a float32 matmul.

Skipped on a machine without CUDA; needs nvcc there to build the kernels.
"""
import pytest
import torch

from specpilot.codegen.cache import KernelCache
from specpilot.codegen.formats.lossless12 import decode_reference, pack_lossless12
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import linear_ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16 = dict(rtol=2 ** -6, atol=1e-2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from specpilot.codegen.cuda_build import find_nvcc
    if find_nvcc() is None:
        pytest.fail("nvcc is required to build the CUDA kernels on the GPU machine")
    return KernelCache(tmp_path_factory.mktemp("gpu-l12-cuda"))


def weight_with_escapes(n: int, k: int) -> torch.Tensor:
    """normal(0, 0.02) weights plus far-out values in a third of the rows (escapes that a dropped
    or misplaced escape would turn into a large error) and a few zeros and subnormals."""
    w = torch.randn(n, k) * 0.02
    rows = torch.randperm(n)[: max(1, n // 3)]
    w[rows, torch.randint(0, k, (rows.numel(),))] = torch.randn(rows.numel()) * 1e4
    w[rows[0], :8] = 0.0
    w[rows[-1], 8:12] = 2.0 ** -130
    return w.bfloat16()


CASES = [
    # (params, group_size, M, N, K): N not a multiple of 16 or of the warps' rows, K not of 64.
    (dict(), "row", 1, 1000, 1040),
    (dict(ROWS_PER_WARP=2, UNROLL=4, HAS_BIAS=True), None, 3, 4097, 4096),
    (dict(ROWS_PER_WARP=4, UNROLL=1, WARPS_PER_BLOCK=2), "row", 8, 333, 2064),
    (dict(MATH="mma"), "row", 1, 1000, 1040),
    (dict(MATH="mma", HAS_BIAS=True, WARPS_PER_BLOCK=8, UNROLL=4), "row", 5, 4097, 4096),
    (dict(MATH="mma", WARPS_PER_BLOCK=1, UNROLL=1), None, 8, 333, 2064),
    (dict(MATH="mma", M_MAX=4, WARPS_PER_BLOCK=16), "row", 4, 64, 14336),
]


@pytest.mark.parametrize("params,group_size,M,N,K", CASES)
def test_matches_decoded_matmul(cache, params, group_size, M, N, K):
    from specpilot.codegen.cuda_build import build_cuda_module
    spec = kernel_spec("gemv_lossless12", **params)
    module = build_cuda_module(spec, cache)
    w = weight_with_escapes(N, K)
    packed = pack_lossless12(w, group_size).to("cuda")
    assert packed.num_escapes >= N // 3
    x = torch.randn(M, K, device="cuda").bfloat16()
    bias = torch.randn(N, device="cuda").bfloat16() if spec.get("HAS_BIAS") else None
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    module.launch(x, packed, out, bias)
    torch.cuda.synchronize()
    decoded = decode_reference(packed)
    assert torch.equal(decoded.cpu().view(torch.int16), w.view(torch.int16))
    torch.testing.assert_close(out.float(), linear_ref(x, decoded, bias).float(), equal_nan=False, **BF16)


def test_every_row_count_up_to_m_max_and_strided_x(cache):
    from specpilot.codegen.cuda_build import build_cuda_module
    N, K = 300, 512
    w = weight_with_escapes(N, K)
    packed = pack_lossless12(w).to("cuda")
    for math in ("fma", "mma"):
        module = build_cuda_module(kernel_spec("gemv_lossless12", MATH=math), cache)
        for M in range(1, 9):
            x_wide = torch.randn(M, K + 24, device="cuda").bfloat16()
            x = x_wide[:, 8:8 + K]  # rows 16-byte aligned, stride K + 24
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            module.launch(x, packed, out)
            torch.cuda.synchronize()
            torch.testing.assert_close(out.float(), linear_ref(x, w.cuda()).float(), **BF16)
