"""runtime/fused_forward.py: a model's forward in the fused layer kernels against the model's
own per-op forward, and as a chain decoder's drafter. On the CPU the kernels run in Triton's
interpreter; with a GPU, natively on CUDA tensors."""
import pytest
import torch

from specpilot.ir import DynamicTree, Tree
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.fused_forward import FusedForward, fused_forward_refusal
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.checkpoint import load_checkpoint
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_program import graphed_decoder
from specpilot.runtime.model import Transformer

from hf_factory import FUSABLE, kernel_device, make_checkpoint, with_noise
from mechanism_setup import pair_setup

DEVICE = kernel_device()

# head_dim 32 (the dot path) and 16 (multiply-add), GQA, an odd vocabulary, llama3.1 RoPE scaling.
SHAPES = {"dot": FUSABLE,
          "fma": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3,
                      intermediate_size=40)}


def _steps(model, forward, batch, prompt_len, steps, capacity, seed):
    """Logits of a prefill of `prompt_len` tokens per row, then `steps` one-token steps of
    each row's argmax, with rows at different offsets (row r starts at slot r): every call's
    logits and the cache after them."""
    g = torch.Generator().manual_seed(seed)
    cache = model.new_cache(batch, capacity)
    slot_ids = torch.arange(capacity, device=DEVICE)[None, None, :]
    tokens = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=g).to(DEVICE)
    pos = (torch.arange(batch)[:, None] + torch.arange(prompt_len)[None, :]).to(DEVICE)
    out = []
    for _ in range(steps + 1):
        logits = forward(tokens, pos, pos, slot_ids <= pos[:, :, None], cache)
        out.append(logits)
        tokens = logits[:, -1].argmax(-1)[:, None]
        pos = pos[:, -1:] + 1
    return out, cache


def _chain_call(model, starts, t, capacity, g):
    """A call's tokens [B, t] (random), positions starts[b] + 0..t-1 and the mask of a chain's
    layout over `capacity` slots (position p sees slots 0..p), on DEVICE."""
    tokens = torch.randint(0, model.config.vocab_size, (len(starts), t), generator=g).to(DEVICE)
    pos = (torch.tensor(starts)[:, None] + torch.arange(t)[None, :]).to(DEVICE)
    return tokens, pos, torch.arange(capacity, device=DEVICE)[None, None, :] <= pos[:, :, None]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("family", ["llama3", "llama3.1"])
@pytest.mark.parametrize("fold", [False, True])
def test_fused_forward_equals_the_per_op_forward_in_float32(shape, family, fold, tmp_path):
    """Unfolded, and folded (o_proj and down_proj added into a float32 stream by the attention
    and the MLP: in float32 the per-op forward's sums up to their order)."""
    folder = make_checkpoint(tmp_path, family, seed=3, **SHAPES[shape])
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model, fold=fold)
    assert fused.folded == fold and ("o_proj" in fused.kernel_modules()) != fold
    if fold and shape == "dot" and family == "llama3":
        from specpilot.runtime.fused_forward import fused_specs
        unfolded_head = {"head": fused_specs(model, fold=False)["head"]}
        with pytest.raises(SpecPilotError, match="mix folded and unfolded kernels: .*head"):
            FusedForward(model, specs=unfolded_head, fold=True)
    expected, cache_ref = _steps(model, model.forward, 3, 5, 3, 16, seed=1)
    actual, cache = _steps(model, fused.forward, 3, 5, 3, 16, seed=1)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == torch.float32
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(cache.k + cache.v, cache_ref.k + cache_ref.v):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert torch.equal(cache.positions, cache_ref.positions)


