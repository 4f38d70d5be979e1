"""Dynamic draft trees: the drafter grows its most probable branches each step, the target gets
the tree as data. Checked against a plain causal re-computation of the drafter's choices,
against greedy AR (exact tokens), by token forcing, and with a tree-mask bug that must be caught.
"""
import pytest
import torch

from specpilot.ir.topology import DynamicTree
from specpilot.runtime.dynamic_tree import DynamicProposer, choose_nodes, expand_dynamic
from specpilot.runtime.row_tree import RowTree
from specpilot.runtime.steps import append_step
from specpilot.runtime.tree_drafting import catch_up

from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import (SEEDS, assert_caught, assert_clean, decode, force,
                             off_by_one_ancestors, pair_setup)

TOPOLOGIES = [DynamicTree(6, 3, 3), DynamicTree(4, 4, 2)]


def causal_log_probs(model, tokens):
    """Log-probabilities after `tokens`, from one plain causal forward over all of them."""
    cache = model.new_cache(1, len(tokens) + 1)
    logits = append_step(model, cache, torch.zeros(1, dtype=torch.int64), [list(tokens)])
    return torch.log_softmax(logits[0].double(), dim=-1)


def reference_tree(model, committed, topo):
    """The dynamic tree's chosen paths (as token tuples), recomputed without any cache, slot or
    mask trick: every candidate's log-probability from a causal forward over committed + path."""
    pool = []                                        # (score, path tokens, depth, order)
    frontier = [(0.0, ())]
    for depth in range(1, topo.depth + 1):
        cands = []
        for score, path in frontier:
            logp = causal_log_probs(model, list(committed) + list(path))
            top = torch.topk(logp, topo.width)
            for v, tok in zip(top.values.tolist(), top.indices.tolist()):
                cands.append((score + v, path + (tok,)))
        order = sorted(range(len(cands)), key=lambda c: -cands[c][0])[:topo.width]
        frontier = [cands[c] for c in sorted(order)]
        pool += [(s, p, depth, len(pool) + j) for j, (s, p) in enumerate(frontier)]
    pool.sort(key=lambda x: (-x[0], x[2], x[3]))
    return {p for _, p, _, _ in pool[:topo.budget]}


def tree_paths(tree):
    return {tuple(tree.tokens[a] for a in tree.ancestors_or_self(i)) for i in range(tree.num_nodes)}


@pytest.mark.parametrize("layout", ["padded", "ragged"])
@pytest.mark.parametrize("topo", TOPOLOGIES, ids=str)
def test_drafts_the_most_probable_branches(topo, layout):
    s = pair_setup(SEEDS[0])
    drafter = s["drafter"]
    committed = [list(p) + list(r[:3]) for p, r in zip(s["prompts"], s["reference"].tokens)]
    active = list(enumerate(committed))
    cache = drafter.new_cache(len(active), max(map(len, committed)) + 32)
    root_logits = catch_up(drafter, cache, active, [0] * len(active), layout)
    trees, forwards = expand_dynamic(drafter, cache, active, root_logits, topo, layout)
    assert forwards == topo.depth - 1
    for c, tree in zip(committed, trees):
        assert tree.num_nodes == topo.budget
        assert tree_paths(tree) == reference_tree(drafter, c, topo)
    # The trees really differ between requests: the shape is data, not a constant.
    assert len({t.parents for t in trees}) > 1


def test_choose_nodes_keeps_ancestors_and_the_best_scores():
    gen = torch.Generator().manual_seed(3)
    parents, depths, scores = [], [], []
    for i in range(30):  # a random tree whose scores never grow along a path
        p = -1 if i < 4 else int(torch.randint(0, i, (1,), generator=gen))
        parents.append(p)
        depths.append(1 if p == -1 else depths[p] + 1)
        step = -float(torch.rand(1, generator=gen)) * 2
        scores.append(step if p == -1 else scores[p] + step)
    for budget in (1, 5, 12, 30):
        chosen = choose_nodes(scores, parents, depths, budget)
        assert len(chosen) == budget
        assert all(parents[j] == -1 or parents[j] in chosen for j in chosen)
        best = sorted(range(30), key=lambda j: -scores[j])[:budget]
        assert sorted(best) == chosen


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("topo", TOPOLOGIES, ids=str)
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_ar(seed, topo, batch):
    s = pair_setup(seed)
    for layout in ("padded", "ragged"):
        result = decode(s, DynamicProposer(topo), batch, layout=layout)
        assert result.tokens == s["reference"].tokens
        # Every step verifies exactly `budget` nodes per request, whatever the tree's shape.
        steps = sum(len(a) for a in result.accepted_lengths)
        assert result.stats["verified_nodes"] == topo.budget * steps
        assert result.drafter_forwards == result.target_forwards * topo.depth
        assert result.mean_accepted > 1.5 and result.compactions > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_forcing_is_clean(seed):
    s = pair_setup(seed)
    assert_clean(force(s, DynamicProposer(TOPOLOGIES[0]), 3, layout="ragged"), s["reference"])


@pytest.mark.parametrize("seed", SEEDS)
def test_wrong_parent_in_the_tree_mask_is_caught(monkeypatch, seed):
    # Deep enough that accepted paths pass through nodes whose parent index is > 0.
    s = pair_setup(seed)
    monkeypatch.setattr(RowTree, "ancestors_or_self", off_by_one_ancestors)
    proposer = DynamicProposer(DynamicTree(8, 4, 3))
    assert_caught(force(s, proposer, 3), s["reference"])
    assert decode(s, proposer, 3).tokens != s["reference"].tokens
