"""The "layers" fast path (SPECPILOT_FAST_OPS=layers: `Transformer.forward` as compiled blocks)
on a GPU, inside our own CUDA graphs: a captured step replays what the eager compiled forward
gives, graphed chain and tree decoding equal the same rounds run eagerly, the path is forced
clean against the reference-ops model, and capture recompiles nothing. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, random_prompts
from specpilot.runtime.cuda_graphs import GraphedStep
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.model import Transformer
from specpilot.runtime.torch_backend import TorchBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _layers_model(folder, dtype, seed=None):
    model = Transformer.from_checkpoint(folder, dtype, "cuda", backend=TorchBackend("layers"),
                                        fuse_projections=True)
    if seed is not None:   # a drafter that agrees often, not always
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for layer in model.layers:
            for name, (w, b) in list(layer.linears.items()):
                noise = torch.randn(w.shape, device="cuda", dtype=w.dtype, generator=gen)
                layer.linears[name] = (w + 0.2 * w.std() * noise, b)
    return model


@pytest.mark.parametrize("family", ["llama3", "mistral", "qwen3"])
def test_captured_step_replays_the_eager_compiled_forward(tmp_path, family):
    folder = make_checkpoint(tmp_path, family, seed=71)
    model = _layers_model(folder, "float32")
    cache = model.new_cache(3, 40)
    step = GraphedStep(model, cache, width=5)
    before = model._blocks.graphs()
    gen = torch.Generator(device="cuda").manual_seed(72)
    for _ in range(2):
        tokens = torch.randint(0, model.config.vocab_size, (3, 5), device="cuda", generator=gen)
        starts = torch.randint(5, 30, (3, 1), device="cuda", generator=gen)
        slots = starts + torch.arange(5, device="cuda")[None, :]
        mask = torch.arange(40, device="cuda")[None, None, :] <= slots[:, :, None]
        got = step(tokens, slots, slots, mask).clone()
        eager_cache = model.new_cache(3, 40)
        for a, b in zip(cache.k + cache.v, eager_cache.k + eager_cache.v):
            b.copy_(a)
        eager_cache.positions.copy_(cache.positions)
        want = model.forward(tokens, slots.clone(), slots, mask, eager_cache)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert model._blocks.graphs() == before   # replays and eager calls compiled nothing new


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_chain_and_tree_rounds_equal_eager_rounds(tmp_path, dtype):
    from specpilot.ir import Tree
    from specpilot.runtime.graphed_tree import GraphedTreeDecoder

    folder = make_checkpoint(tmp_path, "llama3", seed=73)
    target, drafter = _layers_model(folder, dtype), _layers_model(folder, dtype, seed=74)
    prompts = random_prompts((4, 11, 1, 7), seed=75)
    eager = GraphedChainDecoder(target, drafter, 4, 64, 4, capture=False).generate(prompts, 24)
    graphed = GraphedChainDecoder(target, drafter, 4, 64, 4).generate(prompts, 24)
    assert graphed.tokens == eager.tokens
    assert graphed.accepted_lengths == eager.accepted_lengths
    shape = Tree((3, 2, 1)).shape()
    eager = GraphedTreeDecoder(target, drafter, 4, 64, shape, capture=False).generate(prompts, 24)
    graphed = GraphedTreeDecoder(target, drafter, 4, 64, shape).generate(prompts, 24)
    assert graphed.tokens == eager.tokens
    for model in (target, drafter):
        assert max(model._blocks.graphs().values()) <= 6, model._blocks.graphs()
