"""runtime/generated_attention.py: the torch backend's attention by the codegen kernel
(kernels.attention_kernels "generated"). The op against a float64 softmax over tree masks, its
bound (each request's last visible slot, found once a forward), and Programs that run it: their
output is HF's greedy output, a pair built the other way is refused, and the search, the cost
model and `ir show` know the choice. On the CPU the kernel runs in Triton's interpreter."""
import pytest
import torch

from specpilot.deploy import build_deployment
from specpilot.ir import (SetAttentionKernels, SetBatchLayout, SetDrafter, SetDrafterKernels,
                          SetMaxBatchSize, SetTopology, Tree, apply, replay, stock_program)
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.decoder import (UnsupportedProgram, check_pair_runs, force_program,
                                       load_pair, needs_own_pair, run_reference, timed_program,
                                       with_generated_attention)
from specpilot.runtime.fused_forward import FusedForward
from specpilot.runtime.generated_attention import BoundedMask, GeneratedAttention, visible_end
from specpilot.runtime.torch_backend import TorchBackend

from forward_cases import tree_mask
from hf_factory import (FUSABLE, hf_greedy, kernel_device, load_hf, make_checkpoint,
                        noisy_checkpoint, random_prompts)

DEVICE = kernel_device()
MAX_NEW = 6


def tree_case(batch, t, slots, heads, kv_heads, head_dim, seed, dtype=torch.float32):
    """Random q and caches, and a verification mask: request b's committed prefix (a random
    length), then its t new tokens, each seeing the prefix, itself and a random chain of
    earlier new tokens (a tree's ancestors). Slots past the new tokens hold random values that
    no query sees."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, t, heads, head_dim, generator=g)
    k = torch.randn(batch, slots, kv_heads, head_dim, generator=g)
    v = torch.randn(batch, slots, kv_heads, head_dim, generator=g)
    prefixes, parents = [], []
    for b in range(batch):
        prefixes.append(int(torch.randint(1, slots - t - 4, (1,), generator=g)))
        parents.append([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)])
    mask = tree_mask(prefixes, parents, slots)
    return [x.to(DEVICE, dtype) for x in (q, k, v)] + [mask.to(DEVICE)]


def float64_attention(q, k, v, mask, scale):
    """softmax(q k^T scale) v over the visible slots, in float64, query head h on kv head
    h // (H // Hkv)."""
    group = q.shape[2] // k.shape[2]
    k64 = k.double().repeat_interleave(group, dim=2)
    v64 = v.double().repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.double(), k64) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    out = torch.einsum("bhts,bshd->bthd", torch.softmax(scores, -1), v64)
    return out.reshape(q.shape[0], q.shape[1], -1)


