"""bench/ragged_replay.py end to end on hand-made chain profiles and step costs: two requests whose
lengths, accepted drafts, packed widths and priced seconds are worked out here by hand; a rule
that keeps the full chain replays the padded chain exactly; a ragged round never priced above the
padded round of the same lengths, even on noisy (non-monotone) costs; the compute-ridge budget
against a back-of-envelope roofline; bad inputs refused by file name."""
import json
import random

import pytest

from specpilot.bench.request_adaptive_replay import (Round, padded_round_seconds,
                                                     ragged_round_seconds)
from specpilot.bench.step_costs import StepCosts
from specpilot.bench.stored_forwards import PackedCosts

from bench_script import load_bench_script, write_profile, write_step_costs
from replay_setup import profile_from_agreement


def _write_profile(path, accepted, new_tokens, k=4, kind="chain"):
    topology = {"kind": "chain", "k": k} if kind == "chain" else {"kind": "tree",
                                                                  "branching": [2, 1]}
    return write_profile(path, topology, accepted, new_tokens)


# target(b, w) = 1 + 0.5 (b - 1) + 0.1 w, drafter(b, w) = 0.2 + 0.1 (b - 1) + 0.01 w
TARGET = {b: {w: 1.0 + 0.5 * (b - 1) + 0.1 * w for w in range(1, 17)} for b in (1, 2)}
DRAFTER = {b: {w: 0.2 + 0.1 * (b - 1) + 0.01 * w for w in range(1, 6)} for b in (1, 2)}


