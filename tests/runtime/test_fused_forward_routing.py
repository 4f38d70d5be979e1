"""runtime/fused_forward.py's routing by call size: a call of more than MAX_FUSED_TOKENS new
tokens (batch x width) runs the model's own forward, bit for bit, and launches no fused kernel;
a call within it runs the fused kernels (five launches a layer and the head's; what they compute
is test_fused_forward.py's to check)."""
import pytest
import torch

from specpilot.runtime import fused_forward
from specpilot.runtime.fused_forward import FusedForward
from specpilot.runtime.model import Transformer

from hf_factory import FUSABLE, kernel_device, make_checkpoint

DEVICE = kernel_device()
CAPACITY = 12


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("routing"), "llama3", seed=7, **FUSABLE)
    return Transformer.from_checkpoint(folder, device=DEVICE)


def _inputs(model, batch, width, seed):
    """A prefill of `width` tokens per row, row r starting at slot r, with a causal mask."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (batch, width), generator=g).to(DEVICE)
    pos = (torch.arange(batch)[:, None] + torch.arange(width)[None, :]).to(DEVICE)
    mask = torch.arange(CAPACITY, device=DEVICE)[None, None, :] <= pos[:, :, None]
    return tokens, pos, mask


def _count_launches(fused, monkeypatch):
    """Wrap every fused kernel module's launch with a counter: {role: calls}. Modules shared
    by two roles (the same spec) are wrapped once, under their first role."""
    counts, seen = {}, set()
    roles = fused.kernel_modules()
    for name in ("qkv", "attention", "o_proj", "mlp", "down", "head"):
        for module in roles[name]:      # the attention: one module a split count
            if id(module) in seen:
                continue
            seen.add(id(module))
            counts.setdefault(name, 0)
            _count(module, name, counts, monkeypatch)
    return counts


def _count(module, name, counts, monkeypatch):
    """Count `module`'s launches under `name`."""
    original = module.launch

    def counting(*args, **kwargs):
        counts[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "launch", counting)


def test_a_call_past_max_fused_tokens_runs_the_models_own_forward(model, monkeypatch):
    monkeypatch.setattr(fused_forward, "MAX_FUSED_TOKENS", 4)
    fused = FusedForward(model)
    counts = _count_launches(fused, monkeypatch)
    tokens, pos, mask = _inputs(model, 1, 5, seed=1)            # 5 tokens: one past 4
    cache, cache_ref = model.new_cache(1, CAPACITY), model.new_cache(1, CAPACITY)
    mine = fused.forward(tokens, pos, pos, mask, cache)
    theirs = model.forward(tokens, pos, pos, mask, cache_ref)
    assert mine.shape == (1, 5, model.config.vocab_size)
    assert torch.equal(mine, theirs)
    assert all(n == 0 for n in counts.values()), counts
    # The cache was written by the model's forward too: the same K/V and positions exactly.
    for a, b in zip(cache.k + cache.v, cache_ref.k + cache_ref.v):
        assert torch.equal(a, b)
    assert torch.equal(cache.positions, cache_ref.positions)
    # logits_at is passed through to the model's forward as well.
    picked = torch.tensor([[2]], device=DEVICE)
    mine = fused.forward(tokens, pos, pos, mask, model.new_cache(1, CAPACITY), picked)
    theirs = model.forward(tokens, pos, pos, mask, model.new_cache(1, CAPACITY), picked)
    assert mine.shape == (1, 1, model.config.vocab_size) and torch.equal(mine, theirs)
    assert all(n == 0 for n in counts.values()), counts


def test_a_call_within_max_fused_tokens_runs_the_fused_kernels(model, monkeypatch):
    monkeypatch.setattr(fused_forward, "MAX_FUSED_TOKENS", 4)
    fused = FusedForward(model)
    counts = _count_launches(fused, monkeypatch)
    tokens, pos, mask = _inputs(model, 2, 2, seed=2)            # 4 tokens: the limit itself
    mine = fused.forward(tokens, pos, pos, mask, model.new_cache(2, CAPACITY))
    # What it computes is test_fused_forward.py's to check: here, that the kernels ran.
    layers = model.config.num_layers
    assert counts["qkv"] == counts["attention"] == counts["mlp"] == layers, counts
    # o_proj and down_proj (one module where their specs agree): two a layer
    assert counts["o_proj"] + counts.get("down", 0) == 2 * layers, counts
    assert counts["head"] == 1, counts
    assert mine.shape == (2, 2, model.config.vocab_size)