@pytest.mark.parametrize("fold", [False, True])
def test_fused_forward_picks_logit_rows_and_follows_the_model_in_bfloat16(fold, tmp_path):
    folder = make_checkpoint(tmp_path, "llama3", seed=5, **SHAPES["dot"])
    model = Transformer.from_checkpoint(folder, dtype="bfloat16", device=DEVICE)
    fused = FusedForward(model, fold=fold)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, model.config.vocab_size, (2, 6), generator=g).to(DEVICE)
    pos = torch.arange(6, device=DEVICE)[None, :].expand(2, 6).contiguous()
    mask = torch.arange(12, device=DEVICE)[None, None, :] <= pos[:, :, None]
    picked = torch.tensor([[5, 1], [0, 3]], device=DEVICE)
    mine = fused.forward(tokens, pos, pos, mask, model.new_cache(2, 12), picked)
    theirs = model.forward(tokens, pos, pos, mask, model.new_cache(2, 12), picked)
    assert mine.shape == (2, 2, model.config.vocab_size)
    # bf16 roundings: the MLP rounds once (gate_up_silu's numerics) where the per-op path
    # rounds its gate, up and product, and folded the residual stream is float32 where the
    # per-op path rounds it after each add, so logits agree to bf16 precision, not bit for bit.
    torch.testing.assert_close(mine, theirs, rtol=0.05, atol=0.15)
    assert (mine.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.75


# New tokens a decode here runs: fewer than the mechanism tests' (the interpreter runs every
# fused drafter step), still several rounds a request with rows finishing apart.
NEW = 10


def _pair_on_device(seed=11):
    """The mechanism tests' pair of `seed` (its drafter fusable) on DEVICE, and greedy AR's
    output of NEW tokens there: (setup, target, drafter, reference)."""
    s = pair_setup(seed)
    target, drafter = s["target"], s["drafter"]
    if DEVICE == "cuda":    # the same models on the GPU, and greedy AR there as the reference
        ckpt = load_checkpoint(s["target_dir"])
        target = Transformer(ckpt.config, ckpt.tensors, torch.float32, DEVICE)
        drafter = Transformer(ckpt.config, with_noise(ckpt.tensors, 0.1, seed + 7),
                              torch.float32, DEVICE)
    reference = generate_ar(target, s["prompts"], NEW, eos_ids=s["eos"])
    return s, target, drafter, reference


@pytest.mark.parametrize("fold", [False, True])
def test_a_fused_drafter_drafts_what_the_model_drafts_and_keeps_the_output(fold):
    k, batch = 3, 4
    s, target, drafter, reference = _pair_on_device()
    plain = GraphedChainDecoder(target, drafter, batch, 48, k, s["eos"], capture=False)
    fast = GraphedChainDecoder(target, FusedForward(drafter, fold=fold), batch, 48, k, s["eos"],
                               capture=False)
    for start in range(0, len(s["prompts"]), batch):
        prompts = s["prompts"][start:start + batch]
        a, b = plain.generate(prompts, NEW), fast.generate(prompts, NEW)
        assert b.tokens == a.tokens == reference.tokens[start:start + batch]
        # The same drafts accepted round by round: in float32 the fused drafter proposes the
        # per-op drafter's tokens.
        assert b.accepted_lengths == a.accepted_lengths
        assert sum(map(sum, b.accepted_lengths)) > 0    # drafts were accepted: not all rejected


@pytest.mark.parametrize("family,overrides,reason", [
    ("qwen3", {}, "q/k norms"),
    ("qwen2", dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1), "biases"),
    ("mistral", dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1), "sliding-window"),
    ("llama3", {}, "head_dim 8"),
    ("llama3", dict(hidden_size=1040, num_attention_heads=2, num_key_value_heads=1,
                    intermediate_size=32), "head_dim 520"),
])
def test_models_the_fused_kernels_cannot_run_are_refused_with_why(family, overrides, reason, tmp_path):
    model = Transformer.from_checkpoint(make_checkpoint(tmp_path, family, **overrides),
                                        device=DEVICE)
    assert reason in fused_forward_refusal(model)
    with pytest.raises(SpecPilotError, match="cannot run this model"):
        FusedForward(model)


@pytest.mark.parametrize("logits_at,fold", [(False, False), (True, False), (True, True)])
def test_greedy_is_the_argmax_of_the_forwards_logits(logits_at, fold, tmp_path, monkeypatch):
    """`greedy` (the argmax in the LM head's kernel) against torch.argmax of `forward`'s logits
    for the same call on a copy of the cache: 18 rows (two row blocks of the head), and the rows
    logits_at picks; and through `greedy_tokens`, which a model without `greedy` serves by
    torch.argmax."""
    from specpilot.runtime.steps import greedy_tokens

    folder = make_checkpoint(tmp_path, "llama3", seed=5, **FUSABLE)
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model, fold=fold)
    g = torch.Generator().manual_seed(11)
    b, t, capacity = 6, 3, 12
    tokens, pos, mask = _chain_call(model, list(range(b)), t, capacity, g)
    at = torch.randint(0, t, (b, 2), generator=g).to(DEVICE) if logits_at else None
    logits = fused.forward(tokens, pos, pos, mask, model.new_cache(b, capacity), at)
    found = greedy_tokens(fused, tokens, pos, pos, mask, model.new_cache(b, capacity), at)
    assert found.shape == logits.shape[:2] and found.dtype == torch.int64
    assert torch.equal(found, logits.argmax(-1))
    again = fused.greedy(tokens, pos, pos, mask, model.new_cache(b, capacity), at)
    assert torch.equal(again, found)                     # the workspace served a second call
    per_op = greedy_tokens(model, tokens, pos, pos, mask, model.new_cache(b, capacity), at)
    expected = model.forward(tokens, pos, pos, mask, model.new_cache(b, capacity), at)
    assert torch.equal(per_op, expected.argmax(-1))
    # past MAX_FUSED_TOKENS new tokens a call, the model's own forward answers, as `forward`
    from specpilot.runtime import fused_forward
    monkeypatch.setattr(fused_forward, "MAX_FUSED_TOKENS", b * t - 1)
    assert torch.equal(fused.greedy(tokens, pos, pos, mask, model.new_cache(b, capacity), at),
                       per_op)


