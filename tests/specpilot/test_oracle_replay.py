"""The length oracle (specpilot/bench/oracle_replay.py): a hand-checked request, and the two
extremes, where it must equal the fixed chain and plain AR."""
import random

import pytest

from specpilot.bench.oracle_replay import replay_oracle
from specpilot.bench.refill_replay import replay_refill
from specpilot.bench.replay import replay
from bench_script import load_bench_script
from replay_setup import chain_round_costs, profile_from_agreement


def test_a_hand_checked_request_takes_the_length_with_most_tokens_per_cost():
    # chain(2) over agreement T T F T F (the bonus at 2 is unknown: pessimistic, wrong), 5 decode
    # tokens; rounds cost 1, 1.5, 1.8 plain steps for 0, 1, 2 drafts. Round 1 at position 0:
    # 1 / 1, 2 / 1.5, 3 / 1.8: two drafts. Round 2 at position 3, 2 tokens left: 1 / 1,
    # 2 / 1.5, 2 / 1.8: one draft, done. 3.3 plain steps for 5 tokens.
    profile = profile_from_agreement(2, [[True, True, False, True, False]])
    c = chain_round_costs([1], 1e-3, [1.5e-3, 1.8e-3])
    got = replay_oracle(profile, c, 1)
    assert got.spec_steps == 2 and got.tokens == 5
    assert got.speedup == pytest.approx(5 / 3.3)
    assert replay_oracle(profile, c, 1, refill=True).speedup == pytest.approx(5 / 3.3)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_perfect_drafter_runs_the_full_chain_and_a_useless_one_plain_steps(batch):
    # Multiples of a full round (4 drafts and the bonus token), so that no request's last round
    # is better served by a shorter chain, as it would be otherwise.
    rnd = random.Random(batch)
    lengths = [5 * rnd.randint(4, 12) for _ in range(7)]
    c = chain_round_costs([batch], 1e-3, [(1 + 0.3 * n) * 1e-3 for n in range(1, 5)])
    perfect = profile_from_agreement(4, [[True] * n for n in lengths])
    useless = profile_from_agreement(4, [[False] * n for n in lengths])
    assert replay_oracle(perfect, c, batch).spec_seconds == pytest.approx(
        replay(perfect, c, batch).spec_seconds)
    assert replay_oracle(perfect, c, batch, refill=True).spec_seconds == pytest.approx(
        replay_refill(perfect, c, batch).spec_seconds)
    for refill in (False, True):
        plain = replay_oracle(useless, c, batch, refill=refill)
        assert plain.spec_seconds == pytest.approx(plain.ar_seconds) and plain.mean_accepted == 1


def test_a_request_ending_mid_chain_takes_a_shorter_last_round():
    profile = profile_from_agreement(4, [[True] * 7])          # 8 decode tokens: 5, then 3
    assert profile.new_tokens == [9]
    c = chain_round_costs([1], 1e-3, [(1 + 0.3 * n) * 1e-3 for n in range(1, 5)])
    # the fixed chain pays a second full round (2.2); the oracle two drafts (1.6: 3 / 1.6 beats
    # 2 / 1.3 and 3 / 1.9)
    assert replay(profile, c, 1).spec_seconds == pytest.approx(2 * 2.2e-3 * 1.01)
    assert replay_oracle(profile, c, 1).spec_seconds == pytest.approx((2.2 + 1.6) * 1e-3 * 1.01)


def test_the_oracle_script_writes_every_system_per_profile_and_batch(tmp_path):
    import json

    module = load_bench_script("oracle_lengths")
    rnd = random.Random(9)
    profile = profile_from_agreement(4, [[rnd.random() < 0.7 for _ in range(rnd.randint(10, 40))]
                                         for _ in range(6)])
    path = tmp_path / "profile.json"
    profile.save(str(path))
    c = chain_round_costs([1, 2], 1e-3, [(1 + 0.3 * n) * 1e-3 for n in range(1, 5)])
    source = tmp_path / "costs.json"
    source.write_text(json.dumps({"step_costs": c.to_json(), "environment": {"gpu": "x"}}))
    out = tmp_path / "oracle.json"
    argv = ["--step-costs", str(source), "--profiles", str(path), "--batch-sizes", "1,2",
            "--out", str(out)]
    assert module.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch_size"] for r in rows] == [1, 2]
    assert rows[1]["oracle"] == pytest.approx(replay_oracle(profile, c, 2).speedup)
    assert rows[0]["fixed"] == pytest.approx(replay(profile, c, 1).speedup)
    assert module.main(argv[:1] + [str(tmp_path / "missing.json")] + argv[2:]) == 2
    assert module.main(argv[:3] + [str(tmp_path / "missing.json")] + argv[4:]) == 2
