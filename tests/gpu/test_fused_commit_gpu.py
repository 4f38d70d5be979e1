"""The round's end in one generated kernel (accept_kernels "fused") with the rounds captured as
CUDA graphs: the same output, acceptance and rounds as the torch-ops round end, for refill
(plain, chain, adaptive lengths with either estimate) and a padded chain (fixed and adaptive),
in float32, and forcing clean. With adaptive lengths the fused round end updates the length in
the length_policy kernel and the ops round end in the compiled torch update: the same lengths
round by round. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, random_prompts
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("cls,k,adaptive", [(GraphedRefillDecoder, 0, False),
                                            (GraphedRefillDecoder, 3, False),
                                            (GraphedRefillDecoder, 4, True),
                                            (GraphedRefillDecoder, 4, "per_depth"),
                                            (GraphedChainDecoder, 4, True),
                                            (GraphedChainDecoder, 3, False)])
def test_captured_fused_commit_equals_the_ops_commit(tmp_path, cls, k, adaptive):
    folder = make_checkpoint(tmp_path, "llama3", seed=95)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    drafter = Transformer.from_checkpoint(folder, "float32", "cuda") if k else None
    prompts = random_prompts((4, 11, 1, 7, 9, 2, 5), seed=96)
    eos = (generate_ar(target, prompts, 20).tokens[1][6],)
    if cls is GraphedChainDecoder:            # one padded batch of three
        prompts = prompts[:3]
    reference = generate_ar(target, prompts, 20, eos_ids=eos)
    options = dict(adaptive=True, round_costs=[1.0, 1.3, 1.6, 1.9, 2.2]) if adaptive else {}
    if adaptive == "per_depth":     # the other estimate, with the throughput drain
        options.update(length_estimator="per_depth", length_drain="throughput")
    runs = {}
    for kernels in ("ops", "fused"):
        dec = cls(target, drafter, 3, 64, k, eos, capture=True, accept_kernels=kernels,
                  **options)
        runs[kernels] = [dec.generate(prompts, 20) for _ in range(2)]   # calls reuse graphs
    for got, want in zip(runs["fused"], runs["ops"]):
        assert got.tokens == want.tokens == reference.tokens
        assert got.accepted_lengths == want.accepted_lengths
        assert got.stats == want.stats
    fused = cls(target, drafter, 3, 64, k, eos, capture=True, accept_kernels="fused", **options)
    report = compare_to_reference(fused.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert report.passed, report.format()
