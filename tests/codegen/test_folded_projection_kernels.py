"""The fused layer kernels' float32 residual stream: the attention with W_o folded in (FOLD_O),
the MLP with W_down folded in (FOLD_DOWN), and the kernels that read the stream (X_FP32), each
against its torch reference (attention_ref / norm_gate_up_silu_ref, then fold_ref in float64)."""
import pytest
import torch

from kernel_checks import TORCH_DTYPES, assert_matches, poisoned, qkv_case, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.errors import KernelSpecError
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import (attention_ref, fold_ref, fused_linear_ref,
                                             norm_gate_up_silu_ref, norm_qkv_rope_ref)

# A folded projection sums rounded operands in float32 in another order than the reference, and
# an operand (the attention's output, the activation) may sit one ulp of the dtype from the
# reference's: the error scales with the products' terms, hence the absolute floors.
FOLD_TOLERANCE = {"bf16": dict(rtol=2 ** -7, atol=3e-2), "fp32": dict(rtol=1e-5, atol=2e-4)}


def _assert_folded(actual, expected, dtype):
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=False,
                               **FOLD_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype,splits,causal,T", [
    ("bf16", 1, False, 1),      # a decode step: three heads' rows of one token
    ("fp32", 4, False, 7),      # 21 rows of a kv head: two row blocks, split walks merged
    ("bf16", 2, True, 3),       # positions in place of a mask
])
def test_attention_with_w_o_folded_in_adds_its_projection_into_the_residual_stream(
        dtype, splits, causal, T, kernel_cache, device):
    """out (zeros) receives residual + the attention's rows, rounded to the dtype, @ W_o^T: each
    token once however many programs (kv heads, row blocks) add into its row; N = 40 columns
    take three steps of FOLD_N = 16, the last part-full."""
    torch_dtype = TORCH_DTYPES[dtype]
    spec = kernel_spec("attention", DTYPE=dtype, HEAD_DIM=32, BLOCK_S=16, SPLITS=splits,
                       FOLD_O=True, FOLD_N=16)
    module = build_triton_module(spec, kernel_cache)
    B, S, HQ, HKV, D, N = 3, 45, 6, 2, 32, 40
    q = randn(B, T, HQ, D, dtype=torch_dtype, device=device)
    k_cache, v_cache = (randn(B, S, HKV, D, dtype=torch_dtype, device=device) for _ in range(2))
    positions = torch.tensor([[30 + t for t in range(T)], [4 + t for t in range(T)],
                              [40 + t for t in range(T)]], device=device)
    slots = torch.arange(S, device=device)
    mask = slots[None, None, :] <= positions[:, :, None]
    w_o = randn(N, HQ * D, dtype=torch_dtype, device=device) / 8
    residual = randn(B * T, N, dtype=torch.float32, device=device)
    attended = attention_ref(q, k_cache, v_cache, mask)
    expected = fold_ref(attended.reshape(B * T, HQ * D), w_o, residual)
    workspace = module.split_workspace(B, T, HQ, HKV, device) if splits > 1 else None
    for _ in range(2):                       # the split counts serve a second launch
        out = torch.zeros(B * T, N, dtype=torch.float32, device=device)
        module.launch(q, k_cache, v_cache, None if causal else mask, out, workspace=workspace,
                      positions=positions if causal else None, w_o=w_o, residual=residual)
        _assert_folded(out, expected, dtype)
    # Without the projection's share (a head left out), the result is off: the test can fail.
    assert not torch.allclose(out.cpu(), (residual + 0).cpu(), atol=1e-2)


def test_the_folded_attention_refuses_a_residual_stream_in_the_wrong_dtype(kernel_cache, device):
    module = build_triton_module(kernel_spec("attention", DTYPE="bf16", HEAD_DIM=16, FOLD_O=True),
                                 kernel_cache)
    q = randn(1, 1, 2, 16, dtype=torch.bfloat16, device=device)
    cache = randn(1, 8, 1, 16, dtype=torch.bfloat16, device=device)
    mask = torch.ones(1, 1, 8, dtype=torch.bool, device=device)
    w_o = randn(24, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="float32 .* residual stream"):
        module.launch(q, cache, cache, mask, torch.zeros(1, 24, dtype=torch.bfloat16, device=device),
                      w_o=w_o, residual=torch.zeros(1, 24, device=device))
    with pytest.raises(ValueError, match="w_o must be"):
        module.launch(q, cache, cache, mask, torch.zeros(1, 24, device=device), w_o=w_o[:, :16],
                      residual=torch.zeros(1, 24, device=device))


