"""bench/sequoia_replay.py end to end on hand-made rank profiles and step costs: chain(k) and the
shaped tree against figures worked out here by hand (an exact walk of the ranks; the per-depth
formula 1 + p + p^2 + ... on i.i.d. ranks; a tree's expected tokens as the sum over its nodes of
path products), a useless drafter slower than plain AR, missing widths priced from stored ones,
and bad inputs refused by file name."""
import json
import math
import random

import pytest

from bench_script import load_bench_script, write_profile, write_step_costs

OUT_OF_TREE = 16        # a stored rank of 16: not among the drafter's top 16, in no tree


def _write_ranks(path, ranks):
    path.write_text(json.dumps({"format": "specpilot-rank-profile", "version": 1, "max_rank": 16,
                                "ranks": ranks, "new_tokens": [len(r) + 1 for r in ranks],
                                "source": {"hand": True}}))
    return str(path)


def _write_costs(path, target, drafter, batches=(1,), accept=None):
    """Step costs of target(b, w) and drafter(b, w) for the given {width: seconds} at every
    batch."""
    return write_step_costs(path, {b: target for b in batches}, {b: drafter for b in batches},
                            accept)


TARGET = {w: 1.0 + 0.1 * w for w in range(1, 17)}     # target(1, 1) = 1.1 = one plain step
DRAFTER = {w: 0.2 for w in range(1, 18)}               # flat: catch-up width does not matter


