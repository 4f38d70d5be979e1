"""Graphed greedy AR (runtime/graphed_chain.py with chains of 0) and the static-buffer step of
runtime/cuda_graphs.py, run eagerly (capture=False) on CPU against `generate_ar` and the eager
forced AR, for two model families; capture itself is covered by tests/gpu."""
import pytest
import torch

from specpilot.runtime.mechanisms import force_ar_proposals
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import generate_ar
from specpilot.runtime import cuda_graphs
from specpilot.runtime.cuda_graphs import GraphedStep, GraphsUnavailable
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.errors import CapacityError
from specpilot.runtime.model import Transformer

from hf_factory import make_checkpoint, random_prompts
from torch_threads import single_thread_fixture


_one_thread = single_thread_fixture()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    return {family: Transformer.from_checkpoint(make_checkpoint(root, family, seed=31))
            for family in ("llama3", "mistral")}


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_static_loop_equals_generate_ar_with_per_request_eos(models, family):
    model = models[family]
    prompts = random_prompts((4, 11, 1, 7), seed=32)
    free = generate_ar(model, prompts, 14)
    # EOS ids that stop two requests early, at different steps.
    eos = [free.tokens[0][3], free.tokens[2][6]]
    want = generate_ar(model, prompts, 14, eos)
    assert [len(t) for t in want.tokens] != [14] * 4  # the EOS really cut something
    decoder = GraphedChainDecoder(model, None, 4, 32, 0, eos, capture=False, record_margins=True)
    got = decoder.generate_reference(prompts, 14)
    assert got.tokens == want.tokens
    for g, w in zip(got.margins, want.margins):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-5, atol=1e-5)
    # At most one step past the last EOS is run (the host reads tokens one step behind).
    assert want.target_forwards <= got.target_forwards <= want.target_forwards + 1


def test_one_decoder_serves_calls_with_fewer_prompts_than_its_batch(models):
    model = models["llama3"]
    decoder = GraphedChainDecoder(model, None, 3, 40, 0, capture=False)
    for seed, lengths in ((33, (5, 9, 2)), (34, (12,)), (35, (3, 8))):
        prompts = random_prompts(lengths, seed=seed)
        assert decoder.generate(prompts, 10).tokens == generate_ar(model, prompts, 10).tokens


def test_forced_run_proposes_what_eager_forced_ar_proposes(models):
    model, other = models["llama3"], models["mistral"]
    prompts = random_prompts((6, 3, 9), seed=36)
    # A reference from another model: the forced decoder disagrees often, yet keeps going.
    reference = generate_ar(other, prompts, 12)
    decoder = GraphedChainDecoder(model, None, 3, 30, 0, capture=False)
    forced = decoder.force(prompts, reference.tokens)
    assert forced == force_ar_proposals(model, prompts, reference.tokens)
    assert forced != reference.tokens
    own = generate_ar(model, prompts, 12)
    assert decoder.force(prompts, own.tokens) == own.tokens


def test_static_step_copies_new_inputs_and_matches_forward(models):
    model = models["mistral"]
    b, t, capacity = 2, 3, 24
    step_cache, eager_cache = model.new_cache(b, capacity), model.new_cache(b, capacity)
    step = GraphedStep(model, step_cache, width=t, logits_rows=2, capture=False)
    gen = torch.Generator().manual_seed(37)
    for start in (0, 3, 6):  # three consecutive chunks, so the cache carries history
        tokens = torch.randint(0, model.config.vocab_size, (b, t), generator=gen)
        slots = start + torch.arange(t)[None, :].expand(b, t)
        mask = torch.arange(capacity)[None, None, :] <= slots[:, :, None]
        rows = torch.tensor([[2, 0], [1, 2]])
        got = step(tokens, slots, slots, mask, rows).clone()
        want = model.forward(tokens, slots, slots, mask, eager_cache, rows)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(SpecPilotError, match="tokens has shape"):
        step(tokens[:, :2], slots, slots, mask, rows)


class _ReplayOnCpu:
    """Stands in for a captured CUDA graph on CPU: a replay reruns the body and writes into the
    tensor the capture returned, as a graph's replay rewrites its static output."""

    def __init__(self, body, out):
        self.body, self.out = body, out

    def replay(self):
        self.out.copy_(self.body())


def test_capture_path_builds_its_graph_through_capture_graph(models, monkeypatch):
    # The capture branch runs only on a GPU; here capture_graph is swapped for a CPU stand-in,
    # so a broken call into it (a wrong name or signature) fails on CPU too.
    calls = []

    def fake_capture_graph(body, device, pool=None):
        out = body()
        calls.append(pool)
        return _ReplayOnCpu(body, out), out

    monkeypatch.setattr(cuda_graphs, "require_cuda", lambda device: None)
    monkeypatch.setattr(cuda_graphs, "capture_graph", fake_capture_graph)
    model = models["llama3"]
    b, t, capacity = 2, 2, 16
    step = GraphedStep(model, model.new_cache(b, capacity), width=t, capture=True, pool="pool")
    assert calls == ["pool"] and step.graph is not None
    eager_cache = model.new_cache(b, capacity)
    gen = torch.Generator().manual_seed(41)
    for start in (0, 2):
        tokens = torch.randint(0, model.config.vocab_size, (b, t), generator=gen)
        slots = start + torch.arange(t)[None, :].expand(b, t)
        mask = torch.arange(capacity)[None, None, :] <= slots[:, :, None]
        got = step(tokens, slots, slots, mask).clone()
        want = model.forward(tokens, slots, slots, mask, eager_cache)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_capacity_and_batch_errors_name_the_fix(models):
    model = models["llama3"]
    decoder = GraphedChainDecoder(model, None, 2, 12, 0, capture=False)
    with pytest.raises(CapacityError, match="cache slots"):
        decoder.generate(random_prompts((8,), seed=38), 8)
    with pytest.raises(SpecPilotError, match="built for batch 2"):
        decoder.generate(random_prompts((2, 2, 2), seed=39), 3)
    with pytest.raises(SpecPilotError, match="non-empty"):
        decoder.force(random_prompts((2,), seed=40), [[]])
    with pytest.raises(SpecPilotError, match="non-empty"):
        decoder.force([], [])                    # nothing to force is refused, not a crash


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_capture_without_cuda_is_a_clear_error(models):
    model = models["llama3"]
    with pytest.raises(GraphsUnavailable, match="CUDA graphs need a CUDA GPU"):
        GraphedChainDecoder(model, None, 1, 16, 0)
    with pytest.raises(GraphsUnavailable, match="CUDA graphs need a CUDA GPU"):
        GraphedStep(model, model.new_cache(1, 8), 1)
