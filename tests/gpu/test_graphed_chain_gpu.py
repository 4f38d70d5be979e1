"""The graphed chain decoder captured as CUDA graphs: replayed rounds must give what the same
rounds run eagerly give, and greedy AR's output up to tolerated near-ties. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, random_prompts
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _noisy_drafter(folder, dtype, seed):
    """The checkpoint's model with noise on every linear: a drafter that agrees often, not always."""
    drafter = Transformer.from_checkpoint(folder, dtype, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for layer in drafter.layers:
        for name, (w, b) in list(layer.linears.items()):
            layer.linears[name] = (w + 0.2 * w.std() * torch.randn(w.shape, device="cuda",
                                                                  dtype=w.dtype, generator=gen), b)
    return drafter


def _noisy_pair(tmp_path, seed, dtype, **target_options):
    """(target, its noisy drafter, four prompts of mixed lengths) on the GPU: a checkpoint of
    `seed`, the drafter's noise from seed + 1, the prompts from seed + 2."""
    folder = make_checkpoint(tmp_path, "llama3", seed=seed)
    target = Transformer.from_checkpoint(folder, dtype, "cuda", **target_options)
    return (target, _noisy_drafter(folder, dtype, seed + 1),
            random_prompts((4, 11, 1, 7), seed=seed + 2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fused", [False, True])
def test_captured_rounds_equal_eager_rounds_and_pass_forcing(tmp_path, dtype, fused):
    target, drafter, prompts = _noisy_pair(tmp_path, 81, dtype, fuse_projections=fused)
    reference = generate_ar(target, prompts, 24)
    eager = GraphedChainDecoder(target, drafter, 4, 64, 4, capture=False).generate(prompts, 24)
    graphed_decoder = GraphedChainDecoder(target, drafter, 4, 64, 4, capture=True)
    for _ in range(2):   # a decoder serves many calls
        graphed = graphed_decoder.generate(prompts, 24)
        assert graphed.tokens == eager.tokens
        assert graphed.accepted_lengths == eager.accepted_lengths
    assert graphed.mean_accepted > 1.0
    proposals = graphed_decoder.force(prompts, reference.tokens)
    report = compare_to_reference(proposals, reference, default_tolerance(getattr(torch, dtype)))
    assert report.passed, report.format()


@pytest.mark.parametrize("family", ["llama3", "mistral", "qwen3"])
@pytest.mark.parametrize("mode", ["ops", "layers"])
def test_fast_ops_model_is_forced_clean_against_the_reference_ops_model(tmp_path, family, mode):
    """Both fast paths (per op, and whole compiled layers) against the reference ops."""
    from specpilot.runtime.mechanisms import force_ar_proposals
    from specpilot.runtime.torch_backend import TorchBackend

    folder = make_checkpoint(tmp_path, family, seed=84)
    ref = Transformer.from_checkpoint(folder, "bfloat16", "cuda")
    fast = Transformer.from_checkpoint(folder, "bfloat16", "cuda",
                                       backend=TorchBackend(fast_ops=mode), fuse_projections=True)
    prompts = random_prompts((4, 11, 1, 7), seed=85)
    want = generate_ar(ref, prompts, 24)
    report = compare_to_reference(force_ar_proposals(fast, prompts, want.tokens), want,
                                  default_tolerance(torch.bfloat16))
    assert report.passed, report.format()
    graphed = GraphedChainDecoder(fast, None, 4, 64, 0).generate(prompts, 24)
    assert graphed.tokens == generate_ar(fast, prompts, 24).tokens


def test_captured_plain_greedy_rounds_give_the_reference_and_its_margins(tmp_path):
    folder = make_checkpoint(tmp_path, "llama3", seed=86)
    model = Transformer.from_checkpoint(folder, "float32", "cuda")
    prompts = random_prompts((4, 11, 1, 7), seed=87)
    want = generate_ar(model, prompts, 24)
    decoder = GraphedChainDecoder(model, None, 4, 64, 0, record_margins=True)
    got = decoder.generate_reference(prompts, 24)
    report = compare_to_reference(got.tokens, want, default_tolerance(torch.float32))
    assert report.passed, report.format()
    for g, w in zip(got.margins, want.margins):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-3, atol=1e-3)


def test_captured_tree_rounds_equal_eager_tree_rounds(tmp_path):
    from specpilot.ir import Tree
    from specpilot.runtime.graphed_tree import GraphedTreeDecoder

    target, drafter, prompts = _noisy_pair(tmp_path, 88, "bfloat16")
    shape = Tree((3, 2, 1)).shape()
    eager = GraphedTreeDecoder(target, drafter, 4, 64, shape, capture=False).generate(prompts, 24)
    graphed = GraphedTreeDecoder(target, drafter, 4, 64, shape).generate(prompts, 24)
    assert graphed.tokens == eager.tokens
    assert graphed.accepted_lengths == eager.accepted_lengths
    reference = generate_ar(target, prompts, 24)
    decoder = GraphedTreeDecoder(target, drafter, 4, 64, shape)
    report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.bfloat16))
    assert report.passed, report.format()


