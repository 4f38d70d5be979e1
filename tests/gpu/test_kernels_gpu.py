"""Every generated kernel family, run natively on a CUDA GPU against runtime.reference_ops.

Shapes here are closer to real models than the CPU interpreter tests allow (hidden 4096, vocab
32000, head_dim 128, GQA 32/8). Skipped on a machine without CUDA.
"""
import pytest
import torch

from specpilot.codegen.cache import KernelCache, build_triton_module, triton_interpreting
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime import reference_ops as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16 = dict(rtol=2 ** -6, atol=1e-2)
FP32 = dict(rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    if triton_interpreting():
        pytest.fail("TRITON_INTERPRET is set: these tests must run the kernels natively")
    return KernelCache(tmp_path_factory.mktemp("gpu-kernels"))


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


def nan(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def close(actual, expected, tol=BF16):
    torch.testing.assert_close(actual.float(), expected.float(), equal_nan=False, **tol)


@pytest.mark.parametrize("params,M,N,K", [
    (dict(), 16, 4096, 4096),
    (dict(BLOCK_M=64), 64, 1000, 1032),
    (dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=32, BLOCK_K=256), 1, 4096, 4096),
    (dict(SPLIT_K=4, HAS_BIAS=True, BLOCK_K=128), 4, 1024, 8192),
    (dict(DTYPE="fp32", HAS_BIAS=True), 8, 512, 1000),
])
def test_linear(cache, params, M, N, K):
    spec = kernel_spec("linear", **params)
    dtype = torch.float32 if spec.get("DTYPE") == "fp32" else torch.bfloat16
    x, w = rand(M, K, dtype=dtype), rand(N, K, dtype=dtype)
    bias = rand(N, dtype=dtype) if spec.get("HAS_BIAS") else None
    out = nan(M, N, dtype=dtype)
    build_triton_module(spec, cache).launch(x, w, out, bias)
    close(out, ref.linear_ref(x, w, bias), FP32 if dtype == torch.float32 else BF16)


@pytest.mark.parametrize("params,M", [(dict(), 4), (dict(USE_DOT=False, BLOCK_M=1, BLOCK_N=16), 1)])
def test_gate_up_silu(cache, params, M):
    x, wg, wu = rand(M, 2048), rand(1408, 2048), rand(1408, 2048)
    out = nan(M, 1408)
    build_triton_module(kernel_spec("gate_up_silu", **params), cache).launch(x, wg, wu, out)
    close(out, ref.gate_up_silu_ref(x, wg, wu))


@pytest.mark.parametrize("block_h", [4096, 1024])
def test_rmsnorm_residual_in_place(cache, block_h):
    x, residual, weight = rand(8, 4096), rand(8, 4096), rand(4096)
    expected_out, expected_residual = ref.rmsnorm_ref(x, weight, 1e-5, residual)
    out = nan(8, 4096)
    build_triton_module(kernel_spec("rmsnorm", BLOCK_H=block_h), cache).launch(
        x, weight, out, 1e-5, residual, residual)
    assert torch.equal(residual, expected_residual)
    close(out, expected_out)
    # HF's rounding steps are reproduced; only the float32 sum of squares may round differently.
    assert (out != expected_out).float().mean().item() < 1e-2


@pytest.mark.parametrize("cos_sin", ["inv_freq", "table"])
def test_rope_matches_hf_rounding(cache, cos_sin):
    T, HQ, HK, D = 16, 32, 8, 128
    q, k = rand(T, HQ, D), rand(T, HK, D)
    positions = torch.randint(0, 8000, (T,), device="cuda")
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
    q_out, k_out = nan(T, HQ, D), nan(T, HK, D)
    module = build_triton_module(kernel_spec("rope", HEAD_DIM=D, COS_SIN=cos_sin), cache)
    if cos_sin == "inv_freq":
        module.launch(q, k, positions, q_out, k_out, inv_freq=inv_freq)
        cos, sin = ref.rope_cos_sin(positions, inv_freq, torch.bfloat16)
    else:
        table_cos, table_sin = ref.rope_cos_sin(torch.arange(8000, device="cuda"), inv_freq, torch.bfloat16)
        module.launch(q, k, positions, q_out, k_out, cos=table_cos, sin=table_sin)
        cos, sin = table_cos[positions], table_sin[positions]
    for got, x in ((q_out, q), (k_out, k)):
        expected = ref.rope_ref(x, cos, sin)
        if cos_sin == "table":  # same tables, same rounding steps as HF: bit for bit
            assert torch.equal(got, expected)
        else:  # a last-ulp difference of float32 cos/sin can flip a rare rounding
            assert (got != expected).float().mean().item() < 1e-3
            close(got, expected, dict(rtol=2 ** -6, atol=2 ** -5 * x.abs().max().item()))


@pytest.mark.parametrize("T,tree", [(1, False), (8, False), (8, True)])
def test_attention(cache, T, tree):
    B, HQ, HKV, D, S = 2, 32, 8, 128, 512
    committed = [300, 77]
    mask = torch.zeros(B, T, S, dtype=torch.bool, device="cuda")
    block = torch.tril(torch.ones(T, T, dtype=torch.bool, device="cuda"))
    if tree:  # a binary-ish tree: node i's parent is (i - 1) // 2
        block = torch.eye(T, dtype=torch.bool, device="cuda")
        for i in range(1, T):
            block[i] |= block[(i - 1) // 2]
    for b, length in enumerate(committed):
        mask[b, :, :length] = True
        mask[b, :, length:length + T] = block
    kv_len = torch.tensor([c + T for c in committed], device="cuda")
    q, k_cache, v_cache = rand(B, T, HQ, D), rand(B, S, HKV, D), rand(B, S, HKV, D)
    out = nan(B, T, HQ, D)
    build_triton_module(kernel_spec("attention", HEAD_DIM=D), cache).launch(
        q, k_cache, v_cache, mask, out, kv_len=kv_len)
    close(out, ref.attention_ref(q, k_cache, v_cache, mask, kv_len=kv_len))


def test_greedy_accept_tree(cache):
    B, N, V = 4, 7, 32000
    parents = torch.tensor([-1, -1, 0, 0, 2, 4, 1], device="cuda")
    logits = rand(B, N + 1, V)
    pred = logits.argmax(-1)
    tokens = torch.randint(0, V, (B, N), device="cuda")
    for b, path in enumerate([[0, 2, 4, 5], [1, 6], [], [0, 3]]):
        for node in path:
            tokens[b, node] = pred[b, parents[node] + 1]
    outs = [torch.full(s, -7, dtype=torch.int64, device="cuda") for s in ((B, N + 1), (B,), (B, N), (B,))]
    build_triton_module(kernel_spec("greedy_accept"), cache).launch(logits, tokens, parents, *outs)
    for got, expected in zip(outs, ref.greedy_accept_ref(logits, tokens, parents)):
        assert torch.equal(got, expected)
    assert outs[1].tolist() == [4, 2, 0, 2]


def test_kv_compact_all_layers(cache):
    L, B, S, HKV, D = 4, 3, 256, 8, 128
    k_cache, v_cache = rand(L, B, S, HKV, D), rand(L, B, S, HKV, D)
    src = torch.tensor([[101, 103, 104, 0], [50, 51, 52, 53], [7, 0, 0, 0]], device="cuda")
    start = torch.tensor([100, 50, 3], device="cuda")
    counts = torch.tensor([3, 4, 1], device="cuda")
    expected_k = ref.kv_compact_ref(k_cache, src, start, counts)
    expected_v = ref.kv_compact_ref(v_cache, src, start, counts)
    build_triton_module(kernel_spec("kv_compact"), cache).launch(k_cache, v_cache, src, start, counts)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("M,N,K,bias,cols", [(1, 4096, 4096, False, 1), (5, 1000, 1032, True, 1),
                                             (8, 4096, 11008, True, 2), (3, 1001, 2056, True, 4)])
def test_cuda_gemv_bf16(cache, M, N, K, bias, cols):
    from specpilot.codegen.cuda_build import build_cuda_module, find_nvcc
    if find_nvcc() is None:
        pytest.fail("nvcc is required to build the CUDA kernels on the GPU machine")
    module = build_cuda_module(kernel_spec("gemv_bf16", M_MAX=8, HAS_BIAS=bias, COLS_PER_WARP=cols), cache)
    x, w = rand(M, K), rand(N, K)
    b = rand(N) if bias else None
    out = nan(M, N)
    module.launch(x, w, out, b)
    torch.cuda.synchronize()
    close(out, ref.linear_ref(x, w, b))
    close(out, torch.nn.functional.linear(x, w, b), dict(rtol=2 ** -5, atol=5e-2))
