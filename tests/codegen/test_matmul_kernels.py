"""linear and gate_up_silu kernels against runtime.reference_ops, on odd shapes and all variants."""
import pytest
import torch

from kernel_checks import TORCH_DTYPES, assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module, triton_interpreting
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import gate_up_silu_ref, linear_ref

LINEAR_CASES = [
    # (spec params, M, N, K): odd sizes, K not a multiple of BLOCK_K, several M blocks.
    (dict(DTYPE="bf16"), 3, 37, 100),
    (dict(DTYPE="fp32", HAS_BIAS=True, BLOCK_K=16), 5, 70, 48),
    (dict(DTYPE="bf16", USE_DOT=False, BLOCK_M=1, BLOCK_N=16, BLOCK_K=32), 1, 29, 75),
    (dict(DTYPE="bf16", SPLIT_K=3, HAS_BIAS=True, BLOCK_K=32), 2, 40, 200),
    (dict(DTYPE="fp16", BLOCK_N=16), 17, 24, 64),
    (dict(DTYPE="fp32", SPLIT_K=2, USE_DOT=False, BLOCK_M=2, BLOCK_N=8, BLOCK_K=64), 3, 11, 130),
]


@pytest.mark.parametrize("params,M,N,K", LINEAR_CASES)
def test_linear_matches_reference(params, M, N, K, kernel_cache, device):
    spec = kernel_spec("linear", **params)
    dtype = TORCH_DTYPES[spec.get("DTYPE")]
    module = build_triton_module(spec, kernel_cache)
    x, w = randn(M, K, dtype=dtype, device=device), randn(N, K, dtype=dtype, device=device)
    bias = randn(N, dtype=dtype, device=device) if spec.get("HAS_BIAS") else None
    out = poisoned((M, N), dtype, device)
    module.launch(x, w, out, bias)
    assert_matches(out, linear_ref(x, w, bias), spec.get("DTYPE"))


def test_linear_respects_strides_and_writes_only_its_output(kernel_cache, device):
    module = build_triton_module(kernel_spec("linear", DTYPE="fp32", BLOCK_N=16, BLOCK_K=16), kernel_cache)
    M, N, K = 4, 21, 33
    x_wide = randn(M, K + 5, dtype=torch.float32, device=device)
    x = x_wide[:, 2:K + 2]  # rows strided by K + 5
    w = randn(N, K, dtype=torch.float32, device=device)
    frame = poisoned((M + 2, N + 3), torch.float32, device)
    out = frame[1:M + 1, 1:N + 1]
    module.launch(x, w, out)
    assert_matches(out, linear_ref(x, w), "fp32")
    outside = torch.ones_like(frame, dtype=torch.bool)
    outside[1:M + 1, 1:N + 1] = False
    assert torch.isnan(frame[outside]).all()


def test_linear_rejects_tensors_that_do_not_fit_the_spec(kernel_cache, device):
    module = build_triton_module(kernel_spec("linear", DTYPE="bf16"), kernel_cache)
    x = randn(2, 16, dtype=torch.bfloat16, device=device)
    w = randn(8, 16, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="must be torch.bfloat16"):
        module.launch(x.float(), w, poisoned((2, 8), torch.bfloat16, device))
    with pytest.raises(ValueError, match="out is"):
        module.launch(x, w, poisoned((2, 9), torch.bfloat16, device))
    with pytest.raises(ValueError, match="without bias"):
        module.launch(x, w, poisoned((2, 8), torch.bfloat16, device), w[0])


GATE_UP_CASES = [
    (dict(DTYPE="bf16", BLOCK_N=16), 3, 19, 40),
    (dict(DTYPE="fp32", USE_DOT=False, BLOCK_M=2, BLOCK_N=8, BLOCK_K=32), 5, 13, 70),
    (dict(DTYPE="bf16", BLOCK_K=32), 1, 33, 64),
]


@pytest.mark.parametrize("params,M,I,K", GATE_UP_CASES)
def test_gate_up_silu_matches_reference(params, M, I, K, kernel_cache, device):
    spec = kernel_spec("gate_up_silu", **params)
    dtype = TORCH_DTYPES[spec.get("DTYPE")]
    module = build_triton_module(spec, kernel_cache)
    x = randn(M, K, dtype=dtype, device=device)
    # gate and up as views of one fused [2I, K] weight, as a backend may store them.
    fused = randn(2 * I, K, dtype=dtype, device=device)
    w_gate, w_up = fused[:I], fused[I:]
    out = poisoned((M, I), dtype, device)
    module.launch(x, w_gate, w_up, out)
    assert_matches(out, gate_up_silu_ref(x, w_gate, w_up), spec.get("DTYPE"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter path")
def test_kernels_really_run_in_the_interpreter_without_a_gpu(kernel_cache):
    module = build_triton_module(kernel_spec("linear"), kernel_cache)
    assert triton_interpreting()
    assert type(module._linear_kernel).__name__ == "InterpretedFunction"
    assert module._DOT_IN_FP32