@pytest.mark.parametrize("t,heads,kv_heads", [(1, 4, 1), (5, 4, 2), (7, 6, 6)])
def test_the_generated_attention_equals_a_float64_softmax_over_tree_masks(t, heads, kv_heads):
    q, k, v, mask = tree_case(3, t, 40, heads, kv_heads, 32, seed=t)
    backend = TorchBackend(attention_kernels="generated")
    expected = float64_attention(q, k, v, mask, 0.3)
    plain = backend.attention(q, k, v, mask, 0.3)
    bounded = backend.attention(q, k, v, backend.attention_masks([mask])[0], 0.3)
    assert plain.shape == (3, t, heads * 32) and plain.dtype == torch.float32
    torch.testing.assert_close(plain.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(bounded, plain)
    # the per-op reference attention agrees too (the backend the CPU's stock decoder runs)
    torch.testing.assert_close(TorchBackend().attention(q, k, v, mask, 0.3), plain,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_within_rounding_of_float64_and_a_strided_mask_read_as_given(dtype):
    q, k, v, mask = tree_case(2, 5, 72, 4, 2, 64, seed=9, dtype=dtype)
    backend = TorchBackend(attention_kernels="generated")
    expected = float64_attention(q, k, v, mask, 0.125)
    out = backend.attention(q, k, v, mask, 0.125)
    assert out.dtype == dtype
    tolerance = 2e-2 if dtype == torch.bfloat16 else 4e-3    # fp16 keeps 3 more mantissa bits
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)
    # one level's rows of a round's mask: a view whose rows are a wider mask's, not a copy
    wide = torch.zeros(2, 8, 72, dtype=torch.bool, device=mask.device)
    wide[:, 3:] = mask
    assert torch.equal(backend.attention(q, k, v, wide[:, 3:], 0.125), out)


def test_the_bound_is_each_requests_last_visible_slot_and_is_read():
    mask = torch.zeros(3, 2, 9, dtype=torch.bool)
    mask[0, 0, :4] = True                      # request 0: slots 0-3, then slot 6 for token 1
    mask[0, 1, 6] = True
    mask[1, :, 8] = True                       # request 1: the last slot
    # request 2 sees nothing: 0
    assert visible_end(mask).tolist() == [7, 9, 0]
    q, k, v, tree = tree_case(2, 3, 24, 2, 1, 32, seed=4)
    backend = TorchBackend(attention_kernels="generated")
    bounded = backend.attention_masks([tree])[0]
    short = BoundedMask(bounded.mask, bounded.kv_len - 1)
    # a bound one slot short drops each request's last token from its own attention
    assert not torch.allclose(backend.attention(q, k, v, short, 0.2),
                              backend.attention(q, k, v, bounded, 0.2))


def test_one_bound_per_distinct_mask_of_a_forward():
    backend = TorchBackend(attention_kernels="generated")
    a = torch.rand(2, 3, 16, device=DEVICE) < 0.5
    b = torch.rand(2, 3, 16, device=DEVICE) < 0.5
    out = backend.attention_masks([a, a, b, a])
    assert out[0] is out[1] is out[3] and out[2] is not out[0]
    assert torch.equal(out[2].kv_len, visible_end(b))
    # the default attention takes the masks as given
    assert TorchBackend().attention_masks([a, b]) == [a, b]


def test_an_unknown_attention_kernel_is_refused():
    with pytest.raises(SpecPilotError, match="attention_kernels must be 'model' or 'generated'"):
        TorchBackend(attention_kernels="flash")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("generated-attention")
    target = make_checkpoint(root, "llama3", name="target", seed=41, **FUSABLE,
                             num_hidden_layers=2)
    drafter = noisy_checkpoint(target, "drafter", 0.1, seed=42)
    base = apply(stock_program(build_deployment(target, drafter, dtype="float32")),
                 SetMaxBatchSize(2))
    return dict(target=target, drafter=drafter, base=base,
                generated=apply(base, SetAttentionKernels("generated")),
                prompts=random_prompts((5, 3, 7), seed=43))


@pytest.fixture(scope="module")
def hf_tokens(setup):
    hf = load_hf(setup["target"])
    return [hf_greedy(hf, p, MAX_NEW) for p in setup["prompts"]]


@pytest.mark.parametrize("steps", [[], [SetTopology(Tree((2, 1)))], [SetDrafter("none")]],
                         ids=["chain", "tree", "greedy-ar"])
def test_programs_with_the_generated_attention_decode_hf_greedy(setup, hf_tokens, steps):
    program = replay(setup["generated"], steps)
    pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE, program=program)
    for model in (pair.target, pair.drafter):
        assert model.backend.attention_kernels == "generated"
    run = timed_program(program, pair, setup["prompts"], MAX_NEW)
    assert run.tokens == hf_tokens
    # the kernel ran: built for the target's dtype and head size
    assert list(pair.target.backend._attention._kernels) == [(torch.float32, 32)]
    if program.draft.speculates:
        assert 1 < run.mean_accepted          # drafts accepted: the tree and chain were walked
        plain = load_pair(setup["target"], setup["drafter"], "float32", DEVICE)
        reference = run_reference(plain, setup["prompts"], MAX_NEW)
        report = force_program(program, pair, setup["prompts"], reference)
        assert report.passed and not report.violations, report.format()


def test_the_ragged_layout_with_the_generated_attention_decodes_hf_greedy(setup, hf_tokens,
                                                                           monkeypatch):
    # The packed layout's per-request attention passes plain masks (runtime/ragged.py): each
    # is bounded where it is used, and the kernel runs each request's verification rows.
    widths = []
    call = GeneratedAttention.__call__

    def counted(self, q, k_cache, v_cache, mask, scale):
        if not isinstance(mask, BoundedMask):
            widths.append(q.shape[1])
        return call(self, q, k_cache, v_cache, mask, scale)
    monkeypatch.setattr(GeneratedAttention, "__call__", counted)
    for steps, width in (([], 5), ([SetTopology(Tree((2, 1)))], 5)):
        program = replay(setup["generated"], [SetBatchLayout("ragged"), *steps])
        pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE, program=program)
        widths.clear()
        run = timed_program(program, pair, setup["prompts"], MAX_NEW)
        assert run.tokens == hf_tokens, steps
        assert width in widths, (steps, sorted(set(widths)))   # a request's root and 4 nodes


