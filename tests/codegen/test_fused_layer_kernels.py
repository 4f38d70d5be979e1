"""The fused layer kernels (fused_linear, norm_gate_up_silu, norm_qkv_rope) against their torch
references, which compose the per-op references exactly as runtime/model.py's layer does."""
import pytest
import torch

from kernel_checks import TORCH_DTYPES, assert_matches, poisoned, qkv_case, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.errors import KernelSpecError
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import (fused_linear_ref, norm_gate_up_silu_ref,
                                             norm_qkv_rope_ref)

FUSED_LINEAR_CASES = [
    # (spec params, M, N, K): odd sizes, K not a multiple of BLOCK_K, several M and N blocks.
    (dict(DTYPE="bf16", NORM=True), 3, 37, 100),
    (dict(DTYPE="bf16", RESIDUAL=True, BLOCK_K=32), 18, 40, 72),
    (dict(DTYPE="bf16", NORM=True, OUT_FP32=True, BLOCK_N=64), 5, 130, 48),
    (dict(DTYPE="fp32", NORM=True, RESIDUAL=True, USE_DOT=False, BLOCK_M=2, BLOCK_N=8,
          BLOCK_K=32), 3, 11, 70),
    (dict(DTYPE="fp16", RESIDUAL=True, BLOCK_N=16), 17, 24, 64),
    (dict(DTYPE="bf16", NORM=True, RESIDUAL=True, BLOCK_K=256), 4, 24, 300),   # K past one wide step
]


@pytest.mark.parametrize("params,M,N,K", FUSED_LINEAR_CASES)
def test_fused_linear_matches_reference(params, M, N, K, kernel_cache, device):
    spec = kernel_spec("fused_linear", **params)
    dtype = TORCH_DTYPES[spec.get("DTYPE")]
    module = build_triton_module(spec, kernel_cache)
    x, w = randn(M, K, dtype=dtype, device=device), randn(N, K, dtype=dtype, device=device) / 4
    residual = randn(M, N, dtype=dtype, device=device) if spec.get("RESIDUAL") else None
    norm_weight = randn(K, dtype=dtype, device=device) if spec.get("NORM") else None
    out = poisoned((M, N), torch.float32 if spec.get("OUT_FP32") else dtype, device)
    module.launch(x, w, out, residual, norm_weight, 1e-5)
    expected = fused_linear_ref(x, w, residual, norm_weight, 1e-5, spec.get("OUT_FP32"))
    assert_matches(out, expected, spec.get("DTYPE"))


@pytest.mark.parametrize("dtype,M,N,block_n", [
    ("bf16", 20, 1100, 16),     # 69 column blocks: past the reducer's 64 a step; 2 row blocks
    ("fp32", 5, 300, 32),
])
def test_fused_linear_argmax_is_each_rows_first_best_column(dtype, M, N, block_n, kernel_cache,
                                                            device):
    """ARGMAX: argmax_out is torch.argmax of the logits the kernel wrote, first column on ties,
    with ties planted in one column block and across blocks (w rows copied), over two launches
    (the counts the first leaves must serve the second)."""
    spec = kernel_spec("fused_linear", DTYPE=dtype, NORM=True, OUT_FP32=True, ARGMAX=True,
                       BLOCK_N=block_n, BLOCK_K=32)
    torch_dtype = TORCH_DTYPES[dtype]
    module = build_triton_module(spec, kernel_cache)
    workspace = module.argmax_workspace(M, N, device)
    for launch in range(2):
        x = randn(M, 48, dtype=torch_dtype, device=device)
        w = randn(N, 48, dtype=torch_dtype, device=device) / 4
        norm_weight = randn(48, dtype=torch_dtype, device=device)
        expected = fused_linear_ref(x, w, None, norm_weight, 1e-5, True)
        best = expected.argmax(dim=1)
        # copies of row 0's best column: one later in its block, one in the last block
        w[N - 1] = w[best[0]]
        w[best[0] + 1 if (best[0] + 1) % block_n else best[0] - 1] = w[best[0]]
        expected = fused_linear_ref(x, w, None, norm_weight, 1e-5, True)
        out = poisoned((M, N), torch.float32, device)
        found = poisoned((M,), torch.int64, device)
        module.launch(x, w, out, norm_weight=norm_weight, eps=1e-5, argmax_out=found,
                      workspace=workspace)
        assert_matches(out, expected, dtype)
        assert torch.equal(found, out.argmax(dim=1)), f"launch {launch}"
        assert int((out[0] == out[0].max()).sum()) >= 2      # the planted tie is a tie
        assert int(workspace[0].abs().sum()) == 0            # counts left for the next launch


