"""runtime/compiled_attention.py: the generated attention called from the compiled blocks of
the "layers" fast path (kernels.fast_path "layers" with kernels.attention_kernels "generated").
Against the reference-ops model in float32 for every kind of forward a decoder runs (the kernel
really runs, once per layer, on the forward's bounded masks), and Programs with both choices
decode HF's greedy output, forcing clean. On the CPU Inductor compiles the blocks as C++ and the
kernel runs in Triton's interpreter."""
import pytest
import torch

from specpilot.deploy import build_deployment
from specpilot.ir import (SetAttentionKernels, SetDrafter, SetFastPath, SetMaxBatchSize, replay,
                          stock_program)
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.compiled_attention import CompiledGeneratedAttention
from specpilot.runtime.decoder import (check_pair_runs, force_program, load_pair, run_reference,
                                       timed_program, with_generated_attention)
from specpilot.runtime.generated_attention import BoundedMask, GeneratedAttention
from specpilot.runtime.model import Transformer, compiles_layers
from specpilot.runtime.torch_backend import TorchBackend

from forward_cases import compare_forwards, tree_mask
from hf_factory import (FUSABLE, hf_greedy, kernel_device, load_hf, make_checkpoint,
                        noisy_checkpoint, random_prompts)
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()
DEVICE = kernel_device()
CAPACITY = 40


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled-attention")
    target = make_checkpoint(root, "llama3", name="target", seed=61, **FUSABLE,
                             num_hidden_layers=2)
    return target, noisy_checkpoint(target, "drafter", 0.1, seed=62)


@pytest.fixture(scope="module")
def models(checkpoints):
    target = checkpoints[0]
    ref = Transformer.from_checkpoint(target, "float32", DEVICE)
    fast = Transformer.from_checkpoint(
        target, "float32", DEVICE, fuse_projections=True,
        backend=TorchBackend(fast_ops="layers", attention_kernels="generated"))
    assert compiles_layers(fast.backend) and fast.backend.attention_kernels == "generated"
    return ref, fast


@pytest.fixture
def kernel_calls(monkeypatch):
    """The masks the generated attention ran on, one entry per call."""
    calls = []
    run = GeneratedAttention.__call__

    def counted(self, q, k_cache, v_cache, mask, scale):
        calls.append(mask)
        return run(self, q, k_cache, v_cache, mask, scale)
    monkeypatch.setattr(GeneratedAttention, "__call__", counted)
    return calls


@pytest.mark.parametrize("starts,parents", [
    ([17, 5, 30], [-1]),                          # an AR step
    ([11, 20, 3], [-1, 0, 1, 2, 3]),              # chain verification of k + 1 = 5 tokens
    ([9, 25, 14], [-1, 0, 0, 1, 2]),              # a tree: two children of the root
], ids=["ar-step", "chain", "tree"])
def test_compiled_layers_with_the_generated_attention_match_the_reference(
        models, kernel_calls, starts, parents):
    ref, fast = models
    gen = torch.Generator().manual_seed(len(parents) * 7 + starts[0])
    width = len(parents)
    tokens = torch.randint(0, ref.config.vocab_size, (len(starts), width), generator=gen)
    depth = [0] * width
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    positions = torch.tensor(starts)[:, None] + torch.tensor(depth)[None, :]
    slots = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
    mask = tree_mask(starts, [parents] * len(starts), CAPACITY)
    kernel_calls.clear()
    compare_forwards(ref, fast, *(t.to(DEVICE) for t in (tokens, positions, slots, mask)),
                     capacity=CAPACITY, seed=width)
    # the kernel ran in each layer, on the forward's mask with each request's bound
    assert len(kernel_calls) == ref.config.num_layers
    for bounded in kernel_calls:
        assert isinstance(bounded, BoundedMask)
        assert bounded.kv_len.tolist() == [s + width for s in starts]


def test_the_compiled_op_refuses_a_plain_mask_and_a_copy_keeps_the_original():
    runner = GeneratedAttention()
    op = CompiledGeneratedAttention(runner)
    q = torch.randn(1, 1, 2, 32)
    with pytest.raises(SpecPilotError, match="takes a BoundedMask"):
        op(q, torch.randn(1, 4, 1, 32), torch.randn(1, 4, 1, 32),
           torch.ones(1, 1, 4, dtype=torch.bool), 0.2)
    layers = TorchBackend(fast_ops="layers")
    swapped = layers.with_generated_attention()
    assert isinstance(swapped.graph_ops._attention, CompiledGeneratedAttention)
    assert swapped.graph_ops._attention.runner is swapped._attention
    assert not isinstance(layers.graph_ops._attention, CompiledGeneratedAttention)
    assert layers.attention_kernels == "model"


@pytest.fixture(scope="module")
def setup(checkpoints):
    target, drafter = checkpoints
    base = replay(stock_program(build_deployment(target, drafter, dtype="float32")),
                  [SetMaxBatchSize(2), SetFastPath("layers"), SetAttentionKernels("generated")])
    prompts = random_prompts((5, 3, 7), seed=63)
    hf = load_hf(target)
    return dict(target=target, drafter=drafter, base=base, prompts=prompts,
                hf=[hf_greedy(hf, p, 6) for p in prompts])


@pytest.mark.parametrize("steps", [[], [SetDrafter("none")]], ids=["chain", "greedy-ar"])
def test_programs_on_compiled_layers_with_the_generated_attention_decode_hf_greedy(
        setup, kernel_calls, steps):
    program = replay(setup["base"], steps)
    # fast_path=True: the CUDA fast path's models, built on the CPU
    pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE, program=program,
                     fast_path=True)
    assert compiles_layers(pair.target.backend)
    assert pair.target.backend.attention_kernels == "generated"
    kernel_calls.clear()
    run = timed_program(program, pair, setup["prompts"], 6)
    assert run.tokens == setup["hf"]
    assert kernel_calls and all(isinstance(m, BoundedMask) for m in kernel_calls)
    if program.draft.speculates:
        assert 1 < run.mean_accepted
        reference = run_reference(load_pair(setup["target"], setup["drafter"], "float32",
                                             DEVICE), setup["prompts"], 6)
        report = force_program(program, pair, setup["prompts"], reference)
        assert report.passed and not report.violations, report.format()


def test_a_layers_pair_gets_the_generated_attention_in_its_compiled_blocks(setup):
    layers_only = replay(setup["base"], [SetAttentionKernels("model")])
    pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE,
                     program=layers_only, fast_path=True)
    swapped = with_generated_attention(pair)
    check_pair_runs(setup["base"], swapped)
    assert isinstance(swapped.target.backend.graph_ops._attention, CompiledGeneratedAttention)
    # the swapped model compiles blocks of its own: the original's keep calling SDPA
    assert swapped.target._blocks is not pair.target._blocks
