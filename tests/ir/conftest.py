"""Factories for small, hand-checkable ModelSpecs, Deployments and stock Programs."""
import pytest

from specpilot.ir import Deployment, ModelSpec, dense_weight_formats, stock_program


def _make_model(role="target", *, family="llama", dtype="bfloat16", num_layers=2, vocab_size=16,
                hidden_size=8, intermediate_size=12, num_heads=2, num_kv_heads=1, head_dim=4,
                qkv_bias=False, qk_norm=False, tie_embeddings=False, escape_ppm=(),
                checkpoint=None):
    return ModelSpec(
        role=role, family=family, checkpoint=checkpoint or f"/checkpoints/{role}", dtype=dtype,
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        qkv_bias=qkv_bias, qk_norm=qk_norm, tie_embeddings=tie_embeddings,
        layer_kinds=("attention",) * num_layers,
        weight_formats=dense_weight_formats(num_layers, dtype), lossless12_escape_ppm=escape_ppm)


def _make_deployment(target=None, drafter=None, gpu="cpu", workload="humaneval", **model_kw):
    target = target or _make_model("target", **model_kw)
    drafter = drafter or _make_model("drafter", **{**model_kw, "num_layers": 1})
    return Deployment(target=target, drafter=drafter, gpu=gpu, workload=workload)


@pytest.fixture
def make_model():
    """ModelSpec factory: a 2-layer llama (hidden 8, mlp 12, 2 heads / 1 kv head of dim 4,
    vocab 16) unless told otherwise."""
    return _make_model


@pytest.fixture
def make_deployment():
    """Deployment factory: a 2-layer target and 1-layer drafter of the same shape otherwise."""
    return _make_deployment


@pytest.fixture
def make_stock():
    """Stock Program factory taking the Deployment factory's arguments."""
    return lambda **kw: stock_program(_make_deployment(**kw))


@pytest.fixture
def stock():
    return stock_program(_make_deployment())