def test_fused_linear_refuses_operands_its_spec_does_not_take(kernel_cache, device):
    plain = build_triton_module(kernel_spec("fused_linear", DTYPE="bf16"), kernel_cache)
    normed = build_triton_module(kernel_spec("fused_linear", DTYPE="bf16", NORM=True,
                                             RESIDUAL=True), kernel_cache)
    x = randn(2, 16, dtype=torch.bfloat16, device=device)
    w = randn(8, 16, dtype=torch.bfloat16, device=device)
    out = poisoned((2, 8), torch.bfloat16, device)
    with pytest.raises(ValueError, match="without a residual"):
        plain.launch(x, w, out, residual=out.clone())
    with pytest.raises(ValueError, match="without a norm"):
        plain.launch(x, w, out, norm_weight=x[0])
    with pytest.raises(ValueError, match="residual must be"):
        normed.launch(x, w, out, norm_weight=x[0])
    with pytest.raises(ValueError, match="out must be torch.bfloat16"):
        plain.launch(x, w, out.float())


@pytest.mark.parametrize("params,M,I,K", [
    (dict(DTYPE="bf16"), 5, 70, 100),
    (dict(DTYPE="bf16", BLOCK_N=64, BLOCK_K=32), 20, 64, 64),
    (dict(DTYPE="fp32", USE_DOT=False, BLOCK_M=2, BLOCK_N=8, BLOCK_K=32), 3, 13, 40),
])
def test_norm_gate_up_silu_matches_reference(params, M, I, K, kernel_cache, device):
    spec = kernel_spec("norm_gate_up_silu", **params)
    dtype = TORCH_DTYPES[spec.get("DTYPE")]
    module = build_triton_module(spec, kernel_cache)
    x, norm_weight = randn(M, K, dtype=dtype, device=device), randn(K, dtype=dtype, device=device)
    w_gate_up = randn(2 * I, K, dtype=dtype, device=device) / 4
    w_gate, w_up = w_gate_up[:I], w_gate_up[I:]          # views of one fused weight, as a model holds it
    out = poisoned((M, I), dtype, device)
    module.launch(x, norm_weight, w_gate, w_up, out, 1e-6)
    assert_matches(out, norm_gate_up_silu_ref(x, norm_weight, w_gate, w_up, 1e-6), spec.get("DTYPE"))


