"""attention kernel over a static KV cache: decode, causal verification, tree verification, GQA."""
import pytest
import torch

from kernel_checks import TORCH_DTYPES, assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import attention_ref


def prefix_then_block_mask(committed, block_visibility, capacity):
    """mask [B, T, S]: request b sees its committed slots [0, committed[b]) plus, among the T new
    tokens staged at slots committed[b] .. committed[b] + T - 1, those block_visibility[t] allows."""
    B, T = len(committed), block_visibility.shape[0]
    mask = torch.zeros(B, T, capacity, dtype=torch.bool)
    for b, length in enumerate(committed):
        mask[b, :, :length] = True
        mask[b, :, length:length + T] = block_visibility
    return mask


def tree_visibility(parents):
    """[N, N] ancestor-or-self visibility of a tree given parents (-1 = root)."""
    n = len(parents)
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            vis[i, j] = True
            j = parents[j]
    return vis


def run_attention(module, dtype, B, T, HQ, HKV, D, S, mask, device, kv_len=None, scale=None):
    q = randn(B, T, HQ, D, dtype=dtype, device=device)
    k_cache, v_cache = randn(B, S, HKV, D, dtype=dtype, device=device), randn(B, S, HKV, D, dtype=dtype, device=device)
    out = poisoned((B, T, HQ, D), dtype, device)
    mask = mask.to(device)
    module.launch(q, k_cache, v_cache, mask, out, scale=scale, kv_len=kv_len)
    expected = attention_ref(q, k_cache, v_cache, mask, scale=scale, kv_len=kv_len)
    return out, expected, (q, k_cache, v_cache, mask)


def test_decode_one_query_per_request_mqa(kernel_cache, device):
    module = build_triton_module(kernel_spec("attention", DTYPE="bf16", HEAD_DIM=16, BLOCK_S=16), kernel_cache)
    mask = prefix_then_block_mask([23, 9], torch.ones(1, 1, dtype=torch.bool), capacity=37)
    out, expected, _ = run_attention(module, torch.bfloat16, B=2, T=1, HQ=4, HKV=1, D=16, S=37,
                                  mask=mask, device=device)
    assert_matches(out, expected, "bf16")


@pytest.mark.parametrize("dtype,T,block_r", [("fp32", 7, 16), ("bf16", 4, 32)])
def test_causal_verification_block_gqa(dtype, T, block_r, kernel_cache, device):
    # Head dim 24 is not a power of two; 7 tokens x 3 heads per group spill into a second program.
    module = build_triton_module(kernel_spec("attention", DTYPE=dtype, HEAD_DIM=24, BLOCK_R=block_r,
                                             BLOCK_S=16), kernel_cache)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    mask = prefix_then_block_mask([5, 17], causal, capacity=29)
    out, expected, _ = run_attention(module, TORCH_DTYPES[dtype], B=2, T=T, HQ=6, HKV=2, D=24, S=29,
                                  mask=mask, device=device, scale=0.3)
    assert_matches(out, expected, dtype)


def test_tree_verification_with_kv_len_bound(kernel_cache, device):
    parents = [-1, -1, 0, 0, 2]
    vis = tree_visibility(parents)
    module = build_triton_module(kernel_spec("attention", DTYPE="bf16", HEAD_DIM=32, BLOCK_S=16), kernel_cache)
    committed = [11, 3]
    mask = prefix_then_block_mask(committed, vis, capacity=40)
    mask[:, :, 30:] = True  # garbage beyond kv_len must be ignored
    kv_len = torch.tensor([c + len(parents) for c in committed], device=device)
    out, expected, inputs = run_attention(module, torch.bfloat16, B=2, T=5, HQ=4, HKV=2, D=32, S=40,
                                  mask=mask, device=device, kv_len=kv_len)
    assert_matches(out, expected, "bf16")
    # The bound matters: without kv_len the slots past it would be attended to.
    unbounded = attention_ref(*inputs)
    assert (unbounded.float() - expected.float()).abs().max() > 0.05


