"""The tree from measured acceptance as bench systems (specpilot/bench/shaped_tree_system.py,
priced by tree_pricing.py and timed_tree_pricing.py): the shape follows the ranks it is given,
the batch it runs at and the round costs it is priced by, it is profiled once on held-out
prompts, and the decoder it builds runs that very tree (its per-round acceptance equals the
tree's replay over the reference's ranks, in float32) exactly like greedy AR, forcing clean.
"""
import random
from dataclasses import replace

import pytest

from hf_factory import make_checkpoint, noisy_checkpoint, random_prompts
from shaped_tree_check import assert_runs_its_tree
from specpilot.bench.shaped_tree_system import (HeldOutProfile, ShapedTreeSystem,
                                                held_out_prompts, shaped_tree_systems)
from specpilot.bench.shapes import preset_deployment
from specpilot.bench.timed_tree_pricing import (PROBES, best_timed_topology, fit_chain_cost,
                                                fit_tree_cost)
from specpilot.bench.tree_pricing import best_shaped_topology, shapes_and_chains, with_topology
from specpilot.cost import CostModel
from specpilot.cost.acceptance import RankProfile
from specpilot.cost.gpu_specs import gpu_spec
from specpilot.cost.topologies import shaped_topologies
from specpilot.deploy import build_deployment
from specpilot.ir import Chain, SetMaxBatchSize, Tree, replay, stock_program
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.decoder import load_pair
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()


def _profile(rank_of, requests=24, tokens=64, seed=0):
    """A RankProfile whose every rank is drawn by `rank_of(rng)`."""
    rng = random.Random(seed)
    return RankProfile([[rank_of(rng) for _ in range(tokens - 1)] for _ in range(requests)],
                       [tokens] * requests)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shaped")
    target = make_checkpoint(root, "llama3", name="target", seed=71, hidden_size=64,
                             intermediate_size=128)
    drafter = noisy_checkpoint(target, "drafter", noise=0.3, seed=72)
    return target, drafter


@pytest.fixture(scope="module")
def stock(pair_dirs):
    return stock_program(build_deployment(*pair_dirs, dtype="float32"))


def test_a_drafter_always_right_gets_a_chain_one_right_half_the_time_a_wider_tree(stock):
    model = CostModel(gpu_spec("h200"))
    perfect, _ = best_shaped_topology(stock, _profile(lambda rng: 0), 1, model)
    assert isinstance(perfect, Chain) and perfect.k >= 2
    # Top-1 or top-2, evenly: a second candidate at depth 1 doubles what depth 1 accepts.
    split, _ = best_shaped_topology(stock, _profile(lambda rng: rng.randrange(2)), 1, model)
    assert split.level_widths()[0] >= 2


def test_the_shape_shrinks_as_verifying_gets_dearer():
    # A Llama-3.1-8B / 3.2-1B-shaped pair on the H200: at batch 64 every drafted node is
    # verified 64 times over, so the cost model must pick a smaller tree than at batch 1 (a
    # mixed drafter, ranks 0-3), each the best it sees among the shapes at its batch.
    stock = stock_program(preset_deployment("llama-3.1-8b:llama-3.2-1b", "h200"))
    model = CostModel(gpu_spec("h200"))
    acceptance = _profile(lambda rng: min(int(rng.expovariate(1.2)), 3), seed=3)
    chosen = {b: best_shaped_topology(stock, acceptance, b, model) for b in (1, 64)}
    assert chosen[64][0].num_nodes < chosen[1][0].num_nodes
    for batch, (_, tps) in chosen.items():
        sized = replace(stock, batch=replace(stock.batch, max_batch_size=batch))
        every = [model.predicted_tokens_per_s(with_topology(sized, t), acceptance, batch)
                 for t in shapes_and_chains(acceptance)]
        assert tps == pytest.approx(max(every))


def test_held_out_prompts_follow_the_benched_ones():
    prompts = [[i] for i in range(10)]
    assert held_out_prompts(prompts, 4, count=3) == [[4], [5], [6]]
    assert held_out_prompts(prompts, 8) == [[8], [9]]
    assert held_out_prompts(prompts, 10) == []