@pytest.mark.parametrize("params,b,t,hq,hkv,hidden,gather,far", [
    (dict(DTYPE="bf16", HEAD_DIM=32), 2, 3, 4, 2, 48, False, 0),
    (dict(DTYPE="fp32", HEAD_DIM=32), 2, 3, 4, 2, 48, False, 7000),   # large RoPE angles
    (dict(DTYPE="bf16", HEAD_DIM=32, BLOCK_M=16, BLOCK_K=32), 5, 4, 2, 1, 64, True, 0),  # > one M block
    (dict(DTYPE="fp32", HEAD_DIM=12, USE_DOT=False, BLOCK_M=4, BLOCK_K=16), 3, 2, 3, 3, 20, True, 0),
    (dict(DTYPE="fp16", HEAD_DIM=48), 1, 5, 2, 2, 40, False, 0),     # D/2 not a power of two
])
def test_norm_qkv_rope_matches_reference(params, b, t, hq, hkv, hidden, gather, far, kernel_cache,
                                         device):
    spec = kernel_spec("norm_qkv_rope", **params)
    dtype, d, capacity = TORCH_DTYPES[spec.get("DTYPE")], spec.get("HEAD_DIM"), 11
    module = build_triton_module(spec, kernel_cache)
    case = qkv_case(dtype, device, b, t, hq, hkv, d, hidden, capacity,
                     vocab=29 if gather else None, far=far)
    tokens = (torch.randint(0, 29, (b, t), generator=torch.Generator().manual_seed(7)).to(device)
              if gather else None)
    cache_positions = torch.full((b, capacity), -5, dtype=torch.int64, device=device)
    q_exp, k_exp, v_exp, rows_exp, pos_exp = norm_qkv_rope_ref(
        **case, eps=1e-6, num_heads=hq, tokens=tokens, cache_positions=cache_positions)
    q_out = poisoned((b, t, hq, d), dtype, device)
    x_out = poisoned((b * t, hidden), dtype, device) if gather else None
    k_cache, v_cache = case.pop("k_cache"), case.pop("v_cache")
    module.launch(**case, q_out=q_out, k_cache=k_cache, v_cache=v_cache, eps=1e-6, tokens=tokens,
                  x_out=x_out, cache_positions=cache_positions)
    # RoPE's output is a difference of rounded products: its error scales with them (as in
    # test_norm_rope_kernels), hence the wider absolute floor.
    atol = {"bf16": 6e-2, "fp16": 8e-3, "fp32": 1e-4}[spec.get("DTYPE")]
    assert_matches(q_out, q_exp, spec.get("DTYPE"), atol=atol)
    assert_matches(k_cache, k_exp, spec.get("DTYPE"), atol=atol)
    assert_matches(v_cache, v_exp, spec.get("DTYPE"))
    assert torch.equal(cache_positions, pos_exp)
    if gather:
        assert torch.equal(x_out, rows_exp)


def test_norm_qkv_rope_refuses_mismatched_operands(kernel_cache, device):
    module = build_triton_module(kernel_spec("norm_qkv_rope", DTYPE="bf16", HEAD_DIM=32), kernel_cache)
    case = qkv_case(torch.bfloat16, device, 2, 1, 2, 1, 32, 32, 8)
    q_out = poisoned((2, 1, 2, 32), torch.bfloat16, device)
    with pytest.raises(ValueError, match="w_qkv is"):
        module.launch(**{**case, "w_qkv": case["w_qkv"][:-1]}, q_out=q_out, eps=1e-6)
    with pytest.raises(ValueError, match="x_out is written only"):
        module.launch(**case, q_out=q_out, eps=1e-6, x_out=case["x"].clone())
    with pytest.raises(ValueError, match="inv_freq must be"):
        module.launch(**{**case, "inv_freq": case["inv_freq"].double()}, q_out=q_out, eps=1e-6)


def test_norm_qkv_rope_specs_outside_its_tiles_are_refused():
    with pytest.raises(KernelSpecError, match="USE_DOT needs HEAD_DIM >= 32"):
        kernel_spec("norm_qkv_rope", DTYPE="bf16", HEAD_DIM=16)
    # the multiply-add's tile: 64 rows x 128 columns (half of 256) x 1024 is past the registers
    with pytest.raises(KernelSpecError, match="must be <= 32768"):
        kernel_spec("norm_qkv_rope", DTYPE="bf16", HEAD_DIM=256, USE_DOT=False, BLOCK_M=64,
                    BLOCK_K=1024)
    kernel_spec("norm_qkv_rope", DTYPE="bf16", HEAD_DIM=16, USE_DOT=False, BLOCK_K=16)  # fits
