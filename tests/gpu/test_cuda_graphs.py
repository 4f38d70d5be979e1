"""CUDA-graphed decode steps on a GPU: the graphed greedy AR must equal `generate_ar` token for
token, a replayed step must equal the eager forward, and a decoder built once must serve many
calls. Skipped on a machine without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, random_prompts
from specpilot.runtime.mechanisms import force_ar_proposals
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.cuda_graphs import GraphedStep
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs-gpu")
    return {family: make_checkpoint(root, family, seed=61) for family in ("llama3", "mistral", "qwen3")}


def _model(folders, family, dtype):
    return Transformer.from_checkpoint(folders[family], dtype, "cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama3", "mistral", "qwen3"])
def test_graphed_ar_equals_generate_ar(folders, family, dtype):
    model = _model(folders, family, dtype)
    prompts = random_prompts((4, 11, 1, 7), seed=62)
    free = generate_ar(model, prompts, 20)
    eos = [free.tokens[0][3], free.tokens[2][9]]
    want = generate_ar(model, prompts, 20, eos)
    got = GraphedChainDecoder(model, None, 4, 48, 0, eos,
                              record_margins=True).generate_reference(prompts, 20)
    assert got.tokens == want.tokens
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=2e-2, atol=5e-2)
    for g, w in zip(got.margins, want.margins):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), **tol)


def test_a_replayed_step_equals_the_eager_forward(folders):
    model = _model(folders, "mistral", "float32")
    b, t, capacity = 3, 4, 32
    step = GraphedStep(model, model.new_cache(b, capacity), width=t, logits_rows=2)
    assert step.graph is not None
    eager_cache = model.new_cache(b, capacity)
    gen = torch.Generator().manual_seed(63)
    previous = None
    for start in (0, 4, 8, 12):   # consecutive chunks: the graph's cache carries the history
        tokens = torch.randint(0, model.config.vocab_size, (b, t), generator=gen).cuda()
        slots = (start + torch.arange(t)).cuda()[None, :].expand(b, t)
        mask = torch.arange(capacity, device="cuda")[None, None, :] <= slots[:, :, None]
        rows = torch.tensor([[3, 0], [1, 2], [2, 2]], device="cuda")
        got = step(tokens, slots, slots, mask, rows).clone()
        want = model.forward(tokens, slots, slots, mask, eager_cache, rows)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if previous is not None:
            assert not torch.equal(got, previous)  # the replay saw the new inputs
        previous = got


def test_one_captured_decoder_serves_many_calls_and_forced_runs(folders):
    model = _model(folders, "llama3", "bfloat16")
    decoder = GraphedChainDecoder(model, None, 4, 64, 0)
    for seed, lengths in ((64, (5, 9, 2, 13)), (65, (12,)), (66, (3, 8, 1))):
        prompts = random_prompts(lengths, seed=seed)
        assert decoder.generate(prompts, 16).tokens == generate_ar(model, prompts, 16).tokens
    other = _model(folders, "qwen3", "bfloat16")
    prompts = random_prompts((6, 3, 9), seed=67)
    reference = generate_ar(other, prompts, 12)
    forced = decoder.force(prompts, reference.tokens)
    assert forced == force_ar_proposals(model, prompts, reference.tokens)


def test_a_kernel_replayed_from_a_graph_costs_less_than_an_eager_launch():
    from specpilot.cost import measure_device

    measured = measure_device("cuda", repeats=3)
    assert 0 < measured.graphed_launch_s < measured.launch_overhead_s


def test_host_data_reaches_the_device_in_stream_order_without_a_wait():
    from specpilot.runtime.cuda_graphs import to_device

    busy = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):                      # queue work, then copy behind it
        busy = busy @ busy / 2048 ** 0.5
    values = [torch.randint(0, 1000, (5, 7)) for _ in range(20)]
    got = [to_device(v, "cuda") for v in values]   # each from its own page-locked block
    for v, g in zip(values, got):
        assert g.device.type == "cuda" and torch.equal(g.cpu(), v)


def test_a_graph_freed_by_the_garbage_collector_during_a_capture_does_not_break_it():
    """A dead reference cycle holding a captured graph (as a decoder for another batch size can
    be) must not be collected while another capture runs: destroying a graph is forbidden
    during a capture. The captured body here drops such a cycle and then allocates enough to
    start the collector, which is what happens when a decoder is replaced between batch sizes."""
    import gc

    from specpilot.runtime.cuda_graphs import WARMUP_RUNS, capture_graph

    x = torch.randn(64, device="cuda")
    held = [capture_graph(lambda: x * 3, "cuda")[0]]
    calls = []

    class Cycle:
        pass

    def body():
        calls.append(1)
        if len(calls) == WARMUP_RUNS + 1 and held:      # the captured run
            dead = Cycle()
            dead.graph, dead.me = held.pop(), dead       # now reachable only from itself
            del dead
            junk = []
            for i in range(5 * gc.get_threshold()[0]):        # starts a collection
                junk.append([i])
        return x * 2

    graph, out = capture_graph(body, "cuda")
    x.copy_(torch.randn(64, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2)
    assert gc.isenabled()