@pytest.mark.parametrize("pricing", ["datasheet", "timed"])
def test_the_system_runs_the_tree_it_chose_exactly_and_forced_clean(pair_dirs, pricing):
    """Eager on the CPU; tests/gpu/test_shaped_tree_gpu.py runs it graphed."""
    assert_runs_its_tree(*pair_dirs, "cpu", graphed=False, pricing=pricing)


def test_without_a_model_the_shape_is_priced_by_one_calibrated_at_the_batch(pair_dirs):
    """As a compile's round zero: greedy AR and the stock chain timed on held-out prompts, each
    priced at the tokens it decoded, and the spec refitted to both."""
    pair = load_pair(*pair_dirs, "float32", "cpu")
    stock = replay(stock_program(build_deployment(*pair_dirs, dtype="float32")),
                   [SetMaxBatchSize(2)])
    held_out = random_prompts((6, 4, 8, 5), seed=75)
    system = ShapedTreeSystem("sequoia", stock, pair, HeldOutProfile(pair, held_out, 10),
                              graphs_only=False)
    topology, priced = system.chosen(2)
    assert priced["pricing"] == "calibrated"
    model = system.models[2]
    points = {p.label: p for p in model.calibration.points}
    assert list(points) == ["ar", "stock"] and all(p.measured_s > 0 for p in points.values())
    # Both runs decode greedy AR exactly here (float32): priced at its lengths, the points hold
    # the datasheet model's roofline and overhead seconds of those runs.
    datasheet = CostModel(gpu_spec("cpu"))
    lengths = [len(p) for p in held_out]
    decoded = [len(t) for t in generate_ar(pair.target, held_out, 10, pair.eos_ids).tokens]
    for label, prediction in (
            ("ar", datasheet.predict_ar_run(stock, lengths, decoded, 2)),
            ("stock", datasheet.predict_speculative_run(stock, system.profile.acceptance(),
                                                        lengths, decoded))):
        assert (points[label].roofline_s, points[label].overhead_s) == pytest.approx(
            (prediction.roofline_s, prediction.overhead_s), rel=1e-9)
    assert (topology, priced["predicted_tokens_per_s"]) == best_shaped_topology(
        system.program, system.profile.acceptance(), 2, model)


def _tree_law(t):
    return 2e-3 + 5e-5 * (t.num_nodes + 1) + 3e-4 * t.depth


def test_the_tree_fit_recovers_a_linear_round_cost_and_refuses_probes_it_cannot_split():
    # The chain probes follow another law (a chain round runs other code): ignored.
    probes = [(t, 1e-3 + 1e-4 * t.depth if isinstance(t, Chain) else _tree_law(t))
              for t in PROBES]
    assert fit_tree_cost(probes) == pytest.approx((2e-3, 5e-5, 3e-4), rel=1e-6)
    # Noise that makes the free fit's token cost negative: held at 0, never a discount.
    noisy = [(t, 2e-3 - 1e-6 * (t.num_nodes + 1) + 3e-4 * t.depth) for t in PROBES]
    base, per_token, per_depth = fit_tree_cost(noisy)
    assert per_token == 0 and per_depth > 0 and base > 0
    # Trees of one depth cannot tell a token from a level; chains alone leave no tree to fit.
    with pytest.raises(SpecPilotError, match="size and depth"):
        fit_tree_cost([(Tree((k,)), 1e-3 * k) for k in (2, 4, 8)])
    with pytest.raises(SpecPilotError, match="size and depth"):
        fit_tree_cost([(Chain(k), 1e-3 * k) for k in (1, 2, 4)])


def test_the_chain_fit_recovers_a_chain_round_cost_from_the_chains_alone():
    # Chains at 1 ms + 0.24 ms a level, trees at a dearer law: the chain fit sees the chains.
    probes = [(t, 1e-3 + 2.4e-4 * t.depth if isinstance(t, Chain) else _tree_law(t))
              for t in PROBES]
    assert fit_chain_cost(probes) == pytest.approx((1e-3, 2.4e-4), rel=1e-9)
    # Rounds that get cheaper with depth (noise): the level cost held at 0, the base their mean.
    falling = [(Chain(k), 2e-3 - 1e-5 * k) for k in (1, 3, 6)]
    assert fit_chain_cost(falling) == (pytest.approx(2e-3 - 1e-5 * 10 / 3, rel=1e-9), 0.0)


