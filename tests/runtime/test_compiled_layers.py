"""The "layers" fast path (SPECPILOT_FAST_OPS=layers): `Transformer.forward` as compiled blocks
(runtime/model.py, runtime/fast_ops.py) against the reference-ops model in float32, on the CPU
(Inductor compiles C++ here): logits and the K/V written for every kind of forward a decoder
runs, greedy decode tokens, no recompiles once each shape class has compiled, and the switch."""
import pytest
import torch

from specpilot.runtime.ar import generate_ar
from specpilot.runtime.fast_ops import LAYERS, OFF, OPS, fast_ops_mode
from specpilot.runtime.model import Transformer, compiles_layers
from specpilot.runtime.torch_backend import TorchBackend

from forward_cases import compare_forwards
from hf_factory import make_checkpoint, random_prompts
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()

# Biases on every projection and tied embeddings: the parts a compiled block could drop.
LLAMA = dict(hidden_size=64, intermediate_size=128, attention_bias=True, mlp_bias=True,
             tie_word_embeddings=True)
# q/k norm, head_dim 12 and a window of 4 on layer 1 only (one windowed, one full layer).
QWEN3_WINDOWED = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)


def _models(folder, fuse=True):
    ref = Transformer.from_checkpoint(folder, "float32")
    fast = Transformer.from_checkpoint(folder, "float32", backend=TorchBackend(fast_ops=LAYERS),
                                       fuse_projections=fuse)
    assert compiles_layers(fast.backend) and not compiles_layers(ref.backend)
    return ref, fast


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _models(make_checkpoint(tmp_path_factory.mktemp("llama"), "llama3", seed=21, **LLAMA))


