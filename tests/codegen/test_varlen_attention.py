"""varlen_attention: requests packed without padding, per-token visibility as data.

References: `varlen_attention_ref` (attention_ref per request) and an independent float64
computation whose visible slots come from the trees themselves, not from the bit encoding.
"""
import math

import pytest
import torch

from kernel_checks import TORCH_DTYPES, assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.ragged import varlen_visibility, visibility_from_mask
from specpilot.runtime.reference_ops import varlen_attention_ref, varlen_visibility_mask


def random_parents(gen, n, chain):
    """Parents (-1 = child of the root) of a chain or of a random tree of n nodes."""
    if chain:
        return [i - 1 for i in range(n)]
    return [-1 if i == 0 else int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)]


def ancestors_or_self(parents, i):
    out = []
    while i != -1:
        out.append(i)
        i = parents[i]
    return out


def random_batch(gen, lengths, capacity, chain, pending=()):
    """Requests of `lengths` new tokens each: a committed prefix of random length, then
    optionally `pending[r]` causal tokens (a prefill or catch-up), then a chain or tree of the
    remaining tokens. Returns cu, rows (a permutation of cache rows), per-token
    (limits, extras) in request-local slots, and the visible slot sets, each computed directly."""
    cu, limits, extras, visible = [0], [], [], []
    for r, n in enumerate(lengths):
        causal = pending[r] if r < len(pending) else 0
        start = int(torch.randint(0, capacity - n, (1,), generator=gen))
        committed = start + causal                       # the tree sits at committed + i
        parents = random_parents(gen, n - causal, chain)
        for j in range(causal):
            limits.append(start + j + 1)
            extras.append(())
            visible.append(set(range(start + j + 1)))
        for i in range(n - causal):
            anc = [committed + a for a in ancestors_or_self(parents, i)]
            limits.append(committed)
            extras.append(tuple(anc))
            visible.append(set(range(committed)) | set(anc))
        cu.append(cu[-1] + n)
    rows = torch.randperm(len(lengths) + 1, generator=gen)[:len(lengths)].tolist()
    return cu, rows, limits, extras, visible