def test_a_sliding_window_model_with_the_generated_attention_decodes_hf_greedy(tmp_path):
    # Mistral's window (5 positions, shorter than the sequences) is in the masks the kernel
    # reads: it must change nothing of HF's output.
    target = make_checkpoint(tmp_path, "mistral", name="target", seed=51, **FUSABLE)
    drafter = noisy_checkpoint(target, "drafter", 0.1, seed=52)
    program = replay(stock_program(build_deployment(target, drafter, dtype="float32")),
                     [SetMaxBatchSize(2), SetAttentionKernels("generated")])
    prompts = random_prompts((9, 4), seed=53)
    hf = load_hf(target)
    pair = load_pair(target, drafter, "float32", DEVICE, program=program)
    run = timed_program(program, pair, prompts, 8)
    assert run.tokens == [hf_greedy(hf, p, 8) for p in prompts]


def test_a_model_the_kernel_cannot_run_is_refused_when_loaded(tmp_path, setup):
    small = make_checkpoint(tmp_path, "llama3", name="drafter", seed=54)     # head_dim 8
    with pytest.raises(SpecPilotError, match="cannot run the drafter: head_dim 8 is outside"):
        load_pair(setup["target"], small, "float32", DEVICE, program=setup["generated"])
    # greedy AR never runs the drafter: its head size does not matter
    ar = apply(setup["generated"], SetDrafter("none"))
    assert load_pair(setup["target"], small, "float32", DEVICE, program=ar).drafter is not None


def test_the_bench_pair_shares_the_weights_and_keeps_a_fused_drafter(setup):
    plain = load_pair(setup["target"], setup["drafter"], "float32", DEVICE)
    swapped = with_generated_attention(plain)
    assert swapped.target.lm_head[0] is plain.target.lm_head[0]
    assert swapped.target.backend.attention_kernels == "generated"
    assert plain.target.backend.attention_kernels == "model"        # the original is untouched
    check_pair_runs(setup["generated"], swapped)
    # a fused drafter stays fused; its own model (for long prefills) gets the attention too
    fused_only = apply(setup["base"], SetDrafterKernels("fused"))
    fused_pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE,
                           program=fused_only)
    both = with_generated_attention(fused_pair)
    assert isinstance(both.drafter, FusedForward)
    assert both.drafter.model.backend.attention_kernels == "generated"
    assert fused_pair.drafter.model.backend.attention_kernels == "model"
    check_pair_runs(apply(fused_only, SetAttentionKernels("generated")), both)


def test_a_pair_built_for_the_other_attention_is_refused(setup):
    plain = load_pair(setup["target"], setup["drafter"], "float32", DEVICE)
    with pytest.raises(UnsupportedProgram, match="the target was loaded with 'model' attention "
                                                 "kernels but the Program runs "
                                                 "kernels.attention_kernels 'generated'"):
        check_pair_runs(setup["generated"], plain)
    generated = load_pair(setup["target"], setup["drafter"], "float32", DEVICE,
                          program=setup["generated"])
    with pytest.raises(UnsupportedProgram, match="loaded with 'generated' attention kernels"):
        timed_program(setup["base"], generated, setup["prompts"], MAX_NEW)


def test_the_search_builds_its_own_pair_and_the_cost_model_and_ir_show_know_it(setup):
    from specpilot.cli_ir import summarize
    from specpilot.cost import gpu_spec
    from specpilot.cost.roofline import step_nodes

    assert not needs_own_pair(setup["base"]) and needs_own_pair(setup["generated"])
    gpu = gpu_spec("h200")

    def launches(program):
        return {n.name: n.launches for n in step_nodes(program, gpu, 2, 40, 2.0)}
    base, generated = launches(setup["base"]), launches(setup["generated"])
    # the bound's two launches a forward: with the target's embedding, in each drafter step
    changed = {name: generated[name] - base[name] for name in base
               if generated[name] != base[name]}
    drafter_steps = [n for n in base if n.startswith("draft.forward")]
    assert len(drafter_steps) == 4
    assert changed == {"target.embed": 2, **{n: 2 for n in drafter_steps}}
    assert "generated attention kernels" in summarize(setup["generated"])
    assert "attention kernels" not in summarize(setup["base"])
    # the kernel's gain is not priced, and the cost model says so
    from specpilot.cost.model import unmodelled
    assert any("generated attention" in n for n in unmodelled(setup["generated"]))
    assert not any("attention" in n for n in unmodelled(setup["base"]))
