"""The torch backend's attention by the generated kernel (runtime/generated_attention.py) on the
GPU, compiled natively and captured in the decoders' CUDA graphs, on the CUDA fast path it
replaces grouped SDPA in: the op against a float64 softmax in bf16, and Programs with
kernels.attention_kernels "generated" (chain, tree, adaptive lengths with refill, greedy AR)
graphed with HF's greedy output in float32 and forcing clean in bf16, per op and (some of them)
on compiled whole layers. Skipped without CUDA."""
import pytest
import torch

from hf_factory import hf_greedy, load_hf, make_checkpoint, noisy_checkpoint, random_prompts
from specpilot.deploy import build_deployment
from specpilot.ir import (CaptureGraphs, SetAttentionKernels, SetDrafter, SetDrafterKernels,
                          SetDraftLengthPolicy, SetFastPath, SetMaxBatchSize, SetRefill,
                          SetTopology, Tree, replay, stock_program)
from specpilot.runtime.decoder import force_program, load_pair, run_reference, timed_program
from specpilot.runtime.forcing import default_tolerance
from specpilot.runtime.graphed_program import release_decoders
from specpilot.runtime.torch_backend import TorchBackend
from specpilot.search.output_check import check_output, first_divergences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=384)
NEW = 20


def test_the_kernel_on_the_fast_path_equals_a_float64_softmax_in_bf16():
    g = torch.Generator(device="cuda").manual_seed(5)
    b, t, s, h, hkv, d = 16, 5, 456, 16, 4, 64
    q = torch.randn(b, t, h, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(b, s, hkv, d, device="cuda", generator=g).bfloat16()
    v = torch.randn(b, s, hkv, d, device="cuda", generator=g).bfloat16()
    prefix = torch.randint(100, 400, (b,), device="cuda", generator=g)
    slots = torch.arange(s, device="cuda")
    # each new token sees the prefix and the new tokens up to itself (a chain's mask)
    mask = ((slots[None, None, :] < prefix[:, None, None])
            | ((slots[None, None, :] >= prefix[:, None, None])
               & (slots[None, None, :] <= prefix[:, None, None]
                  + torch.arange(t, device="cuda")[None, :, None])))
    backend = TorchBackend(fast_ops=True, attention_kernels="generated")
    out = backend.attention(q, k, v, backend.attention_masks([mask])[0], d ** -0.5)
    group = h // hkv
    scores = torch.einsum("bthd,bshd->bhts", q.double(),
                          k.double().repeat_interleave(group, 2)) * d ** -0.5
    probs = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), -1)
    expected = torch.einsum("bhts,bshd->bthd", probs, v.double().repeat_interleave(group, 2))
    torch.testing.assert_close(out.double(), expected.reshape(b, t, -1), rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("generated-attention-gpu")
    target = make_checkpoint(folder, "llama3", name="target", seed=41, **SHAPE)
    return target, noisy_checkpoint(target, "drafter", noise=0.1, seed=42)


@pytest.fixture(scope="module")
def hf_tokens(pair_dirs):
    hf = load_hf(pair_dirs[0])
    return [hf_greedy(hf, p, NEW) for p in random_prompts((5, 11, 2, 8, 6), seed=44)]


@pytest.mark.parametrize("steps", [
    [],
    [SetTopology(Tree((2, 2, 1)))],
    [SetDraftLengthPolicy("per_request_adaptive", 12), SetRefill("continuous"),
     SetDrafterKernels("fused")],
    [SetDrafter("none")],
], ids=["chain", "tree", "adaptive-refill-fused", "greedy-ar"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphed_programs_with_the_generated_attention(pair_dirs, hf_tokens, steps, dtype):
    _check_graphed(pair_dirs, hf_tokens, steps, dtype, "ops")


@pytest.mark.parametrize("steps,dtype", [
    ([], "float32"),
    ([SetDraftLengthPolicy("per_request_adaptive", 12), SetRefill("continuous"),
      SetDrafterKernels("fused")], "bfloat16"),
    ([SetDrafter("none")], "bfloat16"),
], ids=["chain-fp32", "adaptive-refill-fused-bf16", "greedy-ar-bf16"])
def test_graphed_programs_on_compiled_layers_with_the_generated_attention(pair_dirs, hf_tokens,
                                                                          steps, dtype):
    """The kernel called from the compiled blocks (runtime/compiled_attention.py), captured."""
    _check_graphed(pair_dirs, hf_tokens, [*steps, SetFastPath("layers")], dtype, "layers")


def _check_graphed(pair_dirs, hf_tokens, steps, dtype, fast_path):
    stock = replay(stock_program(build_deployment(*pair_dirs, dtype=dtype)), [SetMaxBatchSize(3)])
    program = replay(stock, [CaptureGraphs(True), *steps, SetAttentionKernels("generated")])
    pair = load_pair(*pair_dirs, dtype, "cuda", program=program)
    assert pair.target.backend.attention_kernels == "generated"
    assert pair.target.backend.fast_ops_mode == fast_path
    prompts = random_prompts((5, 11, 2, 8, 6), seed=44)
    plain = load_pair(*pair_dirs, dtype, "cuda")
    reference = run_reference(plain, prompts, NEW)
    release_decoders()
    run = timed_program(program, pair, prompts, NEW)
    if dtype == "float32":
        assert run.tokens == hf_tokens == reference.tokens
    if program.draft.speculates:
        report = force_program(program, pair, prompts, reference)
        assert report.passed and not report.violations, report.format()
    else:
        # Greedy AR is not forced (no drafter): its own text may leave the stock text only at
        # a near-tie of the reference's logits, where the attention's rounding order decides.
        check = check_output(first_divergences(run.tokens, reference), len(prompts),
                             default_tolerance(getattr(torch, dtype)))
        assert check.passed, check.reason()
    assert pair.target.backend._attention._kernels       # the kernel was built and ran