def test_the_attention_walks_each_request_up_to_its_last_visible_slot(tmp_path):
    """The first layer's attention finds each request's bound in the mask and every layer stops
    there (the kernel's own test checks the bounds by hand): with NaN in every cache slot past
    it (masked, but a walk over them would multiply a zero weight by NaN), the forward's logits
    are the model's on a clean cache."""
    folder = make_checkpoint(tmp_path, "llama3", seed=7, **FUSABLE)
    fused = FusedForward(Transformer.from_checkpoint(folder, device=DEVICE))
    model = fused.model
    prompt = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator()
                           .manual_seed(3)).to(DEVICE)
    pos = torch.tensor([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]], device=DEVICE)
    slot_ids = torch.arange(12, device=DEVICE)[None, None, :]
    clean, poisoned = model.new_cache(2, 12), model.new_cache(2, 12)
    for layer in range(len(poisoned.v)):   # each request's own end: 5 and 7
        for row, end in ((0, 5), (1, 7)):
            poisoned.k[layer][row, end:] = float("nan")
            poisoned.v[layer][row, end:] = float("nan")
    expected = model.forward(prompt, pos, pos, slot_ids <= pos[:, :, None], clean)
    actual = fused.forward(prompt, pos, pos, slot_ids <= pos[:, :, None], poisoned)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_a_mask_given_as_rows_of_a_wider_mask_is_read_as_those_rows(tmp_path):
    # A tree level's mask is a slice of its round's mask (runtime/graphed_tree.py): rows apart
    # by more than one row's width, which the kernels read through the mask's strides uncopied.
    folder = make_checkpoint(tmp_path, "llama3", seed=7, **FUSABLE)
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model)
    g = torch.Generator().manual_seed(4)
    batch, capacity, width = 2, 24, 3
    context = torch.randint(0, model.config.vocab_size, (batch, 8), generator=g).to(DEVICE)
    tokens = torch.randint(0, model.config.vocab_size, (batch, width), generator=g).to(DEVICE)
    slot_ids = torch.arange(capacity, device=DEVICE)[None, None, :]
    pos = torch.arange(8, device=DEVICE)[None, :].expand(batch, 8)
    new_pos = (8 + torch.arange(width, device=DEVICE))[None, :].expand(batch, width)
    # Rows 2..4 of a 6-row mask: causal over the context and the new tokens, one row masked
    # further at random, so that a row read from the wrong place gives other logits.
    wide = (slot_ids <= (6 + torch.arange(6, device=DEVICE))[None, :, None]).expand(batch, 6,
                                                                                  capacity).clone()
    wide[:, 3, 2] = False
    rows = wide[:, 2:2 + width]
    assert not rows.is_contiguous()
    logits = {}
    for name, mask in (("slice", rows), ("copy", rows.contiguous())):
        cache = model.new_cache(batch, capacity)
        model.forward(context, pos, pos, slot_ids <= pos[:, :, None], cache)
        logits[name] = fused.forward(tokens, new_pos, new_pos, mask, cache)
    torch.testing.assert_close(logits["slice"], logits["copy"], rtol=0, atol=0)
    cache = model.new_cache(batch, capacity)
    model.forward(context, pos, pos, slot_ids <= pos[:, :, None], cache)
    torch.testing.assert_close(logits["slice"],
                               model.forward(tokens, new_pos, new_pos, rows.contiguous(), cache),
                               rtol=1e-4, atol=1e-4)


