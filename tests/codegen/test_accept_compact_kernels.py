"""greedy_accept (chains and trees) and kv_compact kernels against the references."""
import pytest
import torch

from kernel_checks import assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import greedy_accept_ref, kv_compact_ref


def run_greedy(module, logits, tokens, parents, device):
    B, rows, _ = logits.shape
    outs = [poisoned(shape, torch.int64, device) for shape in ((B, rows), (B,), (B, rows - 1), (B,))]
    module.launch(logits.to(device), tokens.to(device), parents.to(device), *outs)
    return [o.cpu() for o in outs]


def plant_path(logits, tokens, parents, b, nodes):
    """Make request b's target agree with the draft along `nodes` (a root-to-leaf path)."""
    pred = logits[b].argmax(-1)
    row = parents if parents.dim() == 1 else parents[b]
    for node in nodes:
        tokens[b, node] = pred[row[node] + 1]


def test_chain_acceptance_lengths(kernel_cache, device):
    module = build_triton_module(kernel_spec("greedy_accept", BLOCK_V=64), kernel_cache)
    B, N, V = 4, 5, 150  # V spans several BLOCK_V steps and ends mid-block
    parents = torch.arange(-1, N - 1)
    logits = torch.randn(B, N + 1, V)
    tokens = torch.randint(0, V, (B, N))
    # Request b gets its first `accepted` drafts right and the next one wrong.
    for b, accepted in enumerate([0, 2, 5, 3]):
        plant_path(logits, tokens, parents, b, list(range(accepted)))
        if accepted < N:  # make sure the chain breaks right there
            pred = logits[b].argmax(-1)
            tokens[b, accepted] = (pred[accepted] + 1) % V
    plant_path(logits, tokens, parents, 3, [4])  # a match after the break must not count
    got = run_greedy(module, logits, tokens, parents, device)
    expected = greedy_accept_ref(logits, tokens, parents)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
    assert got[1].tolist() == [0, 2, 5, 3]


def test_tree_acceptance_with_per_request_parents_and_duplicate_siblings(kernel_cache, device):
    module = build_triton_module(kernel_spec("greedy_accept", BLOCK_V=128), kernel_cache)
    B, N, V = 3, 7, 100
    parents = torch.tensor([[-1, -1, 0, 0, 2, 4, 1],
                            [-1, 0, 0, 1, 1, 2, 3],
                            [-1, -1, -1, 0, 1, 2, 5]])
    logits = randn(B, N + 1, V, dtype=torch.bfloat16, device="cpu")
    tokens = torch.randint(0, V, (B, N))
    plant_path(logits, tokens, parents, 0, [0, 2, 4, 5])
    plant_path(logits, tokens, parents, 1, [0, 1, 3])
    tokens[1, 2] = tokens[1, 1]  # duplicate sibling of node 1: the walk keeps the first
    plant_path(logits, tokens, parents, 2, [2, 5, 6])
    got = run_greedy(module, logits, tokens, parents, device)
    expected = greedy_accept_ref(logits, tokens, parents)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
    assert got[2][0].tolist()[:4] == [0, 2, 4, 5]


def test_argmax_ties_pick_the_first_index_across_blocks(kernel_cache, device):
    module = build_triton_module(kernel_spec("greedy_accept", BLOCK_V=64), kernel_cache)
    logits = torch.randn(1, 2, 200)
    logits[0, 0, [70, 150]] = 9.0   # tie across two vocabulary blocks
    logits[0, 1, [3, 40]] = 9.0     # tie inside one block
    tokens = torch.tensor([[70]])
    got = run_greedy(module, logits, tokens, torch.tensor([-1]), device)
    assert got[0].tolist() == [[70, 3]]
    assert got[1].tolist() == [1] and got[2].tolist() == [[0]] and got[3].tolist() == [3]


def test_no_draft_tokens_gives_the_bonus_only(kernel_cache, device):
    module = build_triton_module(kernel_spec("greedy_accept", BLOCK_V=64), kernel_cache)
    logits = torch.randn(2, 1, 90)
    got = run_greedy(module, logits, torch.zeros(2, 0, dtype=torch.int64),
                     torch.zeros(0, dtype=torch.int64), device)
    assert got[1].tolist() == [0, 0]
    assert torch.equal(got[3], logits[:, 0].argmax(-1))


@pytest.mark.parametrize("layers", [None, 3])
def test_kv_compact_moves_accepted_rows_in_place(layers, kernel_cache, device):
    module = build_triton_module(kernel_spec("kv_compact", BLOCK=32), kernel_cache)
    B, S, HKV, D = 3, 16, 2, 20  # a row of 40 elements spans two programs of 32
    shape = (B, S, HKV, D) if layers is None else (layers, B, S, HKV, D)
    k_cache = randn(*shape, dtype=torch.bfloat16, device=device)
    v_cache = randn(*shape, dtype=torch.bfloat16, device=device)
    # Request 0: tree staged at slots 6..11, accepted nodes in slots 7, 9, 10 go to 6, 7, 8 (slot 7
    # is read as a source before it is overwritten as a destination).
    # Request 1: already in place (sources equal destinations). Request 2: nothing accepted.
    src_slots = torch.tensor([[7, 9, 10, 0], [4, 5, 0, 0], [0, 0, 0, 0]], device=device)
    dst_start = torch.tensor([6, 4, 12], device=device)
    counts = torch.tensor([3, 2, 0], device=device)
    before = k_cache.clone()
    expected_k = kv_compact_ref(k_cache, src_slots, dst_start, counts)
    expected_v = kv_compact_ref(v_cache, src_slots, dst_start, counts)
    assert not torch.equal(expected_k, before)  # the case really moves rows
    module.launch(k_cache, v_cache, src_slots, dst_start, counts)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
