"""Tree shape from measured acceptance: the dynamic program against brute force, the rank
measurement against HF, the replay against every step of a real decode, the shaped tree against
greedy AR and forcing, and a tree-mask bug on a shaped tree that forcing must catch.
"""
import random

import pytest

from specpilot.deploy import build_deployment
from specpilot.ir import SetTopology, SparseTree, apply, stock_program
from specpilot.runtime.model import Transformer
from specpilot.runtime.row_tree import RowTree
from specpilot.runtime.sequoia import (AcceptanceProfile, RankTrace, accepted_in_tree,
                                       expected_accepted, linear_step_cost, mean_accepted_in_tree,
                                       measure_rank_trace, optimal_trees, profile_from_trace,
                                       propose_tree_topology, shape_tree, tree_paths)
from specpilot.runtime.tree_drafting import StaticProposer

from hf_factory import hf_logits, load_hf
from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import (SEEDS, assert_caught, assert_clean, decode, force,
                             off_by_one_ancestors, pair_setup)

IRREGULAR = SparseTree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)))


def all_trees(max_nodes, depth, ranks):
    """Every prefix- and rank-closed set of at most `max_nodes` rank paths (brute force: grow
    each tree by every node that may be added to it)."""
    seen = {frozenset()}
    frontier = [frozenset()]
    for _ in range(max_nodes):
        grown = []
        for tree in frontier:
            for q in [(r,) for r in range(ranks)] + [p + (r,) for p in tree for r in range(ranks)]:
                if q in tree or len(q) > depth:
                    continue
                if (len(q) > 1 and q[:-1] not in tree) or (q[-1] > 0 and
                                                           q[:-1] + (q[-1] - 1,) not in tree):
                    continue
                bigger = tree | {q}
                if bigger not in seen:
                    seen.add(bigger)
                    grown.append(bigger)
        frontier = grown
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_program_matches_brute_force(seed):
    rng = random.Random(seed)
    depth, ranks = 3, 3
    # Not monotone in rank (a measured profile need not be), so greedy would not do.
    profile = AcceptanceProfile(tuple(tuple(rng.random() * 0.7 for _ in range(ranks))
                                      for _ in range(depth)), (1,) * depth)
    trees = all_trees(6, depth, ranks)
    dp = optimal_trees(profile, 6)
    for n in range(7):
        best = max(expected_accepted(profile, t) for t in trees if len(t) <= n)
        value, paths = dp[n]
        assert value == pytest.approx(best, abs=1e-12)
        assert expected_accepted(profile, paths) == pytest.approx(value, abs=1e-12)
        assert len(paths) <= n and any(set(paths) == t for t in trees)


def test_profile_by_hand():
    trace = RankTrace(((0, 0, 1, 5, 0), (2, 0)))
    p = profile_from_trace(trace, max_depth=2, max_rank=2)
    # starts: depth 1 sees ranks 0,0,1,5,0 and 2,0 -> 7 reached, rank 0: 4, rank 1: 1
    # depth 2 continues starts whose depth-1 rank < 2: (0->0), (0->1), (1->5), (0: end), (0: end)
    assert p.reached == (7, 3)
    assert p.p == ((4 / 7, 1 / 7), (1 / 3, 1 / 3))
    paths = tree_paths(IRREGULAR)
    assert accepted_in_tree(paths, (0, 0, 0, 0, 3), 0) == 4
    assert accepted_in_tree(paths, (1, 0, 2), 0) == 2 and accepted_in_tree(paths, (1, 1), 0) == 1
    assert accepted_in_tree(paths, (3,), 0) == 0


def test_rank_trace_matches_hf():
    s = pair_setup(SEEDS[0])
    drafter = Transformer.from_checkpoint(s["drafter_dir"])
    hf = load_hf(s["drafter_dir"])
    trace = measure_rank_trace(drafter, s["prompts"], s["reference"])
    for prompt, ref, ranks in zip(s["prompts"], s["reference"].tokens, trace.ranks):
        logits = hf_logits(hf, list(prompt) + ref)
        want = [int((logits[len(prompt) - 1 + t] > logits[len(prompt) - 1 + t, tok]).sum())
                for t, tok in enumerate(ref)]
        assert list(ranks) == want
    assert any(r > 0 for ranks in trace.ranks for r in ranks)


@pytest.mark.parametrize("seed", SEEDS)
def test_replay_predicts_every_step_of_a_real_decode(seed):
    s = pair_setup(seed)
    trace = measure_rank_trace(s["drafter"], s["prompts"], s["reference"])
    for topology in (IRREGULAR, shape_tree(profile_from_trace(trace, 4, 3),
                                           linear_step_cost(1.0, 0.05, 0.1), 10)[0]):
        result = decode(s, StaticProposer(topology), 3)
        assert result.tokens == s["reference"].tokens
        paths, depth, compared = tree_paths(topology), topology.depth, 0
        for ranks, accepted in zip(trace.ranks, result.accepted_lengths):
            start = 0
            for a in accepted:
                if start + depth < len(ranks):
                    assert a == accepted_in_tree(paths, ranks, start)
                    compared += 1
                start += a + 1
        assert compared >= 10
        assert 1.0 < mean_accepted_in_tree(topology, trace) < 1.0 + depth


@pytest.mark.parametrize("batch", [3, 4])      # batches of 3 and 1 requests; one batch of 4
@pytest.mark.parametrize("seed", SEEDS)
def test_shaped_tree_is_exact_and_forcing_clean(seed, batch):
    s = pair_setup(seed)
    profile = profile_from_trace(measure_rank_trace(s["drafter"], s["prompts"], s["reference"]),
                                 4, 3)
    # Cheap verification tokens, costly drafter levels: a wide, shallow tree pays.
    topology, tokens, cost = shape_tree(profile, linear_step_cost(1.0, 0.01, 0.5), 12)
    assert tokens == pytest.approx(1.0 + expected_accepted(profile, tree_paths(topology)))
    for shaped in (topology, IRREGULAR):
        assert decode(s, StaticProposer(shaped), batch).tokens == s["reference"].tokens
        assert_clean(force(s, StaticProposer(shaped), batch, layout="ragged"), s["reference"])


def test_proposal_is_a_legal_transformation():
    s = pair_setup(SEEDS[0])
    program = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    profile = AcceptanceProfile(((0.6, 0.3, 0.1), (0.5, 0.2, 0.1), (0.4, 0.1, 0.0)), (1, 1, 1))
    proposal = propose_tree_topology(program, profile, linear_step_cost(1.0, 0.02, 0.3), 10)
    assert isinstance(proposal, SetTopology)
    shaped = apply(program, proposal)
    assert shaped.draft.topology == proposal.topology and shaped.verify.mask == "tree"
    assert propose_tree_topology(shaped, profile, linear_step_cost(1.0, 0.02, 0.3), 10) is None


def test_wrong_parent_in_the_mask_of_a_shaped_tree_is_caught(monkeypatch):
    s = pair_setup(SEEDS[1])
    monkeypatch.setattr(RowTree, "ancestors_or_self", off_by_one_ancestors)
    assert_caught(force(s, StaticProposer(IRREGULAR), 3), s["reference"])