# A sparse tree runs the static tree's decoder: the interpreter's time goes to these three.
@pytest.mark.parametrize("topology, slots", [(Tree((3, 2, 1)), 4),
                                             (DynamicTree(budget=6, depth=3, width=2), 4),
                                             (Tree((3, 2, 1)), 2)])
def test_a_fused_drafter_drafts_a_tree_as_the_model_does(topology, slots):
    """Tree rounds' drafter levels (several nodes a request, each level's mask rows of the
    round's tree mask) in the fused kernels: the same trees drafted and accepted as with the
    per-op drafter, and greedy AR's output. With 2 slots for the 4 prompts, the tree refill
    decoder: two newcomers prefilled into finished rows' slots. Captured on a GPU."""
    s, target, drafter, reference = _pair_on_device()
    prompts = s["prompts"]          # mixed lengths (the interpreter is slow: 4 of them)
    assert len(prompts) == 4
    refill = slots < len(prompts)
    captured = DEVICE == "cuda"     # on the GPU, the rounds as CUDA graphs: the fused kernels
    plain = graphed_decoder(target, drafter, slots, 64, topology, s["eos"], capture=captured,
                            refill=refill)
    fast = graphed_decoder(target, FusedForward(drafter), slots, 64, topology, s["eos"],
                           capture=captured, refill=refill)
    a, b = plain.generate(prompts, NEW), fast.generate(prompts, NEW)
    assert b.tokens == a.tokens == reference.tokens
    assert b.accepted_lengths == a.accepted_lengths
    assert sum(map(sum, b.accepted_lengths)) > 0


@pytest.mark.parametrize("fold", [False, True])
def test_the_cost_model_counts_the_fused_drafter_steps_launches(fold, tmp_path, monkeypatch):
    """A drafting step of the fused forward (`greedy`) launches five kernels a layer (three
    folded) and the LM head, nothing for the attention's bound or the argmax, as counted by
    wrapping every module's `launch`; the cost model's fused forward counts the same, and
    folded the fill that zeroes the residual stream's sums (a torch launch, not a module's)."""
    from specpilot.codegen import fused_layer
    from specpilot.cost.gpu_specs import gpu_spec
    from specpilot.cost.roofline import forward_cost
    from specpilot.deploy import model_spec_from_config

    monkeypatch.setattr(fused_layer, "FOLD_RESIDUAL", fold)     # the default both read
    folder = make_checkpoint(tmp_path, "llama3", seed=5, **FUSABLE)
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model)
    assert fused.folded == fold
    launched = []
    modules = {}      # o_proj and down_proj share one module where their tiles are the same
    for name, built in fused.kernel_modules().items():     # the attention: one a split count
        for module in built:
            modules.setdefault(id(module), (name, module))
    for name, module in modules.values():
        plain = module.launch
        monkeypatch.setattr(module, "launch",
                            lambda *a, _plain=plain, _name=name, **k: (launched.append(_name),
                                                                        _plain(*a, **k))[1])
    b, capacity = 3, 8
    tokens, pos, mask = _chain_call(model, [2, 4, 1], 1, capacity,
                                    torch.Generator().manual_seed(1))
    fused.greedy(tokens, pos, pos, mask, model.new_cache(b, capacity))
    layers = model.config.num_layers
    assert len(launched) == (3 if fold else 5) * layers + 1 and launched[-1] == "head_argmax"
    assert ("o_proj" in launched) != fold and ("down" in launched) != fold
    spec = model_spec_from_config(model.config, "drafter", "bfloat16", str(folder))
    cost = forward_cost("draft", "draft", spec, b, 1, 4, gpu_spec("h100"), fused=True)
    assert cost.launches == len(launched) + fold


