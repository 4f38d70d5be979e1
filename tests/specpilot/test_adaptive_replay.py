"""The batch-length rule replayed on a chain profile (specpilot/bench/adaptive_replay.py): the
agreement read off a profile by hand, the fixed chain replayed exactly as the chain replay does,
a rule that may not turn off and sees every length cost the same keeps the longest chain, and
one that may turn off never costs more than plain AR plus the rounds before it may."""
import json
import random

import pytest

from specpilot.bench.adaptive_replay import agreement_maps, replay_adaptive
from specpilot.bench.replay import AcceptanceProfile, ProfileError, replay
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.topology import Chain, Tree
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS

from replay_setup import chain_round_costs, profile_from_agreement


def test_agreement_is_read_off_the_rounds():
    # chain(3): a full round (positions 0-2 agree, the bonus at 3 is unknown), a rejection at
    # 4, then two accepted drafts at 5 and 6 and a rejection at 7
    profile = AcceptanceProfile(Chain(3), [[3, 0, 2]], [9])
    assert agreement_maps(profile)[0][:8] == [True, True, True, False, False, True, True, False]
    with pytest.raises(ProfileError, match="chain profile"):
        agreement_maps(AcceptanceProfile(Tree((2, 1)), [[1]], [3]))


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_rule_held_at_the_longest_chain_replays_the_fixed_chain(batch):
    rnd = random.Random(batch)
    maps = [[rnd.random() < 0.7 for _ in range(rnd.randint(20, 60))] for _ in range(7)]
    profile = profile_from_agreement(4, maps)
    # what the profile shows never overstates the agreement it was recorded from
    read = agreement_maps(profile)
    assert all(m[p] for r, m in zip(read, maps) for p in range(len(m)) if r[p])
    assert sum(map(sum, read)) > 0.5 * sum(map(sum, maps))
    flat = chain_round_costs([batch], 1e-3, [2e-3] * 4)   # every length costs the same: k wins
    fixed = replay(profile, flat, batch)
    adaptive = replay_adaptive(profile, flat, batch, turn_off=False)
    assert adaptive.spec_steps == fixed.spec_steps
    assert adaptive.spec_seconds == pytest.approx(fixed.spec_seconds)
    assert adaptive.tokens == fixed.tokens and adaptive.ar_seconds == fixed.ar_seconds
    assert adaptive.mean_accepted == pytest.approx(fixed.mean_accepted)


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_a_batch_that_would_lose_turns_speculation_off(batch):
    rnd = random.Random(100 + batch)
    maps = [[rnd.random() < 0.15 for _ in range(rnd.randint(40, 90))] for _ in range(9)]
    profile = profile_from_agreement(4, maps)
    dear = chain_round_costs([batch], 1e-3, [(1 + 0.8 * n) * 1e-3 for n in range(1, 5)])
    fixed = replay(profile, dear, batch)
    adaptive = replay_adaptive(profile, dear, batch)
    assert fixed.speedup < 0.8                       # the fixed chain loses to plain AR ...
    groups = -(-len(maps) // batch)
    # ... the rule never costs more than plain AR plus, per batch, the rounds before it may turn
    # off, each at most the dearest round's cost
    assert adaptive.spec_seconds <= adaptive.ar_seconds + groups * OFF_AFTER_ROUNDS * (
        dear.round(batch, Chain(4)))
    assert adaptive.speedup > fixed.speedup


def test_the_shapes_bench_adds_a_row_of_the_rule_per_batch_size():
    from specpilot.bench.shapes_bench import replay_rows

    rnd = random.Random(7)
    profile = profile_from_agreement(3, [[rnd.random() < 0.6 for _ in range(40)]
                                         for _ in range(5)])
    c = chain_round_costs([1, 4], 1e-3, [1.6e-3, 1.9e-3, 2.2e-3])
    rows, figures = replay_rows(profile, c, [1, 4], adaptive=True)
    names = [(r["system"], r["batch_size"]) for r in rows]
    assert ("spec chain(3), adaptive lengths, pessimistic", 4) in names and len(rows) == 10
    warm = [f for f in figures if f.get("system") == "adaptive lengths, warm, pessimistic"]
    assert [f["speedup_vs_ar"] for f in warm] == [
        replay_adaptive(profile, c, b, warm=True).speedup for b in (1, 4)]
    for bound, unknown_agrees in (("pessimistic", False), ("optimistic", True)):
        rule = [f for f in figures if f.get("system") == f"adaptive lengths, {bound}"]
        assert [f["batch_size"] for f in rule] == [1, 4]
        want = replay_adaptive(profile, c, 4, unknown_agrees=unknown_agrees)
        got = next(r for r in rows if r["system"].endswith(f"adaptive lengths, {bound}") and
                   r["batch_size"] == 4)
        assert got["tokens_per_s"]["median"] == pytest.approx(want.tokens_per_s)
        assert got["label"] == "replayed acceptance"


def test_the_two_replays_hold_the_rule_replayed_on_the_true_agreement(monkeypatch):
    # The profile hides the agreement after every full chain; replayed on the agreement it was
    # recorded from, the rule lands between the replay that counts those drafts wrong and the
    # one that counts them right.
    rnd = random.Random(21)
    maps = [[rnd.random() < 0.75 for _ in range(rnd.randint(40, 80))] for _ in range(6)]
    profile = profile_from_agreement(4, maps)
    assert any(a == 4 for row in profile.accepted_lengths for a in row)
    c = chain_round_costs([1, 2], 1e-3, [1.3e-3, 1.6e-3, 1.9e-3, 2.2e-3])
    lower, upper = agreement_maps(profile), agreement_maps(profile, unknown_agrees=True)
    for r, m in zip(lower, maps):
        assert all(m[p] for p in range(len(m)) if r[p])          # never more than true
    for u, m in zip(upper, maps):
        assert all(u[p] for p in range(len(m)) if m[p])          # never less than true
    for batch in (1, 2):
        low = replay_adaptive(profile, c, batch).tokens_per_s
        high = replay_adaptive(profile, c, batch, unknown_agrees=True).tokens_per_s
        assert low <= high
        truth = _replay_on(maps, profile, c, batch, monkeypatch)
        assert low <= truth * (1 + 1e-9) and truth <= high * (1 + 1e-9)


def _replay_on(maps, profile, c, batch, monkeypatch):
    """The rule replayed on the full agreement the profile was recorded from."""
    import specpilot.bench.adaptive_replay as ar

    with monkeypatch.context() as m:
        m.setattr(ar, "agreement_maps",
                  lambda p, unknown_agrees=False: [row + [False] * 8 for row in maps])
        return ar.replay_adaptive(profile, c, batch).tokens_per_s


def test_the_rule_is_refused_where_it_cannot_be_priced(tmp_path, capsys):
    from specpilot.cli import main

    path = tmp_path / "profile.json"
    AcceptanceProfile(Chain(3), [[1, 2, 0]], [6]).save(str(path))
    argv = ["bench", "--shapes", "llama-3.1-8b:llama-3.2-1b", "--scale", "1/32", "--device",
            "cpu", "--acceptance", str(path), "--adaptive", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "needs a chain profile" in capsys.readouterr().err


def test_a_replay_on_stored_step_costs_needs_no_measuring(tmp_path):
    from specpilot.cli import main

    rnd = random.Random(9)
    profile = profile_from_agreement(3, [[rnd.random() < 0.6 for _ in range(50)]
                                         for _ in range(4)])
    path = tmp_path / "profile.json"
    profile.save(str(path))
    c = chain_round_costs([1, 4], 1e-3, [1.6e-3, 1.9e-3, 2.2e-3])
    for b in (1, 4):
        c.target_costs[b].update({4: 1.5e-3})
        c.drafter_costs[b] = {1: 3e-4, 2: 3.5e-4}
        c.accept_costs.setdefault("chain(3)", {})[b] = 1e-5
    shapes = "llama-3.1-8b:llama-3.2-1b"
    measured = {"settings": {"shapes": shapes, "device": "cuda", "dtype": "bfloat16",
                             "scale": 1.0, "context": 64},
                "environment": {"device": "cuda", "gpu": "NVIDIA H200", "cuda": "13.0",
                                "torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0",
                                "python": "3.12.3", "date": "2026-11-29T20:17:04+00:00",
                                "command": "specpilot bench --shapes ..."},
                "step_costs": c.to_json()}
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(measured))
    argv = ["bench", "--shapes", shapes, "--acceptance", str(path), "--adaptive", "--batch-sizes",
            "1,4", "--step-costs", str(source), "--out-dir", str(tmp_path), "--name", "again"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "again.json").read_text())
    assert doc["environment"]["gpu"] == "NVIDIA H200" and "replayed_on" in doc["environment"]
    assert doc["settings"]["dtype"] == "bfloat16" and doc["settings"]["step_costs_from"]
    got = {(r["system"], r["batch_size"]): r["tokens_per_s"]["median"] for r in doc["rows"]}
    want = replay_adaptive(profile, StepCosts.from_json(c.to_json()), 4, unknown_agrees=True)
    assert got[("spec chain(3), adaptive lengths, optimistic", 4)] == pytest.approx(
        want.tokens_per_s)
    assert got[("spec chain(3)", 1)] == pytest.approx(replay(profile, c, 1).tokens_per_s)
    # Costs of other shapes, or a batch size they lack, are refused with what to do.
    assert main(argv[:2] + ["llama-3.2-1b:llama-3.2-1b"] + argv[3:]) == 2
    assert main(argv[:7] + ["1,16"] + argv[8:]) == 2


