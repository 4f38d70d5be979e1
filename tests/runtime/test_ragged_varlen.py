"""The ragged layout on a backend with a varlen attention kernel: the whole pack in one launch.

References: the per-request torch attention (`VarlenAttention` over the torch backend) for the
wrapper, and greedy AR of the stock torch decoder for a whole ragged decode with the generated
backend (on the CPU the kernels run in Triton's interpreter, so the model is tiny).
"""
import pytest
import torch

from specpilot.codegen.cache import triton_interpreting
from specpilot.deploy import build_deployment
from specpilot.ir import SetBackend, SetBatchLayout, SetMaxBatchSize, SetTopology, Tree, apply, stock_program
from specpilot.runtime import batch_layout
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.batch_layout import feed
from specpilot.runtime.decoder import acceptance_rule, load_pair
from specpilot.runtime.mechanisms import run_program_decode
from specpilot.runtime.model import Transformer
from specpilot.runtime.ragged import VarlenAttention, has_varlen_kernel
from specpilot.runtime.reference_ops import varlen_attention_ref
from specpilot.runtime.row_tree import RowTree
from specpilot.runtime.torch_backend import TorchBackend

from hf_factory import make_checkpoint, noisy_checkpoint, random_prompts
from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)

MAX_NEW = 7
# head_dim 16 (the smallest the attention families take), GQA 2, one layer: interpreter-sized.
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=1)


class ReferenceVarlen(TorchBackend):
    """The torch backend plus a varlen attention computed by `varlen_attention_ref`, so the
    wrapper's packed path can be checked without a kernel."""
    has_varlen_attention = True

    def __init__(self):
        super().__init__()
        self.calls = 0

    def varlen_attention(self, q, k_cache, v_cache, cu, rows, kv_limits, window_bits, scale,
                         max_seqlen=None):
        self.calls += 1
        assert max_seqlen == int((cu[1:] - cu[:-1]).max())
        out = varlen_attention_ref(q, k_cache, v_cache, cu, rows, kv_limits, window_bits, scale)
        return out.reshape(q.shape[0], -1)


def packed_feeds(gen, capacity):
    """Three feeds as the mechanism loop builds them: a prefill with a tree after it, a lone
    root, a chain and a tree behind committed tokens; rows out of order."""
    tree = RowTree(tokens=(5, 6, 7, 8), parents=(-1, -1, 0, 2), depths=(1, 1, 2, 3),
                   ranks=(0, 1, 0, 0))
    chain = RowTree(tokens=(1, 2), parents=(-1, 0), depths=(1, 2), ranks=(0, 0))
    return [feed(2, [3, 4, 9, 1, 2], 0, tree), feed(0, [7], 11), feed(1, [4, 4], 6, chain)]


def flat_inputs(feeds, batch, capacity, hq, hkv, d, gen):
    """Packed q, the flattened caches and the flattened [1, N, B*S] mask, as `_run_ragged`."""
    n = sum(len(f) for f in feeds)
    q = torch.randn(1, n, hq, d, generator=gen)
    k = torch.randn(1, batch * capacity, hkv, d, generator=gen)
    v = torch.randn(1, batch * capacity, hkv, d, generator=gen)
    mask = torch.zeros(1, n, batch * capacity, dtype=torch.bool)
    t = 0
    for f in feeds:
        base = f.row * capacity
        for limit, extra in zip(f.limits, f.extra):
            mask[0, t, base:base + limit] = True
            mask[0, t, [base + x for x in extra]] = True
            t += 1
    cu = [0]
    for f in feeds:
        cu.append(cu[-1] + len(f))
    return q, k, v, mask, cu


@pytest.mark.parametrize("given", [False, True], ids=["read-off-the-mask", "given-by-the-feeds"])
def test_packed_path_matches_the_per_request_loop(given):
    gen = torch.Generator().manual_seed(21)
    batch, capacity, hq, hkv, d = 3, 24, 4, 2, 8
    feeds = packed_feeds(gen, capacity)
    q, k, v, mask, cu = flat_inputs(feeds, batch, capacity, hq, hkv, d, gen)
    rows = [f.row for f in feeds]
    visibility = ([x for f in feeds for x in f.limits], [x for f in feeds for x in f.extra])
    inner = ReferenceVarlen()
    packed = VarlenAttention(inner, cu, rows, capacity, visibility if given else None)
    loop = VarlenAttention(TorchBackend(), cu, rows, capacity)
    assert has_varlen_kernel(inner) and not has_varlen_kernel(TorchBackend())
    got = packed.attention(q, k, v, mask, 0.4)
    packed.attention(q, k, v, mask, 0.4)               # a second layer: same mask, same answer
    want = loop.attention(q, k, v, mask, 0.4)
    assert inner.calls == 2
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # Off-by-one offsets through the packed path differ from the truth.
    shifted = [cu[0]] + [c + 1 for c in cu[1:-1]] + [cu[-1]]
    wrong = VarlenAttention(ReferenceVarlen(), shifted, rows, capacity).attention(q, k, v, mask, 0.4)
    assert (wrong - want).abs().max() > 0.05