@pytest.mark.parametrize("params,M,I,K", [
    (dict(DTYPE="bf16", BLOCK_N=16, FOLD_N=16), 20, 70, 40),     # two row blocks, five column blocks
    (dict(DTYPE="bf16", BLOCK_N=32, BLOCK_K=32), 5, 64, 96),     # FOLD_N past K
    (dict(DTYPE="fp32", USE_DOT=False, BLOCK_M=2, BLOCK_N=8, BLOCK_K=32, FOLD_N=16), 3, 13, 40),
])
def test_the_mlp_with_w_down_folded_in_adds_its_projection_into_the_residual_stream(
        params, M, I, K, kernel_cache, device):
    spec = kernel_spec("norm_gate_up_silu", FOLD_DOWN=True, **params)
    dtype = spec.get("DTYPE")
    torch_dtype = TORCH_DTYPES[dtype]
    module = build_triton_module(spec, kernel_cache)
    x = randn(M, K, dtype=torch.float32, device=device)           # the residual stream
    norm_weight = randn(K, dtype=torch_dtype, device=device)
    w_gate_up = randn(2 * I, K, dtype=torch_dtype, device=device) / 4
    w_gate, w_up = w_gate_up[:I], w_gate_up[I:]
    w_down = randn(K, I, dtype=torch_dtype, device=device) / 8
    act = norm_gate_up_silu_ref(x, norm_weight, w_gate, w_up, 1e-6)
    assert act.dtype == torch_dtype
    expected = fold_ref(act, w_down, x)
    out = torch.zeros(M, K, dtype=torch.float32, device=device)
    module.launch(x, norm_weight, w_gate, w_up, out, 1e-6, w_down=w_down)
    _assert_folded(out, expected, dtype)
    with pytest.raises(ValueError, match="x must be torch.float32"):
        module.launch(x.to(torch_dtype) if dtype != "fp32" else x.double(), norm_weight, w_gate,
                      w_up, out, 1e-6, w_down=w_down)
    with pytest.raises(ValueError, match="w_down must be"):
        module.launch(x, norm_weight, w_gate, w_up, out, 1e-6, w_down=w_down.T.contiguous())


def test_a_folded_mlp_without_tensor_cores_keeps_its_tile_in_registers():
    with pytest.raises(KernelSpecError, match="must be <= 32768"):
        kernel_spec("norm_gate_up_silu", DTYPE="fp32", USE_DOT=False, BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16, FOLD_DOWN=True, FOLD_N=256)


@pytest.mark.parametrize("gather", [False, True])
def test_norm_qkv_rope_reads_and_writes_a_float32_residual_stream(gather, kernel_cache, device):
    """X_FP32: the stream x (not gathered) is float32 and normalised into the dtype; gathered
    embedding rows are written to a float32 x_out exactly."""
    spec = kernel_spec("norm_qkv_rope", DTYPE="bf16", HEAD_DIM=32, X_FP32=True)
    module = build_triton_module(spec, kernel_cache)
    b, t, hq, hkv, d, hidden = 2, 3, 4, 2, 32, 48
    case = qkv_case(torch.bfloat16, device, b, t, hq, hkv, d, hidden, capacity=11,
                    vocab=29 if gather else None)
    if not gather:        # a float32 stream: values the dtype cannot hold
        case["x"] = randn(b * t, hidden, dtype=torch.float32, device=device)
    x = case["x"]
    tokens = (torch.randint(0, 29, (b, t), generator=torch.Generator().manual_seed(5)).to(device)
              if gather else None)
    k_cache, v_cache = case.pop("k_cache"), case.pop("v_cache")
    q_exp, k_exp, v_exp, rows_exp, _ = norm_qkv_rope_ref(**case, k_cache=k_cache, v_cache=v_cache,
                                                         eps=1e-6, num_heads=hq, tokens=tokens)
    q_out = poisoned((b, t, hq, d), torch.bfloat16, device)
    x_out = poisoned((b * t, hidden), torch.float32, device) if gather else None
    module.launch(**case, q_out=q_out, k_cache=k_cache, v_cache=v_cache, eps=1e-6, tokens=tokens,
                  x_out=x_out)
    assert_matches(q_out, q_exp, "bf16", atol=6e-2)
    assert_matches(k_cache, k_exp, "bf16", atol=6e-2)
    assert_matches(v_cache, v_exp, "bf16")
    if gather:
        assert torch.equal(x_out, rows_exp.float())
    else:
        with pytest.raises(ValueError, match="x must be torch.float32"):
            module.launch(**{**case, "x": x.bfloat16()}, q_out=q_out, k_cache=k_cache,
                          v_cache=v_cache, eps=1e-6)


def test_the_lm_head_normalises_a_float32_residual_stream(kernel_cache, device):
    spec = kernel_spec("fused_linear", DTYPE="bf16", NORM=True, OUT_FP32=True, X_FP32=True,
                       BLOCK_N=32)
    module = build_triton_module(spec, kernel_cache)
    x = randn(5, 48, dtype=torch.float32, device=device)
    w = randn(70, 48, dtype=torch.bfloat16, device=device) / 4
    norm_weight = randn(48, dtype=torch.bfloat16, device=device)
    out = poisoned((5, 70), torch.float32, device)
    module.launch(x, w, out, norm_weight=norm_weight, eps=1e-5)
    assert_matches(out, fused_linear_ref(x, w, None, norm_weight, 1e-5, True), "bf16")
    with pytest.raises(ValueError, match="x must be torch.float32"):
        module.launch(x.bfloat16(), w, out, norm_weight=norm_weight, eps=1e-5)
    with pytest.raises(KernelSpecError, match="X_FP32 needs NORM"):
        kernel_spec("fused_linear", DTYPE="bf16", X_FP32=True)
