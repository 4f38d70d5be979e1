"""The device-resident dynamic-tree decoder (runtime/graphed_dynamic.py), rounds run eagerly on
CPU in float32, against greedy AR, the eager dynamic-tree mechanism's acceptance, and forcing."""
import pytest
import torch

from specpilot.ir.topology import DynamicTree, Tree
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_dynamic import GraphedDynamicTreeDecoder, comb_shape
from specpilot.runtime.graphed_tree import GraphedTreeDecoder
from specpilot.runtime.steps import append_step

from mechanism_setup import MAX_NEW, ContraryDrafter, assert_caught, assert_clean, pair_setup

TOPOLOGIES = [DynamicTree(budget=6, depth=3, width=2), DynamicTree(budget=4, depth=4, width=1),
              DynamicTree(budget=5, depth=2, width=3)]


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
def test_equals_greedy_ar(seed, topology):
    s = pair_setup(seed)
    decoder = GraphedDynamicTreeDecoder(s["target"], s["drafter"], 4, 64, topology, s["eos"],
                                        capture=False, rounds_per_replay=2)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    assert all(0 <= a <= topology.depth for row in r.accepted_lengths for a in row)


@pytest.mark.parametrize("dynamic,static", [
    (DynamicTree(budget=3, depth=3, width=1), Tree((1, 1, 1))),   # one candidate a level: a chain
    (DynamicTree(budget=3, depth=1, width=3), Tree((3,))),        # one level: the top-3 tokens
])
def test_degenerate_dynamic_trees_accept_exactly_as_their_static_twins(dynamic, static):
    """Where the dynamic rule can only grow one tree, every round must match the static tree
    decoder's: same drafts, same verification, same walk, same compaction."""
    s = pair_setup(11)
    got = GraphedDynamicTreeDecoder(s["target"], s["drafter"], 4, 64, dynamic,
                                    capture=False).generate(s["prompts"], MAX_NEW)
    want = GraphedTreeDecoder(s["target"], s["drafter"], 4, 64, static.shape(),
                              capture=False).generate(s["prompts"], MAX_NEW)
    assert got.tokens == want.tokens == s["plain"].tokens
    assert got.accepted_lengths == want.accepted_lengths


def test_the_chosen_tree_is_the_eager_rule_applied_to_the_same_scores():
    """One round's choice against runtime/dynamic_tree.py's `_keep_best` and `choose_nodes`,
    computed from the same drafter on the same context."""
    from specpilot.runtime.dynamic_tree import _keep_best, choose_nodes

    s = pair_setup(4)
    topology = DynamicTree(budget=5, depth=3, width=2)
    decoder = GraphedDynamicTreeDecoder(s["target"], s["drafter"], 1, 64, topology,
                                        capture=False)
    prompt = s["prompts"][1]
    decoder._reset()
    decoder._prefill([prompt], [8])
    g0 = s["plain"].tokens[1][0]
    decoder.last.fill_(g0)
    toks, scores, parents, _ = decoder._draft_dynamic(decoder._base())
    # The eager rule, level by level, on drafter logits of the same sequences.
    drafter, w = s["drafter"], topology.width
    context = list(prompt) + [g0]

    def logp_after(seq):
        cache = drafter.new_cache(1, 64)
        t = torch.tensor([seq])
        pos = torch.arange(len(seq))[None]
        mask = torch.arange(64)[None, None, :] <= pos[:, :, None]
        return torch.log_softmax(drafter.forward(t, pos, pos, mask, cache)[0, -1].double(), -1)

    top = torch.topk(logp_after(context), w)
    want_toks, want_scores, want_parents = top.indices.tolist(), top.values.tolist(), [-1] * w
    paths = [[t] for t in want_toks]
    for depth in range(2, topology.depth + 1):
        level = list(range((depth - 2) * w, (depth - 1) * w))
        logp = torch.stack([logp_after(context + paths[j]) for j in level])
        for p, _, tok, score in _keep_best([want_scores[j] for j in level], logp, w):
            want_toks.append(tok)
            want_scores.append(score)
            want_parents.append(level[p])
            paths.append(paths[level[p]] + [tok])
    assert toks[0].tolist() == want_toks and parents[0].tolist() == want_parents
    # float32 logits of differently shaped forwards: equal to a few ulps.
    torch.testing.assert_close(scores[0], torch.tensor(want_scores, dtype=torch.float64),
                               rtol=1e-5, atol=1e-5)
    depths = [1] * w + [d for d in range(2, topology.depth + 1) for _ in range(w)]
    chosen = choose_nodes(want_scores, want_parents, depths, topology.budget)
    order = torch.sort(-scores, dim=1, stable=True).indices[:, :topology.budget]
    assert torch.sort(order, dim=1).values[0].tolist() == chosen