def test_sliding_window_masks_are_read_off_per_window(tmp_path):
    # Mistral's window (5) is shorter than these prompts: the windowed layers' masks are not
    # the forward's mask, and the packed path must read each off exactly.
    folder = make_checkpoint(tmp_path, "mistral", seed=3)
    inner = ReferenceVarlen()
    packed = Transformer.from_checkpoint(folder, backend=inner)
    loop = Transformer.from_checkpoint(folder)
    prompts = random_prompts((9, 1, 12), seed=4)
    feeds = [feed(row, p, 0, logits_from=0) for row, p in zip((1, 2, 0), prompts)]
    capacity = batch_layout.with_pad_slot(16)
    got = batch_layout.run_feeds(packed, packed.new_cache(3, capacity), feeds, "ragged")
    want = batch_layout.run_feeds(loop, loop.new_cache(3, capacity), feeds, "ragged")
    assert inner.calls == packed.config.num_layers
    torch.testing.assert_close(got.packed, want.packed, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def generated_ragged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ragged-varlen")
    target_dir = make_checkpoint(folder, "llama3", name="target", seed=13, **TINY)
    drafter_dir = noisy_checkpoint(target_dir, "drafter", noise=0.1, seed=14)
    program = stock_program(build_deployment(target_dir, drafter_dir, "cpu", "float32"))
    for t in (SetBackend("generated"), SetBatchLayout("ragged"), SetTopology(Tree((2, 1))),
              SetMaxBatchSize(3)):
        program = apply(program, t)
    device = "cpu" if triton_interpreting() else "cuda"
    pair = load_pair(target_dir, drafter_dir, "float32", device, program=program)
    stock = load_pair(target_dir, None, "float32", device)
    prompts = random_prompts((6, 1, 3), seed=15)
    return dict(program=program, pair=pair, prompts=prompts, stock=stock,
                reference=generate_ar(stock.target, prompts, MAX_NEW))


def test_ragged_forward_logits_match_the_torch_backend(generated_ragged):
    # Every token's logits, tree nodes off the first branch included (a decode compares only
    # the accepted paths): prefills with trees behind them, in one packed forward.
    generated, torch_model = generated_ragged["pair"].target, generated_ragged["stock"].target
    tree = RowTree(tokens=(5, 6, 7, 8, 9), parents=(-1, -1, 0, 1, 3), depths=(1, 1, 2, 2, 3),
                   ranks=(0, 1, 0, 0, 0))
    chain = RowTree(tokens=(1, 2), parents=(-1, 0), depths=(1, 2), ranks=(0, 0))
    prompts = random_prompts((4, 1, 6), seed=16)
    feeds = [feed(2, prompts[0], 0, tree, logits_from=0), feed(0, prompts[1], 0, logits_from=0),
             feed(1, prompts[2], 0, chain, logits_from=0)]
    capacity = batch_layout.with_pad_slot(16)
    got = batch_layout.run_feeds(generated, generated.new_cache(3, capacity), feeds, "ragged")
    want = batch_layout.run_feeds(torch_model, torch_model.new_cache(3, capacity), feeds, "ragged")
    torch.testing.assert_close(got.packed, want.packed, rtol=1e-4, atol=1e-4)


def counting(fn, counts, key):
    def wrapped(*args, **kwargs):
        counts[key] += 1
        return fn(*args, **kwargs)
    return wrapped


def test_ragged_decode_with_the_varlen_kernel_equals_greedy_ar(generated_ragged, monkeypatch):
    program, pair = generated_ragged["program"], generated_ragged["pair"]
    counts = dict(varlen=0, dense=0)
    for model in (pair.target, pair.drafter):
        assert model.backend.has_varlen_attention
        monkeypatch.setattr(model.backend, "varlen_attention",
                            counting(model.backend.varlen_attention, counts, "varlen"))
        monkeypatch.setattr(model.backend, "attention",
                            counting(model.backend.attention, counts, "dense"))
    run = run_program_decode(program, pair.target, pair.drafter, generated_ragged["prompts"],
                             MAX_NEW, acceptance=acceptance_rule(program, pair))
    assert run.tokens == generated_ragged["reference"].tokens
    assert max(max(a) for a in run.accepted_lengths) >= 1   # drafts were verified, not only roots
    # Every attention of the ragged loop ran the varlen kernel over the whole pack.
    assert counts["varlen"] >= run.target_forwards and counts["dense"] == 0


def test_off_by_one_offsets_into_the_kernel_change_the_tokens(generated_ragged, monkeypatch):
    program, pair = generated_ragged["program"], generated_ragged["pair"]
    original = batch_layout.with_varlen_attention

    def shifted(model, cu, rows, capacity, *args, **kwargs):
        # Each request's first token is attributed to the request before it.
        return original(model, [cu[0]] + [x + 1 for x in cu[1:-1]] + [cu[-1]], rows, capacity,
                        *args, **kwargs)

    monkeypatch.setattr(batch_layout, "with_varlen_attention", shifted)
    run = run_program_decode(program, pair.target, pair.drafter, generated_ragged["prompts"],
                             MAX_NEW, acceptance=acceptance_rule(program, pair))
    assert run.tokens != generated_ragged["reference"].tokens


def test_export_describes_the_varlen_node_of_a_ragged_program(tmp_path):
    from specpilot.codegen.export import describe_node
    from specpilot.codegen.lower import lower_program
    from specpilot.deploy import build_deployment
    from specpilot.ir import SetBatchLayout, SetMaxBatchSize, apply, stock_program
    from hf_factory import make_checkpoint

    # Lowering needs head_dim >= 16 (the attention kernels' smallest): one checkpoint serves as
    # both models.
    target = make_checkpoint(tmp_path, "llama3", seed=3, **TINY)
    stock = stock_program(build_deployment(target, target, gpu="cpu", dtype="float32"))
    ragged = apply(apply(stock, SetMaxBatchSize(4)), SetBatchLayout("ragged"))
    nodes = [n for n in lower_program(ragged).nodes if n.op == "varlen_attention"]
    assert nodes and not [n for n in lower_program(stock).nodes if n.op == "varlen_attention"]
    line = describe_node(nodes[0])
    assert "packed without padding" in line and "query heads" in line