def test_the_chain_fit_needs_chains_of_two_depths():
    # Trees of many depths do not stand in for a second chain depth.
    probes = [(Chain(3), 2e-3), (Chain(3), 2.1e-3)] + [(t, _tree_law(t)) for t in PROBES
                                                         if not isinstance(t, Chain)]
    with pytest.raises(SpecPilotError, match="chain probes of at least two depths"):
        fit_chain_cost(probes)


def test_timed_pricing_grows_the_tree_as_its_tokens_get_cheap(stock):
    # Ranks 0-3: wider trees accept more. Where a verified token costs nothing next to a round
    # the chosen tree is large; where it costs half a round, a small one: the shape with the
    # most expected tokens a round (replayed over the ranks, plus the bonus) per second. Chains
    # are priced by the same law (their tokens folded into their levels).
    acceptance = _profile(lambda rng: min(int(rng.expovariate(1.2)), 3), seed=5)
    cheap, _ = best_timed_topology(stock, acceptance, 4, (1.0 + 1e-4, 1e-4 + 0.05),
                                   (1.0, 1e-4, 0.05))
    dear, tps = best_timed_topology(stock, acceptance, 4, (1.5, 0.55), (1.0, 0.5, 0.05))
    assert cheap.num_nodes >= 32 and dear.num_nodes <= 3
    every = {t: 4 * (1 + acceptance.mean_accepted(t)) / (1.0 + 0.5 * (t.num_nodes + 1)
                                                         + 0.05 * t.depth)
             for t in shapes_and_chains(acceptance)}
    assert tps == pytest.approx(every[dear]) and every[dear] == max(every.values())


def test_timed_pricing_prices_chains_and_trees_each_by_its_own_fit(stock):
    # Top-1 or top-2, evenly: width pays, so the dynamic programme shapes no chain at all; the
    # pricing still offers every chain up to its depth.
    acceptance = _profile(lambda rng: rng.randrange(2))
    shaped = shaped_topologies(acceptance)
    assert not any(isinstance(t, Chain) for t in shaped)
    assert shapes_and_chains(acceptance) == shaped + tuple(Chain(k) for k in range(1, 7))
    chain_fit = (1.0, 0.05)
    # Trees priced like chains: a branched tree.
    wide, _ = best_timed_topology(stock, acceptance, 1, chain_fit, (1.0, 0.0, 0.05))
    assert not isinstance(wide, Chain) and wide.level_widths()[0] >= 2
    # A tree level dear (a tree round's extra code): a chain, the best chain by the chain fit.
    chain, tps = best_timed_topology(stock, acceptance, 1, chain_fit, (1.0, 0.0, 2.0))
    assert isinstance(chain, Chain)
    chains = {k: (1 + acceptance.mean_accepted(Chain(k))) / (1.0 + 0.05 * k)
              for k in range(1, 7)}
    assert tps == pytest.approx(chains[chain.k]) and chains[chain.k] == max(chains.values())


def test_both_pricings_share_one_held_out_profile(pair_dirs, stock):
    # The ranks are measured once for both systems; on the benched prompts they say so.
    pair = load_pair(*pair_dirs, "float32", "cpu")
    profile = HeldOutProfile(pair, random_prompts((6, 4), seed=76), 8, benched=True)
    systems = shaped_tree_systems(stock, pair, profile)
    assert [s.pricing for s in systems] == ["calibrated", "timed"]
    assert all(s.profile is profile for s in systems)
    assert profile.acceptance() is systems[1].profile.acceptance()
    assert all(any("timed on" in n for n in s.notes) for s in systems)
    with pytest.raises(SpecPilotError, match="no prompts"):
        HeldOutProfile(pair, [], 8)