def test_random_mask_and_fully_masked_rows_give_zeros(kernel_cache, device):
    module = build_triton_module(kernel_spec("attention", DTYPE="fp32", HEAD_DIM=16, BLOCK_S=32), kernel_cache)
    B, T, S = 2, 3, 45
    mask = torch.rand(B, T, S) < 0.3
    mask[1, 2] = False  # this query sees nothing
    out, expected, _ = run_attention(module, torch.float32, B=B, T=T, HQ=2, HKV=2, D=16, S=S,
                                  mask=mask, device=device)
    assert_matches(out, expected, "fp32")
    assert torch.equal(out[1, 2].cpu(), torch.zeros(2, 16))


def test_the_kernel_finds_each_requests_bound_in_the_mask_and_stops_there(kernel_cache, device):
    """kv_len_out: each request's bound as the kernel reads it from the mask, checked by hand
    (causal rows, a tree node's holes, a request that sees nothing, more query rows than one
    program holds), written once per request. Slots past a bound hold NaN: a walk over them
    would multiply a zero weight by NaN, so matching the reference shows the walk stopped."""
    # 6 heads over 2 kv heads and 7 tokens: 21 rows a kv head, two programs of 16 rows each
    module = build_triton_module(kernel_spec("attention", DTYPE="fp32", HEAD_DIM=16, BLOCK_S=16),
                                 kernel_cache)
    B, T, S, HQ, HKV, D = 3, 7, 300, 6, 2, 16
    mask = torch.zeros(B, T, S, dtype=torch.bool)
    for t in range(T):
        mask[0, t, :40 + t] = True                    # causal: the last row sees 46 slots
    mask[1, :, [0, 1, 2]] = True                      # tree nodes: ancestors, then themselves
    mask[1, 3, 261] = True                            # past the first 256-slot scan step
    mask[1, 5, 130] = True
    ends = torch.tensor([46, 262, 0], dtype=torch.int32)
    q = randn(B, T, HQ, D, dtype=torch.float32, device=device)
    k_cache, v_cache = (randn(B, S, HKV, D, dtype=torch.float32, device=device) for _ in range(2))
    k_nan, v_nan = k_cache.clone(), v_cache.clone()
    for b, end in enumerate(ends.tolist()):
        k_nan[b, end:] = float("nan")
        v_nan[b, end:] = float("nan")
    out = poisoned((B, T, HQ, D), torch.float32, device)
    found = poisoned((B,), torch.int32, device)
    module.launch(q, k_nan, v_nan, mask.to(device), out, kv_len_out=found)
    assert found.cpu().tolist() == ends.tolist()
    expected = attention_ref(q, k_cache, v_cache, mask.to(device))
    assert_matches(out, expected, "fp32")
    assert torch.equal(out[2].cpu(), torch.zeros(T, HQ, D))       # sees nothing: zeros
    with pytest.raises(ValueError, match="not both"):
        module.launch(q, k_cache, v_cache, mask.to(device), out, kv_len=ends.to(device),
                      kv_len_out=found)


