"""Acceptance models: the rank profile replays exactly what the runtime's speculative decoding
accepts, for chains and trees; the per-depth models read profiles correctly."""
import json

import pytest
import torch

from specpilot.bench.replay import AcceptanceProfile
from specpilot.cost.acceptance import (AcceptanceError, AssumedAcceptance, ChainProfileAcceptance,
                                       RankProfile, load_acceptance, measure_rank_profile,
                                       per_depth_from_lengths)
from specpilot.ir import Chain, Tree
from specpilot.runtime.decoder import load_pair, run_reference
from specpilot.runtime.speculative import speculative_generate
from test_search_support import agreeing_pair, one_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    target, drafter = agreeing_pair(tmp_path_factory.mktemp("pair"))
    pair = load_pair(target, drafter, "float32", "cpu")
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 97, (int(n),), generator=gen).tolist() for n in (5, 7, 6, 9)]
    reference = run_reference(pair, prompts, 28)
    return pair, prompts, reference, measure_rank_profile(pair.drafter, prompts, reference.tokens)


@pytest.mark.parametrize("topology", [Chain(1), Chain(3), Chain(6), Tree((2, 2)), Tree((3, 1, 1)),
                                      Tree((4,))])
def test_rank_profile_replays_the_runtimes_accepted_lengths(measured, topology):
    pair, prompts, reference, profile = measured
    for i, prompt in enumerate(prompts):   # one request at a time: no padding in the reference run
        run = speculative_generate(pair.target, pair.drafter, [prompt], 28, topology, pair.eos_ids)
        assert run.tokens[0] == reference.tokens[i]
        simulated = profile.simulate(topology)[i]
        # The last runtime step may accept drafts past the reference's end (no rank is known
        # there); every earlier step must match exactly.
        assert simulated[:-1] == run.accepted_lengths[0][:-1]
        assert simulated[-1] <= run.accepted_lengths[0][-1]
        assert len(simulated) == len(run.accepted_lengths[0])


def test_rank_profile_gives_trees_credit_for_lower_ranks(measured):
    _, _, _, profile = measured
    rates = profile.rank_rates(3)
    assert 0.0 < rates[0] < 1.0 and rates[1] > 0.0     # the pair agrees part of the time
    assert profile.mean_accepted(Tree((2,))) > profile.mean_accepted(Chain(1))
    assert profile.mean_accepted(Chain(4)) >= profile.mean_accepted(Chain(2))


def test_rank_profile_json_round_trip_and_validation(measured, tmp_path):
    _, _, _, profile = measured
    path = tmp_path / "ranks.json"
    path.write_text(json.dumps(profile.to_json()))
    again = load_acceptance(str(path))
    assert again.ranks == profile.ranks and again.new_tokens == profile.new_tokens
    bad = profile.to_json()
    bad["new_tokens"][0] += 1
    with pytest.raises(AcceptanceError, match="request 0"):
        RankProfile.from_json(bad)


def test_per_depth_acceptance_hand_computed():
    # steps accepting 0, 1, 2, 2: depth 1 reached 4 times, passed 3; depth 2: 3 -> 2
    assert per_depth_from_lengths([[0, 1], [2, 2]], 2) == [3 / 4, 2 / 3]
    model = AssumedAcceptance(0.5)
    assert model.mean_accepted(Chain(3)) == pytest.approx(0.5 + 0.25 + 0.125)
    assert model.mean_accepted(Tree((4, 4))) == pytest.approx(0.75)   # no ranks: no branch credit


def test_chain_profile_acceptance_reads_a_bench_profile(tmp_path):
    profile = AcceptanceProfile(Chain(2), [[2, 0, 1], [2, 2]], [7, 7])
    path = tmp_path / "profile.json"
    profile.save(str(path))
    model = load_acceptance(str(path))
    # depth 1: 4 of 5 steps; depth 2: 3 of those 4
    assert model.rates == [4 / 5, 3 / 4]
    assert model.mean_accepted(Chain(2)) == pytest.approx(4 / 5 + 4 / 5 * 3 / 4)
    assert ChainProfileAcceptance(profile).rates == model.rates
