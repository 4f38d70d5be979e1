"""The fused-decode lossless12 GEMV against a float32 matmul with the original bf16 weight."""
import pytest
import torch

from kernel_checks import assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.errors import KernelSpecError
from specpilot.codegen.formats.lossless12 import pack_lossless12
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import linear_ref


def weight_with_escapes(n: int, k: int, device) -> torch.Tensor:
    """normal(0, 0.02) weights plus far-out values in a few rows, large enough that an escape
    the kernel dropped or misplaced would change its output by orders of magnitude."""
    w = torch.randn(n, k) * 0.02
    rows = torch.randperm(n)[: max(1, n // 3)]
    cols = torch.randint(0, k, (rows.numel(),))
    w[rows, cols] = torch.randn(rows.numel()) * 1e6
    w[rows[0], (cols[0] + 1) % k] = 1e-30  # tiny: escapes below the window
    return w.bfloat16().to(device)


CASES = [
    # (spec params, group_size, M, N, K): K odd / not a multiple of BLOCK_K, several blocks.
    (dict(), "row", 1, 37, 100),
    (dict(BLOCK_K=32), "row", 1, 9, 75),
    (dict(BASE="tensor", BLOCK_M=2, BLOCK_N=16, BLOCK_K=32), None, 3, 21, 75),
    (dict(BASE="group", BLOCK_M=4, BLOCK_N=8, BLOCK_K=64), 2, 5, 19, 131),
    (dict(BASE="group", BLOCK_N=16, BLOCK_K=32, HAS_BIAS=True), 64, 2, 40, 200),
    (dict(BASE="group", BLOCK_K=16), "row", 1, 8, 33),
    (dict(BASE="row", USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, HAS_BIAS=True), "row", 17, 24, 96),
    (dict(BASE="group", USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=32), 32, 17, 24, 96),
    (dict(USE_DOT=True, BLOCK_M=64, BLOCK_N=16, BLOCK_K=32, BASE="tensor"), None, 64, 16, 48),
]


@pytest.mark.parametrize("params,group_size,M,N,K", CASES)
def test_matches_dense_matmul(params, group_size, M, N, K, kernel_cache, device):
    spec = kernel_spec("linear_lossless12", **params)
    module = build_triton_module(spec, kernel_cache)
    w = weight_with_escapes(N, K, device)
    packed = pack_lossless12(w, group_size).to(device)
    assert packed.num_escapes >= N // 3
    x = randn(M, K, dtype=torch.bfloat16, device=device)
    bias = randn(N, dtype=torch.bfloat16, device=device) if spec.get("HAS_BIAS") else None
    out = poisoned((M, N), torch.bfloat16, device)
    module.launch(x, packed, out, bias)
    assert_matches(out, linear_ref(x, w, bias), "bf16")


@pytest.mark.parametrize("pad_left,pad_right", [(2, 0), (1, 2)])
def test_strided_activations_and_outputs(pad_left, pad_right, kernel_cache, device):
    # Rows of x strided by an even (paired 32-bit loads) or odd (column by column) element count.
    module = build_triton_module(kernel_spec("linear_lossless12", BLOCK_M=2, BLOCK_N=8, BLOCK_K=32),
                                 kernel_cache)
    M, N, K = 3, 20, 64
    w = weight_with_escapes(N, K, device)
    x_wide = randn(M, pad_left + K + pad_right, dtype=torch.bfloat16, device=device)
    x = x_wide[:, pad_left:pad_left + K]
    frame = poisoned((M + 2, N + 3), torch.bfloat16, device)
    out = frame[1:M + 1, 1:N + 1]
    module.launch(x, pack_lossless12(w).to(device), out)
    assert_matches(out, linear_ref(x, w), "bf16")
    outside = torch.ones_like(frame, dtype=torch.bool)
    outside[1:M + 1, 1:N + 1] = False
    assert torch.isnan(frame[outside]).all()


def test_nonfinite_escapes_reach_their_column(kernel_cache, device):
    module = build_triton_module(kernel_spec("linear_lossless12", BLOCK_N=8, BLOCK_K=32), kernel_cache)
    w = (torch.randn(12, 40) * 0.02).bfloat16()
    w[2, 7], w[9, 39] = float("nan"), float("inf")
    packed = pack_lossless12(w).to(device)
    x = randn(3, 40, dtype=torch.bfloat16, device=device).abs() + 0.1  # positive: x*inf = +inf
    out = poisoned((3, 12), torch.bfloat16, device)
    module.launch(x, packed, out)
    assert torch.isnan(out[:, 2]).all() and torch.isposinf(out[:, 9]).all()
    finite = [c for c in range(12) if c not in (2, 9)]
    assert_matches(out[:, finite], linear_ref(x, w.to(device))[:, finite], "bf16")


def test_rejects_weights_that_do_not_fit_the_spec(kernel_cache, device):
    per_tensor = build_triton_module(kernel_spec("linear_lossless12", BASE="tensor"), kernel_cache)
    per_row = build_triton_module(kernel_spec("linear_lossless12", BASE="row"), kernel_cache)
    per_group = build_triton_module(kernel_spec("linear_lossless12", BASE="group"), kernel_cache)
    w = (torch.randn(8, 16) * 0.02).bfloat16()
    x = randn(2, 16, dtype=torch.bfloat16, device=device)
    out = poisoned((2, 8), torch.bfloat16, device)
    with pytest.raises(ValueError, match="BASE=tensor"):
        per_tensor.launch(x, pack_lossless12(w, 4).to(device), out)
    with pytest.raises(ValueError, match="BASE=row"):
        per_row.launch(x, pack_lossless12(w, 4).to(device), out)
    with pytest.raises(ValueError, match="BASE=group"):
        per_group.launch(x, pack_lossless12(w, None).to(device), out)
    with pytest.raises(ValueError, match="must be torch.bfloat16"):
        per_group.launch(x.float(), pack_lossless12(w).to(device), out)
    with pytest.raises(ValueError, match="expected"):
        per_group.launch(x[:, :15], pack_lossless12(w).to(device), out)


def test_spec_validation():
    with pytest.raises(KernelSpecError, match="USE_DOT"):
        kernel_spec("linear_lossless12", USE_DOT=True, BLOCK_M=4)
    with pytest.raises(KernelSpecError, match="BLOCK_K >= 32"):
        kernel_spec("linear_lossless12", USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    with pytest.raises(KernelSpecError, match="BLOCK_M\\*BLOCK_N\\*BLOCK_K"):
        kernel_spec("linear_lossless12", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
    with pytest.raises(KernelSpecError, match="BASE"):
        kernel_spec("linear_lossless12", BASE="rows")
