"""The batch-length rule replayed on a chain profile (specpilot/bench/adaptive_replay.py): the
agreement read off a profile by hand, the fixed chain replayed exactly as the chain replay does,
a rule that may not turn off and sees every length cost the same keeps the longest chain, and
one that may turn off never costs more than plain AR plus the rounds before it may."""
import random

import pytest

from specpilot.bench.adaptive_replay import agreement_maps, replay_adaptive
from specpilot.bench.replay import AcceptanceProfile, ProfileError, replay
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.topology import Chain, Tree
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS


def profile_from_agreement(k, maps):
    """The chain(k) profile a greedy decoder with this per-position agreement would record."""
    lengths, tokens = [], []
    for agree in maps:
        row, position = [], 0
        while position < len(agree):
            a = 0
            while a < k and position + a < len(agree) and agree[position + a]:
                a += 1
            row.append(a)
            position += a + 1
        lengths.append(row)
        tokens.append(position + 1)
    return AcceptanceProfile(Chain(k), lengths, tokens)


def costs(batch_sizes, ar, rounds):
    """StepCosts with a plain step of `ar` seconds and a graphed chain(L) round of rounds[L-1]."""
    c = StepCosts(context=64, graphed=True)
    for b in batch_sizes:
        c.target_costs[b] = {1: ar * (1 + 0.01 * b)}
        for n, seconds in enumerate(rounds, start=1):
            c.round_costs.setdefault(str(Chain(n)), {})[b] = seconds * (1 + 0.01 * b)
    return c


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
    flat = costs([batch], 1e-3, [2e-3] * 4)          # every length costs the same: k wins
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
    dear = costs([batch], 1e-3, [(1 + 0.8 * n) * 1e-3 for n in range(1, 5)])
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
    c = costs([1, 4], 1e-3, [1.6e-3, 1.9e-3, 2.2e-3])
    rows, figures = replay_rows(profile, c, [1, 4], adaptive=True)
    names = [(r["system"], r["batch_size"]) for r in rows]
    assert ("spec chain(3), adaptive lengths", 4) in names and len(rows) == 6
    rule = [f for f in figures if f.get("system") == "adaptive lengths"]
    assert [f["batch_size"] for f in rule] == [1, 4]
    want = replay_adaptive(profile, c, 4)
    got = next(r for r in rows if r["system"].endswith("adaptive lengths") and
               r["batch_size"] == 4)
    assert got["tokens_per_s"]["median"] == pytest.approx(want.tokens_per_s)
    assert got["label"] == "replayed acceptance"


def test_the_rule_is_refused_where_it_cannot_be_priced(tmp_path, capsys):
    from specpilot.cli import main

    path = tmp_path / "profile.json"
    AcceptanceProfile(Chain(3), [[1, 2, 0]], [6]).save(str(path))
    argv = ["bench", "--shapes", "llama-3.1-8b:llama-3.2-1b", "--scale", "1/32", "--device",
            "cpu", "--acceptance", str(path), "--adaptive", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "needs a chain profile" in capsys.readouterr().err
