"""Continuous refill on the graphed runtime with its rounds captured as CUDA graphs: the same
output and acceptance as the rounds run eagerly (float32), and forcing clean, for plain steps
and for a chain, with more requests than slots. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, random_prompts
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("mode", ["ops", "layers"])
def test_captured_refill_equals_eager_refill_and_passes_forcing(tmp_path, k, mode, monkeypatch):
    monkeypatch.setenv("SPECPILOT_FAST_OPS", mode)
    folder = make_checkpoint(tmp_path, "llama3", seed=91)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    drafter = Transformer.from_checkpoint(folder, "float32", "cuda") if k else None
    prompts = random_prompts((4, 11, 1, 7, 9, 2, 5), seed=92)
    limits_cut = generate_ar(target, prompts, 20)
    eos = (limits_cut.tokens[1][6],)          # a token some requests stop at, others not
    reference = generate_ar(target, prompts, 20, eos_ids=eos)
    eager = GraphedRefillDecoder(target, drafter, 3, 64, k, eos, capture=False)
    want = eager.generate(prompts, 20)
    graphed = GraphedRefillDecoder(target, drafter, 3, 64, k, eos, capture=True)
    for _ in range(2):                        # a decoder serves many calls
        got = graphed.generate(prompts, 20)
        assert got.tokens == want.tokens
        assert got.accepted_lengths == want.accepted_lengths
        assert got.stats["refills"] == len(prompts) - 3
    report = compare_to_reference(graphed.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert report.passed, report.format()
