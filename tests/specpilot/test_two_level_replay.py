"""bench/two_level_replay.py end to end on hand-made profiles and step costs: every row's
speedup and round worked out here by hand (a 2-token drafter catch-up every round; a tree's
verification is the target at N + 1 tokens; two-level's is a cheap share of that plus the target
at D + 1; the LM head's share from the zoo-gpu-small preset's weights), and profiles of the
wrong kind refused by file name."""
import json

import pytest

from bench_script import load_bench_script, write_profile, write_step_costs

# batch 1 only: target(1, w) = 1 + 0.1 w, drafter(1, w) = 0.2 + 0.01 w
TARGET = {1: {w: 1.0 + 0.1 * w for w in range(1, 17)}}
DRAFTER = {1: {w: 0.2 + 0.01 * w for w in range(1, 7)}}
SHAPES = "zoo-gpu-small:zoo-gpu-small-drafter"


def _inputs(tmp_path):
    """The script's inputs, each profile naming the system that measured it, as the bench
    writes them."""
    tree = {"kind": "tree", "branching": [2, 1]}          # 2 + 2 = 4 nodes, depth 2
    pruned = {"kind": "tree", "branching": [3]}           # 3 nodes, depth 1
    return ["--step-costs", write_step_costs(tmp_path / "c.json", TARGET, DRAFTER, shapes=SHAPES),
            "--chain", write_profile(tmp_path / "chain.json", {"kind": "chain", "k": 4},
                                     [[4, 4]], [11], {"system": "stock_graphed"}),
            "--tree", write_profile(tmp_path / "tree.json", tree, [[2, 2]], [7],
                                    {"system": "mech:graphed_tree"}),
            "--two-level", write_profile(tmp_path / "two.json", pruned, [[1, 1, 1]], [7],
                                         {"system": "mech:graphed_two_level"}),
            "--batch-sizes", "1"]


def test_every_row_by_hand(tmp_path):
    out = tmp_path / "out.json"
    assert load_bench_script("two_level_replay").main(_inputs(tmp_path) + ["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    got = {(r["system"], r["pricing"]): (r["speedup_vs_ar"], r["round_ms"]) for r in doc["rows"]}
    # zoo-gpu-small: a layer streams 2·1024·1024 (q, o) + 2·1024·256 (k, v) + 3·1024·3072
    # weights, 12 layers; the head 1024·8192.
    layer = 2 * 1024 * 1024 + 2 * 1024 * 256 + 3 * 1024 * 3072
    head = 1024 * 8192 / (12 * layer + 1024 * 8192)
    assert doc["settings"]["head_share"] == pytest.approx(head)
    # Every round's catch-up feeds the drafter 2 tokens: drafter(1, 2) = 0.22.
    # chain(4), accepted (4, 4), 10 tokens: 3 more drafter steps of 1 token, the target over 5;
    # plain AR takes 10 steps of 1.1.
    chain = 0.22 + 3 * 0.21 + 1.5
    # tree([2, 1]), accepted (2, 2), 6 tokens: one level of 2 drafted, the target over 4 + 1.
    tree = 0.22 + 0.22 + 1.5
    # two-level: cheap * target(N + 1) + target(D + 1). Perfect prune: tree([2, 1])'s rounds
    # (N + 1 = 5, D + 1 = 3). Measured prune: tree([3]), 3 rounds (N + 1 = 4, D + 1 = 2, no
    # level drafted after the catch-up).
    want = {("chain(4)", "-"): (11.0 / (2 * chain), chain), ("tree", "-"): (6.6 / (2 * tree), tree)}
    for pricing, cheap in (("lower bound", 0.5), ("with head", head + (1 - head) * 0.5)):
        perfect = 0.22 + 0.22 + cheap * 1.5 + 1.3
        measured = 0.22 + cheap * 1.4 + 1.2
        want[("two-level, perfect prune", pricing)] = (6.6 / (2 * perfect), perfect)
        want[("two-level, measured prune", pricing)] = (6.6 / (3 * measured), measured)
    assert set(got) == set(want)
    for key, (speedup, seconds) in want.items():
        assert got[key] == pytest.approx((speedup, 1e3 * seconds)), key
    assert "estimated from stored per-width step costs" in doc["label"]
    assert doc["settings"]["shapes"] == SHAPES


@pytest.mark.parametrize("swap,given,message", [
    ("--tree", "--chain", "a tree profile is needed"),
    ("--two-level", "--chain", "a tree profile is needed"),
    ("--two-level", "--tree", "a two-level profile is needed"),
    ("--tree", "--two-level", "a static tree profile is needed")])
def test_a_profile_of_the_wrong_kind_is_refused_by_name(tmp_path, capsys, swap, given, message):
    args = _inputs(tmp_path)
    wrong = args[args.index(given) + 1]
    args[args.index(swap) + 1] = wrong
    out = tmp_path / "out.json"
    assert load_bench_script("two_level_replay").main(args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and wrong in err
    assert not out.exists()


def test_kept_share_out_of_range_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        load_bench_script("two_level_replay").main(
            _inputs(tmp_path) + ["--kept", "1.5", "--out", str(tmp_path / "x.json")])