def test_captured_dynamic_tree_rounds_equal_eager_ones(tmp_path):
    from specpilot.ir.topology import DynamicTree
    from specpilot.runtime.graphed_dynamic import GraphedDynamicTreeDecoder

    target, drafter, prompts = _noisy_pair(tmp_path, 91, "float32")
    topology = DynamicTree(budget=6, depth=3, width=2)
    eager = GraphedDynamicTreeDecoder(target, drafter, 4, 64, topology,
                                      capture=False).generate(prompts, 24)
    captured = GraphedDynamicTreeDecoder(target, drafter, 4, 64, topology)
    graphed = captured.generate(prompts, 24)
    reference = generate_ar(target, prompts, 24)
    assert graphed.tokens == eager.tokens == reference.tokens
    assert graphed.accepted_lengths == eager.accepted_lengths
    # Forced rounds grow the drafter's trees too: captured as run eagerly, and clean.
    want = GraphedDynamicTreeDecoder(target, drafter, 4, 64, topology,
                                     capture=False).force(prompts, reference.tokens)
    got = captured.force(prompts, reference.tokens)
    assert got == want
    report = compare_to_reference(got, reference, default_tolerance(torch.float32))
    assert report.passed, report.format()


def test_adaptive_rounds_measure_their_costs_and_equal_eager_rounds_given_them(tmp_path):
    """The captured adaptive decoder (its length update compiled) times each length's graph
    against the plain step's; run eagerly with those same costs it takes the same lengths and
    gives the same output."""
    target, drafter, prompts = _noisy_pair(tmp_path, 87, "float32")
    graphed_decoder = GraphedChainDecoder(target, drafter, 4, 64, 4, adaptive=True)
    assert graphed_decoder.policy.compiled      # captured: the length update runs compiled
    graphed = graphed_decoder.generate(prompts, 24)
    costs = graphed_decoder.policy.round_cost.tolist()
    assert costs[0] == 1.0 and costs[4] > costs[0]     # four drafter steps cost something
    eager = GraphedChainDecoder(target, drafter, 4, 64, 4, capture=False, adaptive=True,
                                rounds_per_replay=graphed_decoder.rounds_per_replay,
                                round_costs=costs).generate(prompts, 24)
    assert graphed.tokens == eager.tokens and graphed.stats == eager.stats


def test_a_captured_batch_started_off_prefills_only_the_target_and_gives_greedy_output(tmp_path):
    """With a drafter that never agrees, two batches of four teach the captured adaptive decoder
    its workload; the third starts off, runs plain rounds from its first replay and prefills the
    target alone (its own prefill graph), and still gives greedy AR's output."""
    from mechanism_setup import ContraryDrafter, fill_with_noise
    folder = make_checkpoint(tmp_path, "llama3", seed=91)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    prompts = random_prompts((4, 11, 1, 7), seed=92)
    reference = generate_ar(target, prompts, 24)
    decoder = GraphedChainDecoder(target, ContraryDrafter(target), 4, 64, 4, adaptive=True)
    runs = [decoder.generate(prompts, 24) for _ in range(2)]
    untouched = fill_with_noise(decoder.dcache)
    runs.append(decoder.generate(prompts, 24))
    for r in runs:
        report = compare_to_reference(r.tokens, reference, default_tolerance(torch.float32))
        assert report.passed, report.format()
    assert runs[0].drafter_forwards > 0
    assert list(runs[2].stats) == ["rounds_chain_0"] and runs[2].drafter_forwards == 0
    assert all(untouched())


def test_captured_two_level_rounds_equal_eager_ones_and_force_clean(tmp_path):
    from specpilot.ir.topology import Tree
    from specpilot.runtime.graphed_tree import GraphedTreeDecoder
    from specpilot.runtime.graphed_two_level import GraphedTwoLevelDecoder

    target, drafter, prompts = _noisy_pair(tmp_path, 94, "float32")
    shape = Tree((2, 2, 1)).shape()
    # Every layer kept: the cheap verifier is the target, so each round accepts what the static
    # tree's does (a cheap cache left unprefilled, which still gives AR output, would not).
    keep = tuple(range(target.config.num_layers))
    eager = GraphedTwoLevelDecoder(target, drafter, 4, 64, shape, keep,
                                   capture=False).generate(prompts, 24)
    captured = GraphedTwoLevelDecoder(target, drafter, 4, 64, shape, keep)
    graphed = captured.generate(prompts, 24)
    static = GraphedTreeDecoder(target, drafter, 4, 64, shape).generate(prompts, 24)
    reference = generate_ar(target, prompts, 24)
    assert graphed.tokens == eager.tokens == reference.tokens
    assert graphed.accepted_lengths == eager.accepted_lengths == static.accepted_lengths
    report = compare_to_reference(captured.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert report.passed, report.format()
