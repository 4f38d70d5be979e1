"""bench/two_level_replay.py end to end on hand-made profiles and step costs: every row's
speedup worked out here by hand (a tree's verification is the target at N + 1 tokens; two-level's
is a cheap share of that plus the target at D + 1; the LM head's share from the zoo-gpu-small
preset's weights), and bad inputs refused by file name."""
import json

import pytest

from bench_script import load_bench_script, write_step_costs

# batch 1 only: target(1, w) = 1 + 0.1 w, drafter(1, w) = 0.2 + 0.01 w
TARGET = {1: {w: 1.0 + 0.1 * w for w in range(1, 17)}}
DRAFTER = {1: {w: 0.2 + 0.01 * w for w in range(1, 7)}}
SHAPES = "zoo-gpu-small:zoo-gpu-small-drafter"


def _profile(path, topology, accepted, new_tokens):
    path.write_text(json.dumps({"format": "specpilot-acceptance-profile", "version": 1,
                                "topology": topology, "accepted_lengths": accepted,
                                "new_tokens": new_tokens, "source": {"hand": True}}))
    return str(path)


def _inputs(tmp_path):
    tree = {"kind": "tree", "branching": [2, 1]}          # 2 + 2 = 4 nodes, depth 2
    return ["--step-costs", write_step_costs(tmp_path / "c.json", TARGET, DRAFTER, shapes=SHAPES),
            "--chain", _profile(tmp_path / "chain.json", {"kind": "chain", "k": 4}, [[4, 4]],
                                [11]),
            "--tree", _profile(tmp_path / "tree.json", tree, [[2, 2]], [7]),
            "--two-level", _profile(tmp_path / "two.json", tree, [[1, 1, 1]], [7]),
            "--batch-sizes", "1"]


def test_every_row_by_hand(tmp_path):
    out = tmp_path / "out.json"
    assert load_bench_script("two_level_replay").main(_inputs(tmp_path) + ["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    got = {(r["system"], r["pricing"]): r["speedup_vs_ar"] for r in doc["rows"]}
    # zoo-gpu-small: a layer streams 2·1024·1024 (q, o) + 2·1024·256 (k, v) + 3·1024·3072
    # weights, 12 layers; the head 1024·8192.
    layer = 2 * 1024 * 1024 + 2 * 1024 * 256 + 3 * 1024 * 3072
    head = 1024 * 8192 / (12 * layer + 1024 * 8192)
    assert doc["settings"]["head_share"] == pytest.approx(head)
    # chain(4), accepted (4, 4), 10 tokens: each round drafts 3 levels of 1 after the catch-up
    # (width 1, then 5) and verifies 5 tokens; plain AR takes 10 steps of 1.1.
    chain = (0.21 + 3 * 0.21 + 1.5) + (0.25 + 3 * 0.21 + 1.5)
    # tree([2, 1]), accepted (2, 2), 6 tokens: catch-up 1 then 3, one level of 2 drafted, the
    # target over 4 + 1 tokens.
    drafting = [0.21 + 0.22, 0.23 + 0.22]
    tree = sum(drafting) + 2 * 1.5
    # two-level: cheap * target(5) + target(3); perfect prune = the tree's rounds.
    def two_level(cheap):
        return cheap * 1.5 + 1.3
    measured_drafting = (0.21 + 0.22) + 2 * (0.22 + 0.22)   # accepted (1, 1, 1): catch-up 1, 2, 2
    want = {("chain(4)", "-"): 11.0 / chain, ("tree", "-"): 6.6 / tree}
    for pricing, cheap in (("optimistic", 0.5), ("pessimistic", head + (1 - head) * 0.5)):
        want[("two-level, perfect prune", pricing)] = 6.6 / (sum(drafting) + 2 * two_level(cheap))
        want[("two-level, measured prune", pricing)] = 6.6 / (measured_drafting
                                                               + 3 * two_level(cheap))
    assert got == pytest.approx(want)
    assert got[("two-level, perfect prune", "optimistic")] < got[("tree", "-")]
    assert doc["label"].startswith("estimate")


@pytest.mark.parametrize("swap,message", [("--tree", "a tree profile is needed"),
                                          ("--two-level", "a tree profile is needed")])
def test_a_chain_profile_where_a_tree_is_needed_is_refused_by_name(tmp_path, capsys, swap,
                                                                     message):
    args = _inputs(tmp_path)
    args[args.index(swap) + 1] = args[args.index("--chain") + 1]
    out = tmp_path / "out.json"
    assert load_bench_script("two_level_replay").main(args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "chain.json" in err
    assert not out.exists()


def test_kept_share_out_of_range_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        load_bench_script("two_level_replay").main(_inputs(tmp_path) + ["--kept", "1.5",
                                                                       "--out", "x.json"])
