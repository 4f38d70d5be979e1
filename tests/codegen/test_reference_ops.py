"""runtime.reference_ops against independent references: HF transformers' Llama modules, float64
computations, and hand-checked cases. The kernel tests then compare kernels to these."""
import math
import types

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as hf

from specpilot.runtime import reference_ops as ref


def test_linear_ref_is_float64_matmul_rounded_once():
    x, w, b = torch.randn(3, 70), torch.randn(9, 70), torch.randn(9)
    exact = (x.double() @ w.double().T + b.double())
    torch.testing.assert_close(ref.linear_ref(x, w, b).double(), exact, rtol=1e-6, atol=1e-5)
    xb, wb = x.bfloat16(), w.bfloat16()
    exact_b = (xb.double() @ wb.double().T).bfloat16()
    got = ref.linear_ref(xb, wb)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - exact_b.float()).abs() <= exact_b.float().abs() * 2 ** -8 + 1e-6).all()


def test_gate_up_silu_ref_matches_hf_llama_mlp():
    cfg = LlamaConfig(hidden_size=24, intermediate_size=10, num_attention_heads=4, hidden_act="silu")
    mlp = hf.LlamaMLP(cfg).double()
    x = torch.randn(4, 24)
    got = ref.gate_up_silu_ref(x, mlp.gate_proj.weight.float(), mlp.up_proj.weight.float())
    # HF's forward is down_proj(silu(gate_proj(x)) * up_proj(x)); finish ours with its down_proj.
    with torch.no_grad():
        torch.testing.assert_close(mlp.down_proj(got.double()), mlp(x.double()), rtol=1e-5, atol=1e-6)


def test_rmsnorm_ref_is_bit_identical_to_hf_after_the_residual_add():
    norm = hf.LlamaRMSNorm(48, eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x, residual = torch.randn(5, 48).bfloat16(), torch.randn(5, 48).bfloat16()
    hidden = residual + x  # what HF's decoder layer does before post_attention_layernorm
    out, new_residual = ref.rmsnorm_ref(x, norm.weight, 1e-5, residual)
    assert torch.equal(new_residual, hidden)
    assert torch.equal(out, norm(hidden))
    out_plain, none = ref.rmsnorm_ref(x, norm.weight, 1e-5)
    assert none is None and torch.equal(out_plain, norm(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_ref_is_bit_identical_to_hf(dtype):
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096)
    rotary = hf.LlamaRotaryEmbedding(cfg)
    T, D = 6, 16
    positions = torch.tensor([[0, 1, 5, 77, 1000, 4000]])
    q = torch.randn(1, 4, T, D).to(dtype)
    k = torch.randn(1, 2, T, D).to(dtype)
    cos, sin = rotary(q, positions)
    q_hf, k_hf = hf.apply_rotary_pos_emb(q, k, cos, sin)
    my_cos, my_sin = ref.rope_cos_sin(positions[0], rotary.inv_freq, dtype, rotary.attention_scaling)
    assert torch.equal(my_cos, cos[0]) and torch.equal(my_sin, sin[0])
    assert torch.equal(ref.rope_ref(q[0].transpose(0, 1), my_cos, my_sin), q_hf[0].transpose(0, 1))
    assert torch.equal(ref.rope_ref(k[0].transpose(0, 1), my_cos, my_sin), k_hf[0].transpose(0, 1))


def test_attention_ref_matches_hf_eager_attention_in_float64():
    B, T, HQ, HKV, D, S = 2, 3, 6, 2, 8, 11
    q = torch.randn(B, T, HQ, D, dtype=torch.float64)
    k_cache, v_cache = torch.randn(B, S, HKV, D, dtype=torch.float64), torch.randn(B, S, HKV, D, dtype=torch.float64)
    mask = torch.rand(B, T, S) < 0.5
    mask[..., 0] = True  # every query sees something (HF would give NaN otherwise)
    module = types.SimpleNamespace(num_key_value_groups=HQ // HKV, training=False)
    additive = torch.zeros(B, 1, T, S, dtype=torch.float64).masked_fill(~mask[:, None], float("-inf"))
    expected, _ = hf.eager_attention_forward(module, q.transpose(1, 2), k_cache.transpose(1, 2),
                                             v_cache.transpose(1, 2), additive, scaling=1 / math.sqrt(D))
    got = ref.attention_ref(q, k_cache, v_cache, mask)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_attention_ref_hand_checked_kv_len_and_empty_rows():
    # One head, D=1: with all scores equal, attention is the mean of the visible values.
    q = torch.ones(1, 2, 1, 1)
    k_cache = torch.zeros(1, 4, 1, 1)
    v_cache = torch.tensor([1.0, 2.0, 4.0, 8.0]).view(1, 4, 1, 1)
    mask = torch.tensor([[[True, True, True, True], [False, False, False, True]]])
    out = ref.attention_ref(q, k_cache, v_cache, mask, kv_len=torch.tensor([3]))
    # Slot 3 is past kv_len, so the second query sees nothing.
    torch.testing.assert_close(out.flatten(), torch.tensor([7.0 / 3.0, 0.0]), rtol=1e-6, atol=0)


def test_greedy_accept_ref_hand_checked_chain_and_tree():
    V = 5
    def logits_for(preds):
        return torch.nn.functional.one_hot(torch.tensor(preds), V).float()[None]
    # Chain of 3: target predicts 2 after the root, 4 after node 0, 1 after node 1, 3 after node 2.
    pred, count, path, bonus = ref.greedy_accept_ref(logits_for([2, 4, 1, 3]), torch.tensor([[2, 4, 0]]),
                                                     torch.tensor([-1, 0, 1]))
    assert pred.tolist() == [[2, 4, 1, 3]]
    assert count.tolist() == [2] and path.tolist() == [[0, 1, -1]] and bonus.tolist() == [1]
    # Tree: root children 0 (token 3) and 1 (token 2); node 1's children 2 (token 0), 3 (token 4).
    pred, count, path, bonus = ref.greedy_accept_ref(logits_for([2, 0, 4, 0, 1]), torch.tensor([[3, 2, 0, 4]]),
                                                     torch.tensor([-1, -1, 1, 1]))
    assert count.tolist() == [2] and path.tolist() == [[1, 3, -1, -1]] and bonus.tolist() == [1]
    with pytest.raises(ValueError, match="parents"):
        ref.greedy_accept_ref(logits_for([2, 0, 4]), torch.tensor([[3, 2]]), torch.tensor([1, -1]))


def test_kv_compact_ref_hand_checked():
    cache = torch.arange(8.0).view(1, 8, 1, 1)
    out = ref.kv_compact_ref(cache, torch.tensor([[5, 7]]), torch.tensor([4]), torch.tensor([2]))
    assert out.flatten().tolist() == [0, 1, 2, 3, 5, 7, 6, 7]
    assert cache.flatten().tolist() == list(range(8))  # the input is not modified
