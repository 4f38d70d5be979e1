"""bench/draft_ahead_model.py: its closed form against a hand-checked case and a simulated
two-state row, its prices from a probe, and its refusals."""
import json
import random

import pytest

from bench_script import load_bench_script

model = load_bench_script("draft_ahead_model")


def test_a_hand_checked_profile():
    # Rounds accepting 4, 4, 0, 2 of 4: sequentially (5 + 5 + 1 + 3) / 4 = 3.5 tokens; whole
    # chains in half the rounds, so with a guess right half the time q = 0.25; the first draft
    # accepted in 3 of 4: P(valid) = 0.75 / (1 - 0.25 + 0.75) = 0.5, and 0.5 * 3.5 + 0.5 * 1.
    t = model.row_tokens([4, 4, 0, 2], 4, 0.5)
    assert t["sequential"] == pytest.approx(3.5)
    assert t["p_valid"] == pytest.approx(0.5)
    assert t["draft_ahead"] == pytest.approx(2.25)


@pytest.mark.parametrize("guess_rate", [0.3, 0.9])
def test_the_closed_form_is_what_a_simulated_row_commits(guess_rate):
    gen = random.Random(7)
    accepted = [gen.choice([0, 1, 2, 3, 3, 4, 4, 4]) for _ in range(400)]
    want = model.row_tokens(accepted, 4, guess_rate)["draft_ahead"]
    a1 = sum(n >= 1 for n in accepted) / len(accepted)
    sim, tokens, rounds, valid = random.Random(11), 0, 200_000, True
    for _ in range(rounds):
        if valid:
            n = sim.choice(accepted)
            tokens += n + 1
            valid = n == 4 and sim.random() < guess_rate
        else:
            tokens += 1
            valid = sim.random() < a1
    assert tokens / rounds == pytest.approx(want, rel=0.01)


def _probe():
    return {"batches": [{"batch": 16, "k": 4, "ms": {"one_stream": 1.4, "two_streams": 1.1,
                                                      "draft": 0.4, "verify": 0.9}}]}


def test_prices_and_the_end_to_end_file(tmp_path):
    prices = model.round_prices(_probe(), 16, 0.1)
    assert prices["sequential"] == pytest.approx(1.5)
    assert prices["draft_ahead_fast"] == pytest.approx(1.2)
    assert prices["draft_ahead_slow"] == pytest.approx(1.3)
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"topology": {"kind": "chain", "k": 4},
                                   "accepted_lengths": [[4, 4], [0, 2]]}))
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps(_probe()))
    out = tmp_path / "out.json"
    assert model.main(["--profiles", str(profile), "--probe", str(probe), "--commit-ms", "0.1",
                       "--guess-rates", "0.5", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["draft_ahead_over_sequential"] == pytest.approx(
        [(2.25 / 1.3) / (3.5 / 1.5), (2.25 / 1.2) / (3.5 / 1.5)])


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="no batch 64"):
        model.round_prices(_probe(), 64, 0.1)
    with pytest.raises(ValueError, match="no rounds"):
        model.row_tokens([], 4, 0.5)
    with pytest.raises(ValueError, match="not a probability"):
        model.row_tokens([1], 4, 1.5)
    tree = {"topology": {"kind": "tree", "branching": [2]}, "accepted_lengths": [[1]]}
    with pytest.raises(ValueError, match="a chain profile is needed"):
        model.model({"t": tree}, _probe(), 16, 0.1, [0.5])
    chain3 = {"topology": {"kind": "chain", "k": 3}, "accepted_lengths": [[1]]}
    with pytest.raises(ValueError, match="chain\\(3\\) against a probe of 4"):
        model.model({"c": chain3}, _probe(), 16, 0.1, [0.5])
    with pytest.raises(SystemExit):
        model.main(["--profiles", str(tmp_path / "missing.json"), "--probe", "x",
                    "--out", str(tmp_path / "o.json")])
    assert not (tmp_path / "o.json").exists()