@pytest.mark.parametrize("splits,dtype", [(2, "fp32"), (4, "bf16"), (3, "fp32")])
def test_split_walks_merge_to_the_reference(kernel_cache, device, splits, dtype):
    """SPLITS programs share each row block's walk and the last merges their partials: the
    output is the reference's with a bound given, a bound found in the mask (the slots past it
    NaN, so a walk past it would show), a request whose slots do not divide among the splits,
    one shorter than a split's share and one that sees nothing; launched twice on one
    workspace, which each launch leaves as found."""
    module = build_triton_module(kernel_spec("attention", DTYPE=dtype, HEAD_DIM=16, BLOCK_S=16,
                                             SPLITS=splits), kernel_cache)
    B, T, S, HQ, HKV, D = 4, 2, 200, 6, 2, 16
    ends = [157, 9, 0, 200]
    mask = torch.zeros(B, T, S, dtype=torch.bool)
    for b, end in enumerate(ends):
        for t in range(T):
            mask[b, t, :max(0, end - T + 1 + t)] = True
    mask[0, 1, 60:70] = False                         # holes in a causal row
    q = randn(B, T, HQ, D, dtype=TORCH_DTYPES[dtype], device=device)
    k_cache, v_cache = (randn(B, S, HKV, D, dtype=TORCH_DTYPES[dtype], device=device)
                        for _ in range(2))
    k_nan, v_nan = k_cache.clone(), v_cache.clone()
    for b, end in enumerate(ends):
        k_nan[b, end:] = float("nan")
        v_nan[b, end:] = float("nan")
    expected = attention_ref(q, k_cache, v_cache, mask.to(device))
    workspace = module.split_workspace(B, T, HQ, HKV, device)
    for _ in range(2):
        out = poisoned((B, T, HQ, D), TORCH_DTYPES[dtype], device)
        found = poisoned((B,), torch.int32, device)
        module.launch(q, k_nan, v_nan, mask.to(device), out, kv_len_out=found,
                      workspace=workspace)
        assert found.cpu().tolist() == ends
        assert_matches(out, expected, dtype)
        assert torch.equal(out[2].cpu().float(), torch.zeros(T, HQ, D))
        assert not workspace[0].cpu().any()            # every count back at zero
    out = poisoned((B, T, HQ, D), TORCH_DTYPES[dtype], device)
    module.launch(q, k_nan, v_nan, mask.to(device), out,
                  kv_len=torch.tensor(ends, device=device), workspace=workspace)
    assert_matches(out, expected, dtype)
    with pytest.raises(ValueError, match="split_workspace"):
        module.launch(q, k_cache, v_cache, mask.to(device), out)
    single = build_triton_module(kernel_spec("attention", DTYPE=dtype, HEAD_DIM=16, BLOCK_S=16),
                                 kernel_cache)
    with pytest.raises(ValueError, match="no workspace"):
        single.launch(q, k_cache, v_cache, mask.to(device), out, workspace=workspace)


@pytest.mark.parametrize("splits", [1, 4])
def test_positions_in_place_of_a_mask_see_every_slot_up_to_their_own(kernel_cache, device,
                                                                      splits):
    """mask None, positions [B, T]: a query at position p sees slots 0..p, as the mask
    slot <= p does. Slots past each request's last position hold NaN, so a walk past it would
    show; 7 tokens of 3 heads a group need two row blocks, each bounded by its own rows."""
    module = build_triton_module(kernel_spec("attention", DTYPE="fp32", HEAD_DIM=16, BLOCK_S=16,
                                             SPLITS=splits), kernel_cache)
    B, T, S, HQ, HKV, D = 3, 7, 90, 6, 2, 16
    starts = torch.tensor([40, 3, 83])
    positions = starts[:, None] + torch.arange(T)[None, :]
    mask = torch.arange(S)[None, None, :] <= positions[:, :, None]
    q = randn(B, T, HQ, D, dtype=torch.float32, device=device)
    k_cache, v_cache = (randn(B, S, HKV, D, dtype=torch.float32, device=device) for _ in range(2))
    k_nan, v_nan = k_cache.clone(), v_cache.clone()
    for b in range(B):
        k_nan[b, int(positions[b, -1]) + 1:] = float("nan")
        v_nan[b, int(positions[b, -1]) + 1:] = float("nan")
    workspace = module.split_workspace(B, T, HQ, HKV, device) if splits > 1 else None
    out = poisoned((B, T, HQ, D), torch.float32, device)
    module.launch(q, k_nan, v_nan, None, out, positions=positions.to(device),
                  workspace=workspace)
    assert_matches(out, attention_ref(q, k_cache, v_cache, mask.to(device)), "fp32")
    with pytest.raises(ValueError, match="not both"):
        module.launch(q, k_cache, v_cache, mask.to(device), out,
                      positions=positions.to(device), workspace=workspace)
    with pytest.raises(ValueError, match="no kv_len"):
        module.launch(q, k_cache, v_cache, None, out, positions=positions.to(device),
                      kv_len=positions[:, -1].to(device) + 1, workspace=workspace)