def test_forcing_is_clean_and_a_wrong_compaction_changes_the_output():
    s = pair_setup(4)
    ref = s["reference"]
    topology = TOPOLOGIES[0]
    decoder = GraphedDynamicTreeDecoder(s["target"], s["drafter"], 4, 64, topology,
                                        capture=False)
    assert_clean(compare_to_reference(decoder.force(s["prompts"], ref.tokens), ref,
                                      default_tolerance(torch.float32)), ref)

    class WrongTargetCompaction(GraphedDynamicTreeDecoder):
        def _compact(self, base, path, drafter_path=None):
            super()._compact(base, torch.where(path >= 0, (path + 1) % 6, path), drafter_path)

    broken = WrongTargetCompaction(s["target"], s["drafter"], 4, 64, topology, capture=False)
    assert broken.generate(s["prompts"], MAX_NEW).tokens != ref.tokens


def test_a_contrary_drafter_still_gives_ar_output_and_comb_shapes_are_trees():
    s = pair_setup(11)
    decoder = GraphedDynamicTreeDecoder(s["target"], ContraryDrafter(s["target"]), 4, 64,
                                        TOPOLOGIES[2], s["eos"], capture=False)
    assert decoder.generate(s["prompts"], MAX_NEW).tokens == s["reference"].tokens
    for budget, depth in ((6, 3), (4, 4), (5, 2), (3, 1)):
        shape = comb_shape(budget, depth)
        assert shape.num_nodes == budget and shape.max_depth == depth
        assert all(p < i for i, p in enumerate(shape.parents))


def test_forcing_checks_the_trees_the_drafter_chooses_and_catches_a_wrong_mask():
    s = pair_setup(11)
    ref = s["reference"]
    topology = DynamicTree(budget=4, depth=3, width=2)
    decoder = GraphedDynamicTreeDecoder(s["target"], s["drafter"], 4, 64, topology,
                                        capture=False)
    proposals = decoder.force(s["prompts"], ref.tokens)
    assert_clean(compare_to_reference(proposals, ref, default_tolerance(torch.float32)), ref)
    # Forced rounds log each row's tree depth (the reference tokens it committed, less one):
    # four nodes, at most two a level, make a tree two or three deep.
    logged = decoder.accepted[:, :len(s["prompts"])]
    assert (logged >= 0).any() and set(logged[logged >= 0].tolist()) <= {2, 3}
    # The drafter grew each tree on the reference: its cache holds the K/V of prompt +
    # reference (all but each row's last token), as an eager prefill of them computes it.
    rows = [list(p) + list(t) for p, t in zip(s["prompts"], ref.tokens)]
    fresh = s["drafter"].new_cache(len(rows), 64)
    append_step(s["drafter"], fresh, torch.zeros(len(rows), dtype=torch.int64), rows)
    for i, row in enumerate(rows):
        for got, want in zip(decoder.dcache.k + decoder.dcache.v, fresh.k + fresh.v):
            torch.testing.assert_close(got[i, :len(row) - 1], want[i, :len(row) - 1],
                                       rtol=1e-4, atol=1e-4)

    class SiblingsSeeEachOther(GraphedDynamicTreeDecoder):
        """Every kept node also attends to the other nodes of its level."""

        def _draft_dynamic(self, base):
            toks, scores, parents, anc = super()._draft_dynamic(base)
            level = torch.arange(self.scratch) // self.topology.width
            return toks, scores, parents, anc | (level[:, None] == level[None, :])

    broken = SiblingsSeeEachOther(s["target"], s["drafter"], 4, 64, topology, capture=False)
    assert_caught(compare_to_reference(broken.force(s["prompts"], ref.tokens), ref,
                                       default_tolerance(torch.float32)), ref)
