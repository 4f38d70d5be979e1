"""Ragged verification layout: requests packed without padding, kernels taking per-request
offsets. The offset kernels are checked against float64 / per-request references, the decode
against greedy AR and by forcing, and off-by-one offsets must be caught.
"""
import pytest
import torch

from specpilot.ir.topology import Chain, DynamicTree, Tree
from specpilot.runtime import batch_layout, step_loop
from specpilot.runtime.acceptance import greedy_accept
from specpilot.runtime.dynamic_tree import DynamicProposer
from specpilot.runtime.ragged import VarlenAttention, ragged_greedy_accept
from specpilot.runtime.row_tree import RowTree
from specpilot.runtime.torch_backend import TorchBackend
from specpilot.runtime.tree_drafting import StaticProposer

from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import SEEDS, assert_caught, assert_clean, decode, force, pair_setup

PROPOSERS = {"chain3": lambda: StaticProposer(Chain(3)),
             "tree22": lambda: StaticProposer(Tree((2, 2))),
             "dynamic": lambda: DynamicProposer(DynamicTree(6, 3, 3))}


def test_varlen_attention_matches_float64_reference():
    gen = torch.Generator().manual_seed(7)
    b, s, hkv, g, d = 3, 10, 2, 2, 8
    k = torch.randn(b, s, hkv, d, generator=gen)
    v = torch.randn(b, s, hkv, d, generator=gen)
    lengths, rows = [4, 1, 3], [2, 0, 1]           # request i uses cache row rows[i]
    cu = [0, 4, 5, 8]
    q = torch.randn(1, cu[-1], hkv * g, d, generator=gen)
    local = torch.rand(cu[-1], s, generator=gen) < 0.6
    local[:, 0] = True                              # every query sees at least one slot
    flat_mask = torch.zeros(1, cu[-1], b * s, dtype=torch.bool)
    for i, row in enumerate(rows):
        flat_mask[0, cu[i]:cu[i + 1], row * s:(row + 1) * s] = local[cu[i]:cu[i + 1]]
    kernel = VarlenAttention(TorchBackend(), cu, rows, s)
    got = kernel.attention(q, k.reshape(1, b * s, hkv, d), v.reshape(1, b * s, hkv, d),
                           flat_mask, 0.35)
    want = torch.zeros(cu[-1], hkv * g, d, dtype=torch.float64)
    for i, row in enumerate(rows):
        for t in range(cu[i], cu[i + 1]):
            for h in range(hkv * g):
                kh, vh = k[row, :, h // g].double(), v[row, :, h // g].double()
                scores = (kh @ q[0, t, h].double()) * 0.35
                scores[~local[t]] = float("-inf")
                want[t, h] = torch.softmax(scores, 0) @ vh
    assert sum(lengths) == cu[-1]
    torch.testing.assert_close(got[0].double(), want.reshape(cu[-1], -1), rtol=1e-5, atol=1e-5)


def random_tree(gen, n, vocab):
    parents, depths, ranks, tokens = [], [], [], []
    for i in range(n):
        p = -1 if i == 0 else int(torch.randint(-1, i, (1,), generator=gen))
        siblings = [j for j in range(i) if parents[j] == p]
        parents.append(p)
        depths.append(1 if p == -1 else depths[p] + 1)
        ranks.append(len(siblings))
        used = {tokens[j] for j in siblings}
        tokens.append(next(t for t in torch.randperm(vocab, generator=gen).tolist()
                           if t not in used))
    order = sorted(range(n), key=lambda i: (depths[i], i))   # breadth-first re-indexing
    where = {old: new for new, old in enumerate(order)}
    return RowTree(tuple(tokens[i] for i in order),
                   tuple(-1 if parents[i] == -1 else where[parents[i]] for i in order),
                   tuple(depths[i] for i in order), tuple(ranks[i] for i in order))


def test_ragged_accept_matches_the_per_request_walk():
    gen = torch.Generator().manual_seed(12)
    vocab = 11
    trees = [random_tree(gen, n, vocab) for n in (7, 1, 0, 12, 4, 9)]
    logits, offsets, deep = [], [0], 0
    for tree in trees:
        rows = torch.randn(tree.num_nodes + 1, vocab, generator=gen)
        # Make the target agree with the drafts often, so paths go deep and branch.
        for i in range(tree.num_nodes):
            if torch.rand(1, generator=gen) < 0.7:
                rows[tree.parents[i] + 1, tree.tokens[i]] = 10.0 + torch.rand(1, generator=gen)
        logits.append(rows)
        offsets.append(offsets[-1] + tree.num_nodes + 1)
    nodes = [0]
    for t in trees:
        nodes.append(nodes[-1] + t.num_nodes)
    flat = [(tok, p, d) for t in trees for tok, p, d in zip(t.tokens, t.parents, t.depths)]
    tok, par, dep = (torch.tensor(c) for c in zip(*flat))
    got = ragged_greedy_accept(torch.cat(logits), offsets, tok, nodes, par, dep)
    for tree, rows, path in zip(trees, logits, got):
        if tree.num_nodes:
            assert path == greedy_accept(tree.plan, list(tree.tokens), rows)
        else:
            assert path.nodes == () and path.bonus == int(rows[0].argmax())
        deep = max(deep, path.length)
    assert deep >= 3


@pytest.mark.parametrize("proposer", sorted(PROPOSERS))
@pytest.mark.parametrize("batch", [2, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_ar_without_padding(seed, batch, proposer):
    s = pair_setup(seed)
    ragged = decode(s, PROPOSERS[proposer](), batch, layout="ragged")
    padded = decode(s, PROPOSERS[proposer](), batch, layout="padded")
    assert ragged.tokens == padded.tokens == s["reference"].tokens
    assert ragged.accepted_lengths == padded.accepted_lengths
    # Ragged computes exactly the real tokens; padded pads each forward to its longest request.
    assert ragged.stats["padded_tokens"] == ragged.stats["verified_tokens"]
    assert padded.stats["verified_tokens"] == ragged.stats["verified_tokens"]
    if batch > 1:
        assert padded.stats["padded_tokens"] > ragged.stats["padded_tokens"]


@pytest.mark.parametrize("seed", SEEDS)
def test_forcing_is_clean(seed):
    s = pair_setup(seed)
    assert_clean(force(s, StaticProposer(Tree((2, 2))), 4, layout="ragged"), s["reference"])


def test_off_by_one_attention_offset_is_caught(monkeypatch):
    s = pair_setup(SEEDS[0])
    original = batch_layout.with_varlen_attention

    def shifted(model, cu, rows, capacity, visibility=None):
        # Each request's first token is attributed to the request before it.
        return original(model, [cu[0]] + [x + 1 for x in cu[1:-1]] + [cu[-1]], rows, capacity,
                        visibility)

    monkeypatch.setattr(batch_layout, "with_varlen_attention", shifted)
    assert_caught(force(s, StaticProposer(Chain(3)), 4, layout="ragged"), s["reference"])


def test_off_by_one_accept_offset_is_caught(monkeypatch):
    s = pair_setup(SEEDS[0])
    original = step_loop.ragged_greedy_accept

    def shifted(logits, offsets, tokens, node_offsets, parents, depths):
        # Each request reads its target rows one row late.
        moved = [offsets[0]] + [min(x + 1, offsets[-1] - 1) for x in offsets[1:-1]] + [offsets[-1]]
        return original(logits, moved, tokens, node_offsets, parents, depths)

    monkeypatch.setattr(step_loop, "ragged_greedy_accept", shifted)
    assert_caught(force(s, StaticProposer(Tree((2, 2))), 4, layout="ragged"), s["reference"])
