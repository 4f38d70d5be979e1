"""bench/tree_round_cost.py: its "before" variant (depth-by-depth walk, compaction layer by
layer) decodes exactly what the tree decoder now does, round for round, with drafts that are
often accepted (so the walk and the compaction both have paths to take); and the script runs
end to end at a tiny size, a row per batch, topology and variant."""
import json

import torch

from bench_script import fill_all_active, load_bench_script
from hf_factory import fusable_pair
from torch_threads import single_thread_fixture
from specpilot.ir import SparseTree
from specpilot.runtime.graphed_tree import GraphedTreeDecoder

one_thread = single_thread_fixture()

CONTEXT, CAPACITY, BATCH = 6, 80, 3
STATE = ("length", "last", "prev", "count", "active", "out", "accepted")
TREE = SparseTree(((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)))


def _filled(target, drafter):
    """A tree decoder whose caches hold a random context, every row active after it."""
    return fill_all_active(GraphedTreeDecoder(target, drafter, BATCH, CAPACITY, TREE.shape(),
                                              capture=False), target, drafter, CONTEXT, seed=3)


def test_the_before_variant_runs_the_same_rounds(tmp_path):
    target, drafter = fusable_pair(str(tmp_path), seed=4, noise_seed=9)
    script = load_bench_script("tree_round_cost")
    now, before = _filled(target, drafter), _filled(target, drafter)
    script.as_before(before)
    assert before.tcache.stacked_k is None and now.tcache.stacked_k is not None
    for _ in range(6):
        now._round(TREE.depth)
        before._round(TREE.depth)
        for name in STATE:
            assert torch.equal(getattr(now, name), getattr(before, name)), name
    for a, b in ((now.tcache, before.tcache), (now.dcache, before.dcache)):
        assert all(torch.equal(x, y) for x, y in zip(a.k + a.v, b.k + b.v))
    # Rounds accepted drafts, beyond the first level too: the walks had paths to compare.
    assert bool((now.accepted >= 2).any())


def test_the_script_runs_end_to_end(tmp_path):
    out = tmp_path / "cost.json"
    script = load_bench_script("tree_round_cost")
    assert script.main(["--scale", "0.125", "--batch-sizes", "1,2", "--context", "16",
                        "--topologies", "chain(2);tree([2, 1])", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["topology"], r["variant"]) for r in rows] == [
        (1, "chain(2)", "now"), (1, "tree([2, 1])", "now"), (1, "tree([2, 1])", "before"),
        (2, "chain(2)", "now"), (2, "tree([2, 1])", "now"), (2, "tree([2, 1])", "before")]
    assert all(r["round_ms"] > 0 for r in rows)
    # each row says its cache: context 16, 28 rounds of at most depth + 1 tokens, one span and
    # a slot (chain(2): 16 + 84 + 3 = 103; tree([2, 1]), 4 nodes: 16 + 84 + 5 = 105), rounded
    # up to 8 slots
    slots = {(r["topology"], r["variant"]): r["cache_slots"] for r in rows}
    assert slots == {("chain(2)", "now"): 104, ("tree([2, 1])", "now"): 112,
                     ("tree([2, 1])", "before"): 112}