def _run(tmp_path, ranks_path, costs_path, *extra):
    out = tmp_path / "out.json"
    rc = load_bench_script("sequoia_replay").main(["--ranks", ranks_path,
                                                   "--step-costs", costs_path,
                                                   "--out", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def _walk_chain(ranks, k):
    """Accepted drafts per round of chain(k): the leading rank-0 run of the next k ranks."""
    out, i = [], 0
    while i < len(ranks):
        a = 0
        while a < k and i + a < len(ranks) and ranks[i + a] == 0:
            a += 1
        out.append(a)
        i += a + 1
    return out


def test_chain_by_hand_on_one_request(tmp_path):
    ranks = [0, 0, 3, 0, 1, 0, 0, 0, 0, 2, 16, 0, 0, 5, 0]
    doc = _run(tmp_path, _write_ranks(tmp_path / "r.json", [ranks]),
               _write_costs(tmp_path / "c.json", TARGET, DRAFTER), "--chain", "2", "--sizes", "4")
    row = next(r for r in doc["rows"] if r["system"] == "chain(2)")
    accepted = _walk_chain(ranks, 2)
    rounds, tokens = len(accepted), len(ranks)      # decode tokens = new_tokens - 1
    assert row["rounds"] == rounds
    assert row["tokens_per_round"] == pytest.approx(sum(a + 1 for a in accepted) / rounds)
    round_s = 0.2 + 0.2 + TARGET[3]                 # catch-up + one level + verify 3 tokens
    assert row["cost_per_round_steps"] == pytest.approx(round_s / TARGET[1])
    assert row["speedup_vs_ar"] == pytest.approx(tokens * TARGET[1] / (rounds * round_s))
    assert "accept/commit" in row["priced_from"]    # not counted, and said so
    assert doc["settings"]["batch_sizes"] == [1]


def test_iid_ranks_match_the_per_depth_formula_and_the_tree_its_node_sum(tmp_path):
    rng = random.Random(0)
    p0, p1 = 0.6, 0.25                              # P(rank 0), P(rank 1); else out of tree
    draw = lambda: 0 if (u := rng.random()) < p0 else (1 if u < p0 + p1 else OUT_OF_TREE)
    ranks = [[draw() for _ in range(3000)] for _ in range(8)]
    doc = _run(tmp_path, _write_ranks(tmp_path / "r.json", ranks),
               _write_costs(tmp_path / "c.json", TARGET, DRAFTER), "--sizes", "6")
    chain = next(r for r in doc["rows"] if r["system"] == "chain(4)")
    expected = 1 + p0 + p0 ** 2 + p0 ** 3 + p0 ** 4
    assert chain["tokens_per_round"] == pytest.approx(expected, abs=0.04)
    assert chain["speedup_vs_ar"] == pytest.approx(
        chain["tokens_per_round"] / chain["cost_per_round_steps"], rel=0.01)

    tree = next(r for r in doc["rows"] if r["system"] == "sequoia-6")
    assert tree["nodes"] <= 6
    paths = _paths(tree["topology"])
    rate = {0: p0, 1: p1}
    by_nodes = 1 + sum(math.prod(rate.get(r, 0.0) for r in q) for q in paths)
    assert tree["tokens_per_round"] == pytest.approx(by_nodes, abs=0.04)
    # Priced by hand: catch-up + a drafter forward per level but the last (all 0.2 s here) +
    # the causal target forward of nodes + 1 tokens.
    round_s = 0.2 * tree["depth"] + TARGET[tree["nodes"] + 1]
    assert tree["cost_per_round_steps"] == pytest.approx(round_s / TARGET[1])
    assert tree["topology"].startswith("sparse_tree")   # rank 1 pays here: it branches
    assert f"target(1, {tree['nodes'] + 1})" in tree["priced_from"][
        f"verify(1, {tree['nodes']}-node tree)"]
    assert tree["speedup_vs_chain"] == pytest.approx(
        tree["speedup_vs_ar"] / chain["speedup_vs_ar"])


def _paths(name):
    """Rank paths of a topology string: chain(k) or sparse_tree([[...], ...])."""
    if name.startswith("chain("):
        k = int(name[len("chain("):-1])
        return [(0,) * d for d in range(1, k + 1)]
    assert name.startswith("sparse_tree("), name
    return [tuple(q) for q in json.loads(name[len("sparse_tree("):-1])]


def test_a_useless_drafter_is_slower_than_plain_ar(tmp_path):
    rng = random.Random(1)
    ranks = [[0 if rng.random() < 0.01 else OUT_OF_TREE for _ in range(400)] for _ in range(4)]
    doc = _run(tmp_path, _write_ranks(tmp_path / "r.json", ranks),
               _write_costs(tmp_path / "c.json", TARGET, DRAFTER, batches=(1, 4)),
               "--sizes", "4,8")
    assert {r["batch_size"] for r in doc["rows"]} == {1, 4}
    priced = [r for r in doc["rows"] if r.get("status") != "no tree"]
    assert {r["system"] for r in priced} >= {"chain(4)"}
    for r in priced:
        assert r["speedup_vs_ar"] < 1.0, r


def test_missing_widths_are_padded_or_split_and_logged():
    module = load_bench_script("sequoia_replay")
    from specpilot.bench.step_costs import StepCosts
    from specpilot.ir.topology import Chain

    costs = StepCosts(8, True, {1: {1: 1.0}}, {1: {1: 0.2, 2: 0.3, 4: 0.5, 6: 0.7}})
    priced = module.PricedCosts(costs, Chain(4), "none")
    assert priced.drafter(1, 3) == pytest.approx(0.5)             # padded to width 4
    assert priced.drafter(1, 9) == pytest.approx(0.7 + 0.5)       # 6 + 3 padded to 4
    log = priced.take_log()
    assert "padded to drafter(1, 4)" in log["drafter(1, 3)"]
    assert "split" in log["drafter(1, 9)"]
    assert priced.drafter(1, 2) == pytest.approx(0.3) and priced.take_log() == {}


def test_bad_inputs_are_refused_by_file_name(tmp_path, capsys):
    costs = _write_costs(tmp_path / "c.json", TARGET, DRAFTER)
    ranks = _write_ranks(tmp_path / "r.json", [[0, 0, 1]])
    chain_profile = write_profile(tmp_path / "chain-profile.json", {"kind": "chain", "k": 4},
                                  [[1]], [3])
    not_costs = tmp_path / "not-costs.json"
    not_costs.write_text(json.dumps({"rows": []}))
    missing = str(tmp_path / "missing.json")
    module = load_bench_script("sequoia_replay")
    for ranks_path, costs_path, named in ((missing, costs, missing),
                                          (chain_profile, costs, chain_profile),
                                          (ranks, str(not_costs), str(not_costs)),
                                          (ranks, missing, missing)):
        rc = module.main(["--ranks", ranks_path, "--step-costs", costs_path,
                          "--out", str(tmp_path / "o.json")])
        assert rc == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
    with pytest.raises(SystemExit):
        module.main(["--ranks", ranks, "--step-costs", costs, "--sizes", "0",
                     "--out", str(tmp_path / "o.json")])