def test_no_mask_reads_as_slots_up_to_each_position(tmp_path, monkeypatch):
    """mask None (a chain's layout: position p sees slots 0..p): the same logits and cache as
    the mask that says so (to float32 rounding: bounded by its own rows' positions, a program's
    split walk may share the slots out otherwise than under the mask's bound), through the
    fused kernels and, past MAX_FUSED_TOKENS, bit for bit through the model's own forward; a
    chain decoder's fused drafter takes no mask."""
    folder = make_checkpoint(tmp_path, "llama3", seed=7, **FUSABLE)
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model)
    g = torch.Generator().manual_seed(3)
    b, t, capacity = 3, 4, 20
    tokens, pos, mask = _chain_call(model, [0, 5, 11], t, capacity, g)
    caches = [model.new_cache(b, capacity) for _ in range(2)]
    for mine, twin in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        mine.copy_(torch.randn(mine.shape, generator=g).to(mine))   # K/V in the earlier
        twin.copy_(mine)                                              # slots, as a decode's
    with_mask = fused.forward(tokens, pos, pos, mask, caches[0])
    without = fused.forward(tokens, pos, pos, None, caches[1])
    torch.testing.assert_close(with_mask, without, rtol=1e-5, atol=1e-5)
    for x, y in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    from specpilot.runtime import fused_forward
    monkeypatch.setattr(fused_forward, "MAX_FUSED_TOKENS", b * t - 1)
    wide = fused.greedy(tokens, pos, pos, None, model.new_cache(b, capacity))
    assert torch.equal(wide, model.forward(tokens, pos, pos, mask,
                                           model.new_cache(b, capacity)).argmax(-1))
    assert FusedForward.sees_by_position and not getattr(model, "sees_by_position", False)


def test_each_launch_takes_the_splits_its_walks_fit(tmp_path, monkeypatch):
    """The attention at 4, 2 and 1 splits, picked per call by its walks (request, kv head, row
    block) against the programs a launch may have: with room for 8 programs, 2 walks take 4
    splits, 3 take 2 and 5 take 1; each call's logits are the model's own."""
    from specpilot.codegen import fused_layer

    folder = make_checkpoint(tmp_path, "llama3", seed=9, **FUSABLE)     # 1 kv head
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model)
    assert sorted(fused._attention_by_splits) == [1, 2, 4]
    monkeypatch.setattr(fused_layer, "MAX_PROGRAMS", 8)
    g = torch.Generator().manual_seed(4)
    for b, splits in ((2, 4), (3, 2), (5, 1)):
        module, workspace = fused._attention_for(b, 1)
        assert module is fused._attention_by_splits[splits]
        assert (workspace is None) == (splits == 1)
        tokens, pos, mask = _chain_call(model, list(range(3, 3 + b)), 1, 12, g)
        torch.testing.assert_close(fused.forward(tokens, pos, pos, None, model.new_cache(b, 12)),
                                   model.forward(tokens, pos, pos, mask, model.new_cache(b, 12)),
                                   rtol=1e-4, atol=1e-4)


def test_a_twin_with_its_own_workspaces_shares_the_weights_and_gives_the_same_logits(tmp_path):
    """`with_own_workspaces`: the kernels and weights are the forward's own, the split
    attention's partials and counts and the head's argmax workspace are not (two forwards on
    two streams at once must not merge into each other's), and it computes what the forward
    does, split walks included."""
    folder = make_checkpoint(tmp_path, "llama3", seed=13, **FUSABLE)
    model = Transformer.from_checkpoint(folder, device=DEVICE)
    fused = FusedForward(model)
    twin = fused.with_own_workspaces()
    assert twin.model is model and twin.fused_layers is fused.fused_layers
    assert twin._attention_by_splits is fused._attention_by_splits
    assert fused._attention_workspace is not None       # this shape's calls below split
    assert twin._attention_workspace is not fused._attention_workspace
    assert twin._argmax_workspace is not fused._argmax_workspace
    for a, b in ((twin._attention_workspace, fused._attention_workspace),
                 (twin._argmax_workspace, fused._argmax_workspace)):
        parts_a = a if isinstance(a, (tuple, list)) else [a]
        parts_b = b if isinstance(b, (tuple, list)) else [b]
        for x, y in zip(parts_a, parts_b):
            assert x.data_ptr() != y.data_ptr() and x.shape == y.shape
    g = torch.Generator().manual_seed(5)
    tokens, pos, _ = _chain_call(model, [2, 7], 1, 12, g)
    assert fused._attention_for(2, 1)[1] is fused._attention_workspace   # split: the workspace
    assert twin._attention_for(2, 1)[1] is twin._attention_workspace
    caches = [model.new_cache(2, 12) for _ in range(2)]
    for mine, other in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        mine.copy_(torch.randn(mine.shape, generator=g).to(mine))
        other.copy_(mine)
    torch.testing.assert_close(twin.forward(tokens, pos, pos, None, caches[0]),
                               fused.forward(tokens, pos, pos, None, caches[1]),
                               rtol=0, atol=0)
    assert torch.equal(twin.greedy(tokens + 1, pos + 1, pos + 1, None, caches[0]),
                       fused.greedy(tokens + 1, pos + 1, pos + 1, None, caches[1]))