def float64_varlen(q, k, v, cu, rows, visible, scale):
    """Plain float64 softmax attention, one token and head at a time."""
    n, hq, d = q.shape
    group = hq // k.shape[2]
    out = torch.zeros(n, hq, d, dtype=torch.float64)
    for r, row in enumerate(rows):
        for t in range(cu[r], cu[r + 1]):
            slots = sorted(visible[t])
            for h in range(hq):
                keys = k[row, slots, h // group].double()
                scores = keys @ q[t, h].double() * scale
                out[t, h] = torch.softmax(scores, 0) @ v[row, slots, h // group].double()
    return out


def build(kernel_cache, dtype, head_dim, block_r=16, block_s=16):
    return build_triton_module(kernel_spec("varlen_attention", DTYPE=dtype, HEAD_DIM=head_dim,
                                           BLOCK_R=block_r, BLOCK_S=block_s), kernel_cache)


def run_case(module, dtype, lengths, hq, hkv, d, capacity, chain, device, seed, pending=()):
    gen = torch.Generator().manual_seed(seed)
    cu, rows, limits, extras, visible = random_batch(gen, lengths, capacity, chain, pending)
    torch_dtype = TORCH_DTYPES[dtype]
    n = cu[-1]
    q = randn(n, hq, d, dtype=torch_dtype, device=device)
    k = randn(len(rows) + 1, capacity, hkv, d, dtype=torch_dtype, device=device)
    v = randn(len(rows) + 1, capacity, hkv, d, dtype=torch_dtype, device=device)
    kv_limits, bits = varlen_visibility(limits, extras, device=device)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
    out = poisoned((n, hq, d), torch_dtype, device)
    scale = 0.7 / math.sqrt(d)
    module.launch(q, k, v, cu_t, rows_t, kv_limits, bits, out, scale=scale)
    expected = varlen_attention_ref(q, k, v, cu_t, rows_t, kv_limits, bits, scale=scale)
    exact = float64_varlen(q.cpu(), k.cpu(), v.cpu(), cu, rows, visible, scale)
    return out, expected, exact, dict(q=q, k=k, v=v, cu=cu, rows=rows_t, limits=kv_limits,
                                      bits=bits, scale=scale, visible=visible)


@pytest.mark.parametrize("dtype,lengths,hq,hkv,d,chain", [
    ("fp32", (4, 1, 7), 4, 4, 16, False),        # MHA, a request of one token
    ("bf16", (1, 5, 3, 2), 4, 2, 32, True),      # GQA 2, chains
    ("fp32", (6, 1), 8, 2, 64, False),           # GQA 4, head_dim 64
])
def test_matches_reference_and_float64(dtype, lengths, hq, hkv, d, chain, kernel_cache, device):
    module = build(kernel_cache, dtype, d)
    out, expected, exact, _ = run_case(module, dtype, lengths, hq, hkv, d, capacity=37,
                                       chain=chain, device=device, seed=sum(lengths) + d)
    assert_matches(out, expected, dtype)
    # The float64 check sees the kernel's rounding only: one rounding of the output for fp32,
    # the bf16 inputs' products being exact in float32.
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "fp32" else dict(rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(out.double().cpu(), exact.to(out.dtype).double(), **tol)


def test_causal_prefill_next_to_trees_and_wide_windows(kernel_cache, device):
    # A request whose 9 pending tokens are causal (a prefill sharing the forward) before its
    # tree, next to a tree of 40 nodes, whose window needs two words of bits.
    module = build(kernel_cache, "fp32", 16, block_r=32)
    out, expected, exact, inputs = run_case(module, "fp32", (12, 40, 1), 4, 2, 16, capacity=90,
                                            chain=False, device=device, seed=5, pending=(9,))
    assert inputs["bits"].shape[1] == 2
    assert_matches(out, expected, "fp32")
    torch.testing.assert_close(out.double().cpu(), exact, rtol=1e-5, atol=1e-5)


def test_encodings_agree_with_the_visible_sets(device):
    gen = torch.Generator().manual_seed(3)
    capacity = 80
    cu, rows, limits, extras, visible = random_batch(gen, (3, 35, 1, 6), capacity, chain=False,
                                                     pending=(2,))
    kv_limits, bits = varlen_visibility(limits, extras)
    mask = varlen_visibility_mask(kv_limits, bits, capacity)
    direct = torch.zeros(cu[-1], capacity, dtype=torch.bool)
    for t, slots in enumerate(visible):
        direct[t, sorted(slots)] = True
    assert torch.equal(mask, direct)
    # Read back off the dense mask, the visibility is the same mask (a leading run may absorb
    # a tree's first slot, so the encodings may differ while meaning the same).
    derived = visibility_from_mask(direct)
    assert torch.equal(varlen_visibility_mask(*derived, capacity), direct)
    # Bit 31 of a word (a negative int32) survives the round trip.
    assert (bits < 0).any()


def test_off_by_one_offsets_are_caught(kernel_cache, device):
    module = build(kernel_cache, "fp32", 16)
    out, expected, _, x = run_case(module, "fp32", (3, 4, 2), 4, 2, 16, capacity=30, chain=False,
                                   device=device, seed=9)
    assert_matches(out, expected, "fp32")
    # Each request's first token attributed to the request before it: the test must see it.
    cu = x["cu"]
    shifted = torch.tensor([cu[0]] + [c + 1 for c in cu[1:-1]] + [cu[-1]], dtype=torch.int32,
                           device=device)
    wrong = poisoned(out.shape, out.dtype, device)
    module.launch(x["q"], x["k"], x["v"], shifted, x["rows"], x["limits"], x["bits"], wrong,
                  scale=x["scale"])
    with pytest.raises(AssertionError):
        assert_matches(wrong, expected, "fp32")


def test_bad_offsets_are_refused(kernel_cache, device):
    module = build(kernel_cache, "fp32", 16)
    q = randn(5, 2, 16, dtype=torch.float32, device=device)
    k = randn(2, 8, 2, 16, dtype=torch.float32, device=device)
    limits = torch.full((5,), 3, dtype=torch.int32, device=device)
    bits = torch.zeros(5, 1, dtype=torch.int32, device=device)
    out = poisoned((5, 2, 16), torch.float32, device)
    rows = torch.tensor([0, 1], device=device)
    with pytest.raises(ValueError, match="cu_seqlens"):
        module.launch(q, k, k, torch.tensor([0, 3, 4], device=device), rows, limits, bits, out)
    with pytest.raises(ValueError, match="cache_rows"):
        module.launch(q, k, k, torch.tensor([0, 3, 5], device=device), rows + 1, limits, bits, out)
