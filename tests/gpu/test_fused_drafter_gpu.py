"""The drafter in fused layer kernels (runtime/fused_forward.py) on the GPU, its kernels
compiled natively and captured in the decoders' CUDA graphs: the same drafts and output as the
model's own drafter (float32), and a Program with kernels.drafter_kernels
"fused" graphed with adaptive lengths and refill, forcing clean. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, noisy_checkpoint, random_prompts
from specpilot.deploy import build_deployment
from specpilot.ir import (CaptureGraphs, SetDrafterKernels, SetDraftLengthPolicy, SetMaxBatchSize,
                          SetRefill, replay, stock_program)
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.decoder import load_pair
from specpilot.runtime.fused_forward import FusedForward
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_program import force_graphed, release_decoders, run_graphed
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# head_dim 32: the fused kernels' tensor-core path.
SHAPE = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192)
NEW = 24


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fused-drafter-gpu")
    target = make_checkpoint(folder, "llama3", name="target", seed=41, **SHAPE)
    return target, noisy_checkpoint(target, "drafter", noise=0.1, seed=42)


@pytest.mark.parametrize("decoder_class", [GraphedChainDecoder, GraphedRefillDecoder])
@pytest.mark.parametrize("adaptive,fold", [(False, False), (True, False), (False, True),
                                           (True, True)])
def test_captured_rounds_with_a_fused_drafter_draft_as_the_model_does(pair_dirs, decoder_class,
                                                                      adaptive, fold):
    """Unfolded and folded (o_proj and down_proj added atomically into a float32 stream, its
    sums zeroed by a fill in the graph): in float32 the drafts of the model's own drafter."""
    target = Transformer.from_checkpoint(pair_dirs[0], "float32", "cuda")
    drafter = Transformer.from_checkpoint(pair_dirs[1], "float32", "cuda")
    prompts = random_prompts((4, 11, 1, 7, 9, 2), seed=43)
    eos = (generate_ar(target, prompts, NEW).tokens[1][5],)
    reference = generate_ar(target, prompts, NEW, eos_ids=eos)
    costs = [1.0, 1.3, 1.6, 1.9] if adaptive else None     # fixed prices: both decide alike

    def decoder(d):
        return decoder_class(target, d, 3 if decoder_class is GraphedRefillDecoder else 6, 64, 3,
                             eos, capture=True, adaptive=adaptive, round_costs=costs)
    plain, fused = decoder(drafter), decoder(FusedForward(drafter, fold=fold))
    for _ in range(2):                        # a decoder serves many calls
        want, got = plain.generate(prompts, NEW), fused.generate(prompts, NEW)
        assert got.tokens == want.tokens == reference.tokens
        assert got.accepted_lengths == want.accepted_lengths
        assert sum(map(sum, got.accepted_lengths)) > 0


def test_a_program_with_fused_drafter_kernels_runs_graphed_and_forcing_clean(pair_dirs):
    stock = replay(stock_program(build_deployment(*pair_dirs, dtype="float32")),
                   [SetMaxBatchSize(3)])
    program = replay(stock, [CaptureGraphs(True), SetDraftLengthPolicy("per_request_adaptive", 12),
                             SetRefill("continuous"), SetDrafterKernels("fused")])
    pair = load_pair(*pair_dirs, "float32", "cuda", program=program)
    assert isinstance(pair.drafter, FusedForward)
    prompts = random_prompts((5, 11, 2, 8, 6), seed=44)
    reference = generate_ar(pair.target, prompts, NEW)
    release_decoders()
    r = run_graphed(program, pair, prompts, NEW)
    assert r.tokens == reference.tokens
    report = force_graphed(program, pair, prompts, reference)
    assert report.passed and not report.violations, report.format()