def _inputs(model, starts, width, seed):
    """Random tokens appended causally after each row's `starts[b]` committed tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (len(starts), width), generator=gen)
    slots = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
    mask = torch.arange(40)[None, None, :] <= slots[:, :, None]
    return tokens, slots, mask


def test_ar_step_and_chain_verification_match_the_reference(llama):
    ref, fast = llama
    tokens, slots, mask = _inputs(ref, [17], 1, seed=1)
    compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=1)
    # Chain verification of k + 1 = 5 tokens, the mask as the graphed chain builds it.
    tokens, slots, mask = _inputs(ref, [11], 5, seed=2)
    compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=2)


def test_tree_verification_with_a_tree_mask_matches_the_reference(llama):
    ref, fast = llama
    # Root at slot 9 (position 9), node i at slot 10 + i; parents (root, root, 0, 0, 2).
    parents = [-1, -1, 0, 0, 2]
    depth, seen = [], []
    for i, p in enumerate(parents):
        depth.append(1 if p < 0 else depth[p] + 1)
        seen.append({i} | (set() if p < 0 else seen[p]))
    mask = (torch.arange(40) <= 9).expand(1, 6, 40).clone()    # the committed tokens and root
    for i, nodes in enumerate(seen):
        mask[0, 1 + i, [10 + n for n in nodes]] = True
    slots = torch.arange(9, 15)[None, :]
    positions = 9 + torch.tensor([[0] + depth])
    tokens = torch.randint(0, ref.config.vocab_size, (1, 6),
                           generator=torch.Generator().manual_seed(3))
    compare_forwards(ref, fast, tokens, positions, slots, mask, seed=3)


def test_batched_steps_at_different_positions_match_the_reference(llama):
    ref, fast = llama
    tokens, slots, mask = _inputs(ref, [5, 23, 12], 1, seed=4)
    compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=4)
    tokens, slots, mask = _inputs(ref, [5, 23, 12], 4, seed=5)
    compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=5)
    # Logits at picked rows (what a prefill asks for), positions passed as the slots tensor.
    picks = torch.tensor([[3], [0], [2]])
    compare_forwards(ref, fast, tokens, slots, slots, mask, logits_at=picks, seed=6)


def test_prefill_and_greedy_decode_give_the_reference_tokens(llama):
    ref, fast = llama
    prompts = random_prompts((13, 6), seed=7)
    want = generate_ar(ref, prompts, 10)
    got = generate_ar(fast, prompts, 10)
    assert got.tokens == want.tokens
    torch.testing.assert_close(torch.tensor(got.margins), torch.tensor(want.margins),
                               rtol=1e-4, atol=1e-4)


def test_new_batch_token_and_cache_sizes_reuse_the_compiled_graphs(llama):
    ref, fast = llama
    for starts, width in (([17], 1), ([11], 5), ([5, 23, 12], 1), ([5, 23, 12], 4)):
        tokens, slots, mask = _inputs(ref, starts, width, seed=8)
        compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=8)
    before = fast._blocks.graphs()
    # Other widths (a prefill bucket, another chain length), batches and cache capacities.
    for starts, width, capacity in (([3], 9, 40), ([2, 30], 1, 33), ([1, 2, 3, 4, 5], 7, 57),
                                    ([20, 1], 3, 40), ([0], 1, 21)):
        tokens, slots, _ = _inputs(ref, starts, width, seed=9)
        mask = torch.arange(capacity)[None, None, :] <= slots[:, :, None]
        compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, capacity=capacity, seed=9)
    assert fast._blocks.graphs() == before
    layer_graphs = [n for name, n in before.items() if name.startswith("decoder_layer")]
    # One graph per shape class at most: batch 1 or more, tokens 1 or more.
    assert layer_graphs and max(layer_graphs) <= 4, before


def test_windowed_qk_norm_unfused_model_matches_the_reference(tmp_path):
    folder = make_checkpoint(tmp_path, "qwen3", seed=22, **QWEN3_WINDOWED)
    ref, fast = _models(folder, fuse=False)
    assert ref.config.window_of(1) == 4 and ref.config.window_of(0) is None and ref.config.qk_norm
    assert "self_attn.q_proj" in fast.layers[0].linears
    # Rows far enough in that the window hides most of the cache: a verification and a step.
    tokens, slots, mask = _inputs(ref, [14, 30], 5, seed=10)
    compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=10)
    tokens, slots, mask = _inputs(ref, [19, 33], 1, seed=11)
    compare_forwards(ref, fast, tokens, slots.clone(), slots, mask, seed=11)


def test_a_backend_wrapper_runs_the_ops_one_by_one(llama):
    """A wrapper replacing one op (as the ragged runtime's varlen attention does) must see every
    op call, so the model does not compile blocks under it."""
    ref, fast = llama

    class CountingAttention:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def attention(self, *args):
            self.calls += 1
            return self.inner.attention(*args)

    import copy
    wrapped = copy.copy(fast)
    wrapped.backend = CountingAttention(fast.backend)
    assert not compiles_layers(wrapped.backend)
    tokens, slots, mask = _inputs(ref, [7], 3, seed=12)
    compare_forwards(ref, wrapped, tokens, slots.clone(), slots, mask, seed=12)
    assert wrapped.backend.calls == ref.config.num_layers


@pytest.mark.parametrize("value,mode", [(None, OPS), ("1", OPS), ("0", OFF), ("layers", LAYERS),
                                        (" Layers ", LAYERS)])
def test_the_environment_switch_selects_the_mode_load_pair_builds(tmp_path, monkeypatch, value,
                                                                   mode):
    from specpilot.runtime.decoder import load_pair

    if value is None:
        monkeypatch.delenv("SPECPILOT_FAST_OPS", raising=False)
    else:
        monkeypatch.setenv("SPECPILOT_FAST_OPS", value)
    assert fast_ops_mode() == mode
    folder = make_checkpoint(tmp_path, "llama3", seed=23)
    pair = load_pair(folder, folder, "float32", "cpu", fast_path=True)
    for model in (pair.target, pair.drafter):
        assert model.backend.fast_ops_mode == mode
        assert compiles_layers(model.backend) == (mode == LAYERS)
        assert "self_attn.qkv_proj" in model.layers[0].linears
    # Off the fast path (the CPU default) the mode does not matter: reference ops, unfused.
    plain = load_pair(folder, None, "float32", "cpu")
    assert plain.target.backend.fast_ops_mode == OFF
    assert "self_attn.q_proj" in plain.target.layers[0].linears


def test_torch_backend_refuses_an_unknown_mode():
    from specpilot.ir.errors import SpecPilotError

    with pytest.raises(SpecPilotError, match="'layers'"):
        TorchBackend(fast_ops="layer")


def test_where_blocks_cannot_compile_layers_falls_back_to_the_per_op_path(monkeypatch):
    import specpilot.runtime.fast_ops as fast_ops

    monkeypatch.setattr(fast_ops, "compile_refusal", lambda: "no compiler in this test")
    with pytest.warns(UserWarning, match="per-op fast path: no compiler in this test"):
        backend = TorchBackend(fast_ops=LAYERS)
    assert backend.fast_ops_mode == OPS and backend.fast_ops and not compiles_layers(backend)