@pytest.mark.parametrize("batch", [4, 8])
def test_after_a_warm_up_a_batch_that_would_lose_runs_plain_steps_from_its_first_round(batch):
    """Eight requests (what the decoder must remember before it starts a batch off) of a
    drafter that is nearly always wrong: played cold, the rule pays the rounds before its
    turn-off; played after a warm-up pass over the same requests (as the bench times), every
    batch runs plain steps only: exactly plain AR. A drafter that is nearly always right, with
    rounds cheap enough that it pays, is never started off."""
    from specpilot.runtime.workload_memory import START_OFF_AFTER

    assert START_OFF_AFTER == 8
    rnd = random.Random(30 + batch)
    dear = chain_round_costs([batch], 1e-3, [(1 + 0.8 * n) * 1e-3 for n in range(1, 5)])
    bad = profile_from_agreement(4, [[rnd.random() < 0.05 for _ in range(60)]
                                     for _ in range(8)])
    cold, warm = replay_adaptive(bad, dear, batch), replay_adaptive(bad, dear, batch, warm=True)
    assert cold.spec_seconds > cold.ar_seconds
    assert warm.spec_seconds == pytest.approx(warm.ar_seconds) and warm.mean_accepted == 1.0
    good = profile_from_agreement(4, [[rnd.random() < 0.97 for _ in range(60)]
                                      for _ in range(8)])
    cheap = chain_round_costs([batch], 1e-3, [(1 + 0.3 * n) * 1e-3 for n in range(1, 5)])
    speculating = replay_adaptive(good, cheap, batch)
    assert speculating.speedup > 1.3
    assert replay_adaptive(good, cheap, batch, warm=True).speedup == pytest.approx(
        speculating.speedup)


