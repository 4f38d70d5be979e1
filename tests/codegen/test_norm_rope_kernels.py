"""rmsnorm (with and without the fused residual add) and rope kernels against the references."""
import pytest
import torch

from kernel_checks import TORCH_DTYPES, assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import rmsnorm_ref, rope_cos_sin, rope_ref


@pytest.mark.parametrize("dtype,block_h,M,H", [
    ("bf16", 64, 5, 50),     # one pass, H not a power of two
    ("fp32", 16, 3, 50),     # several passes over the row
    ("fp16", 128, 2, 128),
])
def test_rmsnorm_with_residual_matches_reference(dtype, block_h, M, H, kernel_cache, device):
    module = build_triton_module(kernel_spec("rmsnorm", DTYPE=dtype, BLOCK_H=block_h), kernel_cache)
    tdt = TORCH_DTYPES[dtype]
    x, residual = randn(M, H, dtype=tdt, device=device), randn(M, H, dtype=tdt, device=device)
    weight = randn(H, dtype=tdt, device=device)
    out, residual_out = poisoned((M, H), tdt, device), poisoned((M, H), tdt, device)
    module.launch(x, weight, out, 1e-5, residual, residual_out)
    expected_out, expected_residual = rmsnorm_ref(x, weight, 1e-5, residual)
    assert torch.equal(residual_out, expected_residual)  # one rounding of an exact sum
    assert_matches(out, expected_out, dtype)


@pytest.mark.parametrize("block_h", [16, 64])
def test_rmsnorm_residual_update_in_place(block_h, kernel_cache, device):
    # residual_out aliasing residual is how a decoder keeps one residual stream buffer.
    module = build_triton_module(kernel_spec("rmsnorm", DTYPE="bf16", BLOCK_H=block_h), kernel_cache)
    M, H = 3, 40
    x, residual = randn(M, H, dtype=torch.bfloat16, device=device), randn(M, H, dtype=torch.bfloat16, device=device)
    weight = randn(H, dtype=torch.bfloat16, device=device)
    expected_out, expected_residual = rmsnorm_ref(x, weight, 1e-6, residual)
    out = poisoned((M, H), torch.bfloat16, device)
    module.launch(x, weight, out, 1e-6, residual, residual)
    assert torch.equal(residual, expected_residual)
    assert_matches(out, expected_out, "bf16")


def test_rmsnorm_without_residual(kernel_cache, device):
    module = build_triton_module(kernel_spec("rmsnorm", DTYPE="fp32", HAS_RESIDUAL=False,
                                             BLOCK_H=32), kernel_cache)
    x_wide = randn(4, 80, dtype=torch.float32, device=device)
    x = x_wide[:, :70]  # strided rows
    weight = randn(70, dtype=torch.float32, device=device)
    out = poisoned((4, 70), torch.float32, device)
    module.launch(x, weight, out, 1e-6)
    assert_matches(out, rmsnorm_ref(x, weight, 1e-6)[0], "fp32")
    with pytest.raises(ValueError, match="without a residual"):
        module.launch(x, weight, out, 1e-6, residual=x)


def _inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


@pytest.mark.parametrize("dtype,head_dim,cos_sin", [
    ("bf16", 12, "inv_freq"),   # half dim 6: not a power of two
    ("fp32", 16, "inv_freq"),
    ("bf16", 20, "table"),
    ("fp32", 8, "table"),
])
def test_rope_matches_reference(dtype, head_dim, cos_sin, kernel_cache, device):
    module = build_triton_module(kernel_spec("rope", DTYPE=dtype, HEAD_DIM=head_dim, COS_SIN=cos_sin),
                                 kernel_cache)
    tdt = TORCH_DTYPES[dtype]
    T, HQ, HK = 5, 6, 2
    q, k = randn(T, HQ, head_dim, dtype=tdt, device=device), randn(T, HK, head_dim, dtype=tdt, device=device)
    positions = torch.randint(0, 300, (T,), device=device)
    inv_freq = _inv_freq(head_dim).to(device)
    q_out, k_out = poisoned(q.shape, tdt, device), poisoned(k.shape, tdt, device)
    if cos_sin == "inv_freq":
        module.launch(q, k, positions, q_out, k_out, inv_freq=inv_freq, attention_scaling=0.9)
        cos, sin = rope_cos_sin(positions, inv_freq, tdt, attention_scaling=0.9)
    else:
        cos_table, sin_table = rope_cos_sin(torch.arange(300, device=device), inv_freq, tdt)
        module.launch(q, k, positions, q_out, k_out, cos=cos_table, sin=sin_table)
        cos, sin = cos_table[positions], sin_table[positions]
    if cos_sin == "table" and dtype != "fp32":
        # Same tables and HF's rounding steps: bit for bit. (In float32 a GPU may fuse a product
        # into the add, which torch does not, so there the last bit can differ.)
        assert torch.equal(q_out, rope_ref(q, cos, sin)) and torch.equal(k_out, rope_ref(k, cos, sin))
    elif dtype == "fp32":
        assert_matches(q_out, rope_ref(q, cos, sin), dtype)
        assert_matches(k_out, rope_ref(k, cos, sin), dtype)
    else:
        # cos/sin may differ from torch's in the last float32 bit, which can flip a rounding of
        # a product; the output is a difference of products, so the error scales with the inputs.
        atol = 2 ** -5 * max(q.abs().max().item(), k.abs().max().item())
        assert_matches(q_out, rope_ref(q, cos, sin), dtype, atol=atol)
        assert_matches(k_out, rope_ref(k, cos, sin), dtype, atol=atol)


def test_rope_in_place_on_strided_views(kernel_cache, device):
    # q and k as views into one fused qkv projection output [T, (HQ + 2 HK) * D].
    D, T, HQ, HK = 16, 3, 4, 2
    module = build_triton_module(kernel_spec("rope", DTYPE="fp32", HEAD_DIM=D), kernel_cache)
    qkv = randn(T, (HQ + 2 * HK) * D, dtype=torch.float32, device=device)
    q = qkv[:, :HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(T, HK, D)
    v_before = qkv[:, (HQ + HK) * D:].clone()
    positions = torch.tensor([7, 8, 9], device=device)
    inv_freq = _inv_freq(D).to(device)
    cos, sin = rope_cos_sin(positions, inv_freq, torch.float32)
    expected_q, expected_k = rope_ref(q, cos, sin), rope_ref(k, cos, sin)
    module.launch(q, k, positions, q, k, inv_freq=inv_freq)
    assert_matches(q, expected_q, "fp32")
    assert_matches(k, expected_k, "fp32")
    assert torch.equal(qkv[:, (HQ + HK) * D:], v_before)
