"""The torch backend's CUDA fast path (runtime/fast_ops.py): the grouped SDPA attention against
the reference attention, and when load_pair takes the path; compiling is covered by tests/gpu."""
import pytest
import torch

from specpilot.runtime.fast_ops import grouped_sdpa
from specpilot.runtime.reference_ops import attention_ref


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


def test_a_per_op_function_serves_many_models_in_one_process():
    """One compiled op is shared by every model loaded: its graphs for each dtype, memory layout
    and size-1 specialisation (batch 1, one token) must not run into dynamo's recompile limit
    (a hard error with fullgraph). Traced with dynamo's eager backend, which guards and
    recompiles as Inductor's does, on CPU."""
    from specpilot.runtime.fast_ops import RECOMPILE_LIMIT, compiled
    from specpilot.runtime.reference_ops import rope_ref
    from specpilot.runtime.torch_backend import _rope

    rope = compiled(_rope, backend="eager")
    gen = torch.Generator().manual_seed(3)
    variants = 0
    for dtype in (torch.float32, torch.float64):
        for b in (1, 3):
            for t in (1, 4):
                for fused in (False, True):
                    heads, d = 4, 8
                    width = (heads + 4) * d if fused else heads * d
                    # A view into a fused q/k/v projection is strided, as in a layer.
                    qkv = torch.randn(b, t, width, generator=gen, dtype=dtype)
                    q = qkv[..., :heads * d].view(b, t, heads, d)
                    cos = torch.randn(b, t, d, generator=gen, dtype=dtype)
                    sin = torch.randn(b, t, d, generator=gen, dtype=dtype)
                    want = rope_ref(q.reshape(b * t, heads, d), cos.reshape(b * t, d),
                                    sin.reshape(b * t, d)).reshape(b, t, heads, d)
                    torch.testing.assert_close(rope(q, cos, sin), want)
                    variants += 1
    assert 8 < variants <= RECOMPILE_LIMIT