def _run(tmp_path, profile, costs, *extra):
    out = tmp_path / "out.json"
    rc = load_bench_script("ragged_replay").main(["--acceptance", profile, "--step-costs", costs,
                                                  "--out", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def _row(doc, system, batch, bound=None):
    return next(r for r in doc["rows"] if r["system"] == system and r["batch_size"] == batch
                and (bound is None or r["bound"] == bound))


def test_two_requests_by_hand(tmp_path):
    # Both requests' drafts always agree (optimistic: the bonus positions after a full chain
    # count as agreeing; request 0's profile shows 10 agreeing positions, request 1's 5).
    # Request 0 decodes 10 tokens, request 1 decodes 5. Every estimate stays at alpha = 1, so
    # each wants 4 drafts; a budget of 7 tokens over 2 rows: fit_budget cuts (4, 4) -> (4, 3)
    # -> (3, 3) -> (3, 2).
    #   round 1: lengths (3, 2), accepted (3, 2); left (6, 2); catch-up 1 each
    #   round 2: lengths (3, 2), accepted (3, 2); left (2, 0); catch-up (4, 3)
    #   round 3: request 0 alone wants 4 and fits; it accepts positions 8, 9 (then the map
    #            ends): 2 drafts; catch-up 4
    profile = _write_profile(tmp_path / "p.json", [[4, 4], [4]], [11, 6])
    costs = write_step_costs(tmp_path / "c.json", TARGET, DRAFTER)
    doc = _run(tmp_path, profile, costs, "--batch-sizes", "2", "--token-budget", "7",
               "--bound", "optimistic")
    t = lambda b, w: TARGET[b][w]
    d = lambda b, w: DRAFTER[b][w]
    # padded: every forward over both rows, at the widest row's width
    padded = [d(2, 1) + 2 * d(2, 1) + t(2, 4),        # catch-up 1, levels 1-2, verify 3 + 1
              d(2, 4) + 2 * d(2, 1) + t(2, 4),        # catch-up max(4, 3)
              d(2, 4) + 3 * d(2, 1) + t(2, 5)]        # the finished row pads along
    # ragged: packed tokens over the active rows; width ceil(tokens / rows)
    ragged = [d(2, 1) + d(2, 1) + d(1, 1) + t(2, 4),  # 2 catch-up tokens over 2 rows; level 1
              #                                         both rows, level 2 request 0 only;
              #                                         verify 4 + 3 = 7 tokens over 2 rows
              d(2, 4) + d(2, 1) + d(1, 1) + t(2, 4),  # catch-up 4 + 3 = 7 over 2 rows
              d(1, 4) + 3 * d(1, 1) + t(1, 5)]        # request 0 alone
    ar = 10 * t(2, 1)                                  # the longest request's 10 tokens
    ragged_ar = 5 * t(2, 1) + 5 * t(1, 1)
    for system, rounds, verified in (("padded adaptive", padded, 2 * 4 + 2 * 4 + 2 * 5),
                                     ("ragged adaptive", ragged, 7 + 7 + 5)):
        row = _row(doc, system, 2, "optimistic")
        assert row["rounds"] == 3 and row["ar_steps"] == 10 and row["tokens"] == 15
        assert row["tokens_per_round"] == pytest.approx(1 + (3 + 3 + 2 + 2 + 2) / 5)
        assert row["mean_draft_length"] == pytest.approx((3 + 3 + 4 + 2 + 2) / 5)
        assert row["verified_tokens_per_round"] == pytest.approx(verified / 3)
        assert row["cost_per_round_steps"] == pytest.approx(sum(rounds) / 3 / t(2, 1))
        assert row["speedup_vs_ar"] == pytest.approx(ar / sum(rounds))
        assert row["token_budget"] == 7 and "estimated" in row["label"]
    row = _row(doc, "ragged adaptive", 2)
    assert row["speedup_vs_padded_adaptive"] == pytest.approx(sum(padded) / sum(ragged))
    assert row["speedup_vs_ragged_ar"] == pytest.approx(ragged_ar / sum(ragged))
    log = row["priced_from"]
    assert "2 packed forwards of 7 tokens over 2 active rows" in log[
        "verification: packed target(2, 4)"]
    assert "over 1 active rows" in log["drafting level: packed drafter(1, 1)"]
    assert "accept/commit" in log
    assert not any("packed" in key for key in _row(doc, "padded adaptive", 2)["priced_from"])
    # padded chain(4), the profile itself: catch-up 1 then 5 (request 0 accepted 4)
    chain = _row(doc, "padded chain(4)", 2)
    chain_s = (d(2, 1) + 3 * d(2, 1) + t(2, 5)) + (d(2, 5) + 3 * d(2, 1) + t(2, 5))
    assert chain["rounds"] == 2 and chain["tokens_per_round"] == pytest.approx(5.0)
    assert chain["speedup_vs_ar"] == pytest.approx(ar / chain_s)
    summary = doc["summary"][0]["optimistic"]
    assert summary["ragged_over_padded_adaptive"] == pytest.approx(sum(padded) / sum(ragged))


def _random_profile(rng, requests, k=4, p=0.7):
    """(accepted drafts per round, new tokens) of `requests` requests agreeing with chance p."""
    maps = [[rng.random() < p for _ in range(rng.randint(5, 80))] for _ in range(requests)]
    profile = profile_from_agreement(k, maps)
    return profile.accepted_lengths, profile.new_tokens


@pytest.mark.parametrize("batch", [1, 2])
def test_a_rule_that_keeps_the_full_chain_replays_the_padded_chain(tmp_path, batch):
    # With no drafter cost the rule drafts the longest chain whatever the acceptance, and with
    # the full budget nothing is cut: the padded adaptive system is chain(4), round for round.
    lengths, tokens = _random_profile(random.Random(batch), 5)
    doc = _run(tmp_path, _write_profile(tmp_path / "p.json", lengths, tokens),
               write_step_costs(tmp_path / "c.json", TARGET, DRAFTER), "--batch-sizes", str(batch),
               "--token-budget", "full", "--draft-cost", "0", "--bound", "pessimistic")
    chain, padded = _row(doc, "padded chain(4)", batch), _row(doc, "padded adaptive", batch)
    assert padded["mean_draft_length"] == pytest.approx(4.0)
    for key in ("rounds", "tokens_per_round", "cost_per_round_steps", "speedup_vs_ar"):
        assert padded[key] == pytest.approx(chain[key]), key
    ragged = _row(doc, "ragged adaptive", batch)
    if batch == 1:
        assert ragged["speedup_vs_padded_adaptive"] == pytest.approx(1.0)


def test_ragged_is_never_priced_above_padded_for_the_same_lengths(tmp_path):
    rng = random.Random(3)
    batches = (1, 4, 16)
    # noisy stored costs: rising on average, not monotone in width or batch
    noisy = lambda base: {b: {w: base * (1 + 0.1 * b + 0.05 * w) * rng.uniform(0.6, 1.4)
                              for w in range(1, 17)} for b in batches}
    priced = PackedCosts(StepCosts(8, True, noisy(1.0), noisy(0.2)))
    for _ in range(3000):
        batch = rng.choice(batches)
        active = rng.randint(1, batch)
        lengths = tuple(rng.randint(0, 4) for _ in range(active))
        catch_up = tuple(rng.randint(1, 5) for _ in range(active))
        r = Round(batch, lengths, catch_up)
        assert ragged_round_seconds(priced, r) <= padded_round_seconds(priced, r) + 1e-12, r
    assert any("capped" in text for text in priced.take_log().values())

    # and end to end, on a profile of uneven requests
    lengths, tokens = _random_profile(random.Random(4), 9, p=0.6)
    doc = _run(tmp_path, _write_profile(tmp_path / "p.json", lengths, tokens),
               write_step_costs(tmp_path / "c.json", TARGET, DRAFTER), "--token-budget", "full")
    for row in doc["rows"]:
        if row["system"] == "ragged adaptive":
            assert row["speedup_vs_padded_adaptive"] >= 1.0 - 1e-12, row
    assert doc["settings"]["batch_sizes"] == [1, 2]


def test_the_ridge_budget_of_the_8b_shape_on_an_h200(tmp_path):
    # Back of the envelope: a bf16 forward moves 2 bytes and does 2 FLOPs per linear weight, and
    # reads the batch's KV cache; it turns compute-bound at peak / bandwidth (989e12 / 4.8e12 on
    # an H200) times bytes / (2 weights). Llama-3.1-8B's linears: per layer q, o 4096 x 4096,
    # k, v 4096 x 1024, gate, up, down 4096 x 14336; 32 layers, plus the 128256 x 4096 head.
    # KV: 32 layers x B rows x 512 positions x (K + V of 8 heads x 128 x 2 bytes).
    weights = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096
    by_hand = {b: 989 / 4.8 * (2 * weights + 32 * b * 512 * 2 * 8 * 128 * 2) / (2 * weights)
               for b in (1, 64)}
    lengths, tokens = _random_profile(random.Random(5), 4)
    costs = {b: {w: 1.0 + 0.1 * w for w in range(1, 6)} for b in (1, 64)}
    doc = _run(tmp_path, _write_profile(tmp_path / "p.json", lengths, tokens),
               write_step_costs(tmp_path / "c.json", costs, costs, shapes="llama-3.1-8b:llama-3.2-1b",
                            gpu="NVIDIA H200", context=512),
               "--bound", "pessimistic")
    ridge = doc["settings"]["ridge_budgets"]
    for b in (1, 64):
        assert ridge[str(b)] == pytest.approx(by_hand[b], abs=1.0)
    assert 250 < ridge["64"] < 64 * 5
    assert _row(doc, "ragged adaptive", 1)["token_budget"] == 5          # min(B (k + 1), ridge)
    assert _row(doc, "ragged adaptive", 64)["token_budget"] == ridge["64"]


def test_bad_inputs_are_refused_by_file_name(tmp_path, capsys):
    module = load_bench_script("ragged_replay")
    profile = _write_profile(tmp_path / "p.json", [[1, 0]], [4])
    tree = _write_profile(tmp_path / "tree.json", [[1, 0]], [4], kind="tree")
    costs = write_step_costs(tmp_path / "c.json", TARGET, DRAFTER)
    not_costs = tmp_path / "not-costs.json"
    not_costs.write_text(json.dumps({"rows": []}))
    missing = str(tmp_path / "missing.json")
    out = tmp_path / "o.json"
    cases = ((missing, costs, [], missing),
             (costs, costs, [], costs),                        # step costs as a profile
             (tree, costs, [], tree),                          # not a chain
             (profile, missing, [], missing),
             (profile, str(not_costs), [], str(not_costs)),
             (profile, costs, ["--batch-sizes", "3"], costs),  # batch 3 not stored
             (profile, costs, [], costs),                      # ridge: no known shapes or GPU
             (profile, costs, ["--token-budget", "1"], "--token-budget 1"))
    for p, c, extra, named in cases:
        rc = module.main(["--acceptance", p, "--step-costs", c, "--out", str(out), *extra])
        assert rc == 2
        assert named in capsys.readouterr().err
    assert not out.exists()
    for bad in (["--batch-sizes", "0"], ["--token-budget", "lots"], ["--draft-cost", "-1"]):
        with pytest.raises(SystemExit):
            module.main(["--acceptance", profile, "--step-costs", costs, "--out", str(out), *bad])


def test_packed_forwards_pad_rows_to_a_stored_batch_and_log_it():
    target = {b: {w: b + 0.1 * w for w in (1, 2, 3, 4, 8)} for b in (1, 4, 16)}
    priced = PackedCosts(StepCosts(8, True, target, {1: {1: 0.1}}))
    # 10 tokens over 3 rows: the smallest stored batch >= 3 is 4, width ceil(10 / 4) = 3
    assert priced.packed("verification", "target", 3, 10, 16, 5) == pytest.approx(target[4][3])
    # 9 tokens over 1 row: width 9, past the widest stored (8): split into 8 + 1
    assert priced.packed("verification", "target", 1, 9, 16, 5) == pytest.approx(
        target[1][8] + target[1][1])
    # 13 tokens over 4 rows: width 4; the padded forward target(16, 5) pads to width 8
    assert priced.packed("verification", "target", 4, 13, 16, 5) == pytest.approx(target[4][4])
    log = priced.take_log()
    assert "10 tokens over 3 active rows priced as the stored target(4, 3)" in log[
        "verification: packed target(4, 3)"]
    assert "split into target(1, 8) + target(1, 1)" in log["target(1, 9)"]
    assert "padded to target(16, 8)" in log["target(16, 5)"]
    assert priced.take_log() == {}


def test_a_rejected_request_shortens_its_chain_round_by_round(tmp_path):
    # One request whose drafts never agree, 4 tokens to decode, draft cost c = 0.25. Moving
    # averages (newest round weighted 1/2) of accepted drafts a and rejections r, from the
    # prior a = 4, r = 0; the length maximises (1 + alpha + ... + alpha^L) / (1 + c L):
    #   round 1: alpha 1 -> L = 4; rejected: a = 2, r = 0.5, alpha = 0.8
    #   round 2: L = 3 (1.687 > 1.681 at L = 4); a = 1, r = 0.75, alpha = 4 / 7
    #   round 3: L = 2 (1.265 > 1.257 at L = 1); a = 0.5, r = 0.875, alpha = 4 / 11
    #   round 4: L = 1 (1.091 > 0.997 at L = 2)
    def value(alpha, n):
        return sum(alpha ** i for i in range(n + 1)) / (1 + 0.25 * n)
    for alpha, best in ((0.8, 3), (4 / 7, 2), (4 / 11, 1)):
        assert max(range(1, 5), key=lambda n: value(alpha, n)) == best
    doc = _run(tmp_path, _write_profile(tmp_path / "p.json", [[0, 0, 0, 0]], [5]),
               write_step_costs(tmp_path / "c.json", TARGET, DRAFTER), "--batch-sizes", "1",
               "--token-budget", "full", "--bound", "pessimistic")
    row = _row(doc, "padded adaptive", 1)
    t = lambda w: TARGET[1][w]
    d = lambda w: DRAFTER[1][w]
    seconds = sum(d(1) + (n - 1) * d(1) + t(n + 1) for n in (4, 3, 2, 1))
    assert row["rounds"] == 4 and row["mean_draft_length"] == pytest.approx(2.5)
    assert row["tokens_per_round"] == pytest.approx(1.0)
    assert row["speedup_vs_ar"] == pytest.approx(4 * t(1) / seconds)
    assert _row(doc, "ragged adaptive", 1)["speedup_vs_ar"] == pytest.approx(4 * t(1) / seconds)
