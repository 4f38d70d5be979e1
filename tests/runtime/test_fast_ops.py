"""The torch backend's CUDA fast path (runtime/fast_ops.py), its formulas run eagerly on CPU
against the reference ops in float64/float32; compiling them is covered by tests/gpu."""
import pytest
import torch

from specpilot.runtime.fast_ops import grouped_sdpa, rmsnorm_formula, rope_formula, silu_mul_formula
from specpilot.runtime.reference_ops import attention_ref, rmsnorm_ref, rope_ref


@pytest.mark.parametrize("h,hkv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("t", [1, 5])
def test_grouped_sdpa_equals_the_reference_attention(h, hkv, t):
    gen = torch.Generator().manual_seed(h * 10 + t)
    b, s, d = 3, 17, 16
    q = torch.randn(b, t, h, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, s, hkv, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, s, hkv, d, generator=gen, dtype=torch.float64)
    # Random visibility (a tree or a sliding window looks like this), own slot always visible.
    mask = torch.rand(b, t, s, generator=gen) < 0.6
    own = torch.randint(0, s, (b, t), generator=gen)
    mask[torch.arange(b)[:, None], torch.arange(t)[None, :], own] = True
    got = grouped_sdpa(q, k, v, mask, 0.25)
    want = attention_ref(q, k, v, mask, 0.25).reshape(b, t, h * d)
    # The reference computes in float32 whatever its inputs; the float64 SDPA is the exact one.
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-6)


def test_norm_rope_and_swiglu_formulas_equal_the_references():
    gen = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 3, 4, 32, generator=gen).to(dtype)
        w = (1 + 0.1 * torch.randn(32, generator=gen)).to(dtype)
        assert torch.equal(rmsnorm_formula(x, w, 1e-5), rmsnorm_ref(x, w, 1e-5)[0])
        cos, sin = torch.randn(2, 3, 32, generator=gen).to(dtype), torch.randn(2, 3, 32, generator=gen).to(dtype)
        want = rope_ref(x.reshape(6, 4, 32), cos.reshape(6, 32), sin.reshape(6, 32)).reshape(x.shape)
        assert torch.equal(rope_formula(x, cos, sin), want)
        gate, up = torch.randn(5, 9, generator=gen).to(dtype), torch.randn(5, 9, generator=gen).to(dtype)
        want = (gate.double() / (1 + torch.exp(-gate.double())) * up.double())
        torch.testing.assert_close(silu_mul_formula(gate, up).double(), want,
                                   rtol=1e-6 if dtype == torch.float32 else 2e-2, atol=1e-6)


def test_load_pair_takes_the_fast_path_on_cuda_with_the_torch_backend_only(tmp_path, monkeypatch):
    from specpilot.deploy import build_deployment
    from specpilot.ir import SetBackend, apply, stock_program
    from specpilot.runtime.decoder import cuda_fast_path, load_pair

    from hf_factory import make_checkpoint

    folder = make_checkpoint(tmp_path, "llama3", seed=5)
    program = stock_program(build_deployment(folder, folder, gpu="NVIDIA H200"))
    assert cuda_fast_path("cuda") and cuda_fast_path("cuda:0", program)
    assert not cuda_fast_path("cpu") and not cuda_fast_path("cpu", program)
    assert not cuda_fast_path("cuda", apply(program, SetBackend("generated")))
    # Asked for explicitly on the CPU (its compiled ops off), the loaded models are fused and
    # decode to the same tokens as the default load.
    monkeypatch.setenv("SPECPILOT_FAST_OPS", "0")
    fused = load_pair(folder, folder, "float32", "cpu", fast_path=True)
    plain = load_pair(folder, folder, "float32", "cpu")
    assert "self_attn.qkv_proj" in fused.target.layers[0].linears
    assert "self_attn.q_proj" in plain.target.layers[0].linears
    from specpilot.runtime.ar import generate_ar
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    assert generate_ar(fused.target, prompts, 8).tokens == generate_ar(plain.target, prompts, 8).tokens
