"""The fused layer kernels with programmatic dependent launch (runtime/fused_forward.py, PDL on
Hopper) captured in CUDA graphs: each kernel may start while the one before it runs and waits
in-kernel for its writes, so a missing or misplaced wait would read stale activations or cache
entries. Replayed over fresh inputs, the PDL forward must equal the plain one bit for bit, in
narrow (16-row) and wide tiles, its cache writes too. Skipped without a Hopper GPU."""
import pytest
import torch

from hf_factory import make_checkpoint
from specpilot.runtime.fused_forward import FusedForward, pdl_available
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and pdl_available(torch.device("cuda"))),
                       reason="needs a CUDA GPU of compute capability 9 or more"),
]

SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
             num_hidden_layers=3)
CAPACITY = 96


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("fused-pdl"), "llama3", seed=61, **SHAPE)
    return Transformer.from_checkpoint(folder, "bfloat16", "cuda")


def _fill(inputs, batch, width, generator, vocab):
    """Fresh tokens, per-row start positions and the causal mask over the cache, in place."""
    tokens, pos, mask = inputs
    tokens.copy_(torch.randint(0, vocab, (batch, width), generator=generator))
    start = torch.randint(0, CAPACITY - width, (batch, 1), generator=generator)
    pos.copy_(start + torch.arange(width)[None, :])
    mask.copy_(torch.arange(CAPACITY)[None, None, :] <= pos.cpu()[:, :, None])


@pytest.mark.parametrize("batch,width", [(16, 1), (16, 5), (4, 9)])
def test_captured_pdl_forward_equals_the_plain_one_bit_for_bit(model, batch, width):
    vocab = model.config.vocab_size
    runs = {}
    for pdl in (False, True):
        fused = FusedForward(model, pdl=pdl)
        assert fused.narrow.qkv._PDL == pdl and fused.wide.mlp._PDL == pdl
        inputs = (torch.zeros((batch, width), dtype=torch.int64, device="cuda"),
                  torch.zeros((batch, width), dtype=torch.int64, device="cuda"),
                  torch.zeros((batch, width, CAPACITY), dtype=torch.bool, device="cuda"))
        cache = model.new_cache(batch, CAPACITY)
        _fill(inputs, batch, width, torch.Generator().manual_seed(0), vocab)
        tokens, pos, mask = inputs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fused.forward(tokens, pos, pos, mask, cache)            # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = fused.forward(tokens, pos, pos, mask, cache)
        runs[pdl] = (graph, inputs, cache, logits)
    g = {pdl: torch.Generator().manual_seed(7) for pdl in runs}
    for _ in range(6):
        outs = {}
        for pdl, (graph, inputs, cache, logits) in runs.items():
            _fill(inputs, batch, width, g[pdl], vocab)
            graph.replay()
            outs[pdl] = (logits.clone(), [t.clone() for t in cache.k + cache.v])
        torch.cuda.synchronize()
        assert torch.isfinite(outs[False][0]).all() and outs[False][0].abs().max() > 0
        assert torch.equal(outs[True][0], outs[False][0])
        for a, b in zip(outs[True][1], outs[False][1]):
            assert torch.equal(a, b)