def test_the_host_lag_applies_a_length_two_replays_later_as_the_graphed_loop_does():
    """A drafter that never agrees, one request of 60 decode tokens: applied at the next round,
    the rule runs one chain of 4, seven of 1 (the moving average), then turns off at round 8
    (OFF_AFTER_ROUNDS) and runs plain steps. With the graphed loop's lag (replays of 4 rounds,
    the length chosen two replays back) the first two replays run the first length, 4; the
    third the length chosen after round 4, which is 1; from the fourth, the 0 chosen at round
    8: hand-counted costs."""
    from specpilot.bench.adaptive_replay import round_costs_for

    assert OFF_AFTER_ROUNDS == 8
    profile = profile_from_agreement(4, [[False] * 60])
    c = chain_round_costs([1], 1e-3, [(1 + 0.8 * n) * 1e-3 for n in range(1, 5)])
    sec = round_costs_for(c, 1, 4)
    now = replay_adaptive(profile, c, 1)
    lagged = replay_adaptive(profile, c, 1, host_lag=(4, 2))
    assert now.spec_steps == lagged.spec_steps == 60      # one token per round either way
    assert now.spec_seconds == pytest.approx(sec[4] + 7 * sec[1] + 52 * sec[0])
    assert lagged.spec_seconds == pytest.approx(8 * sec[4] + 4 * sec[1] + 48 * sec[0])
    with pytest.raises(ProfileError):
        replay_adaptive(profile, c, 1, host_lag=(0, 2))
