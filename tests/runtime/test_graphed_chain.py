"""The device-resident chain decoder of runtime/graphed_chain.py, its round run eagerly
(capture=False) on CPU in float32 against greedy AR; capture itself is covered by tests/gpu."""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.errors import CapacityError
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.speculative import speculative_generate
from specpilot.ir.topology import Chain, DynamicTree, Tree

from adaptive_reference import WrongBefore, reference_batch_lengths, rounds_from
from mechanism_setup import (MAX_NEW, ContraryDrafter, assert_caught, assert_clean, noisy_copy,
                             pair_setup)


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("k,batch", [(1, 4), (3, 4), (4, 2), (6, 3)])
def test_equals_greedy_ar_with_requests_ending_at_different_times(seed, k, batch):
    s = pair_setup(seed)
    decoder = GraphedChainDecoder(s["target"], s["drafter"], batch, 48, k, s["eos"], capture=False)
    tokens, accepted = [], []
    for start in range(0, len(s["prompts"]), batch):
        r = decoder.generate(s["prompts"][start:start + batch], MAX_NEW)
        tokens += r.tokens
        accepted += r.accepted_lengths
        assert 1.0 <= r.mean_accepted <= k + 1
    assert tokens == s["reference"].tokens
    # A well-matched drafter gets drafts accepted, and never more than k per round.
    assert all(0 <= a <= k for row in accepted for a in row)
    assert sum(a for row in accepted for a in row) > 0


def test_acceptance_counts_match_the_eager_chain_decoder():
    s = pair_setup(11)
    prompts = s["prompts"]
    want = speculative_generate(s["target"], s["drafter"], prompts, MAX_NEW, Chain(3))
    decoder = GraphedChainDecoder(s["target"], s["drafter"], len(prompts), 48, 3, capture=False)
    got = decoder.generate(prompts, MAX_NEW)
    assert got.tokens == want.tokens == s["plain"].tokens
    assert got.accepted_lengths == want.accepted_lengths
    assert got.target_forwards == want.target_forwards + 1  # one round past the end is queued


def test_always_wrong_drafter_still_gives_ar_output():
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"],
                                  capture=False)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    assert all(a == 0 for row in r.accepted_lengths for a in row) and r.mean_accepted == 1.0


def test_perfect_drafter_accepts_whole_chains():
    s = pair_setup(11)
    decoder = GraphedChainDecoder(s["target"], s["target"], 4, 48, 3, capture=False)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["plain"].tokens
    # 1 token from prefill, then rounds of 4 (the last round may overshoot and is cut).
    assert all(row[:-1] == [3] * (len(row) - 1) for row in r.accepted_lengths)


def test_forcing_is_clean_and_catches_a_wrong_target():
    s = pair_setup(11)
    ref = s["reference"]
    decoder = GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 4, capture=False)
    assert_clean(compare_to_reference(decoder.force(s["prompts"], ref.tokens), ref,
                                      default_tolerance(torch.float32)), ref)
    wrong = GraphedChainDecoder(noisy_copy(s["target_dir"], 0.3, seed=5), s["drafter"], 4, 48, 4,
                                capture=False)
    assert_caught(compare_to_reference(wrong.force(s["prompts"], ref.tokens), ref,
                                       default_tolerance(torch.float32)), ref)


def test_an_acceptance_that_trusts_one_draft_too_many_is_caught():
    """Mutation: accept one draft past the first mismatch. Exactness catches it."""
    s = pair_setup(4)

    class OffByOne(GraphedChainDecoder):
        @staticmethod
        def _accepted(drafts, g):
            return torch.clamp(GraphedChainDecoder._accepted(drafts, g) + 1, max=drafts.shape[1])

    decoder = OffByOne(s["target"], s["drafter"], 4, 48, 4, capture=False)
    assert decoder.generate(s["prompts"], MAX_NEW).tokens != s["plain"].tokens


def test_one_decoder_serves_calls_of_fewer_prompts_and_other_lengths():
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], s["drafter"], 3, 40, 2, capture=False)
    for prompts in (s["prompts"][:3], s["prompts"][3:], s["prompts"][1:3]):
        assert decoder.generate(prompts, 12).tokens == generate_ar(s["target"], prompts, 12).tokens


def test_bad_requests_are_refused_with_the_fix():
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], s["drafter"], 2, 24, 4, capture=False)
    with pytest.raises(SpecPilotError, match="batch 2"):
        decoder.generate(s["prompts"][:3], 4)
    with pytest.raises(CapacityError, match="cache slots"):
        decoder.generate(s["prompts"][:1], 20)
    with pytest.raises(SpecPilotError, match="at least 1"):
        GraphedChainDecoder(s["target"], s["drafter"], 2, 24, 0, capture=False)


def test_programs_route_to_the_graphed_runtime_only_where_it_applies():
    from dataclasses import replace

    from specpilot.deploy import build_deployment
    from specpilot.ir import (CaptureGraphs, LayerSkipPrune, SetTopology, SetVerifyPrune, apply,
                              stock_program)
    from specpilot.runtime.graphed_program import force_graphed, graph_refusal, run_graphed
    from specpilot.runtime.decoder import ModelPair

    s = pair_setup(11)
    stock = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    graphed = apply(stock, CaptureGraphs(on=True))
    assert "capture_graphs is off" in graph_refusal(stock, "cpu")
    assert "CUDA" in graph_refusal(graphed, "cpu")
    pruned = apply(apply(graphed, SetTopology(Tree((2, 2)))),
                   SetVerifyPrune(LayerSkipPrune(keep_layers=(0,), top_k=1)))
    if torch.cuda.is_available():
        assert "pruned verifier" in graph_refusal(pruned, "cuda")
    # The graphed runtime itself (rounds run eagerly here) decodes and forces a Program.
    program = replace(graphed, batch=replace(graphed.batch, max_batch_size=3))
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert r.tokens == s["reference"].tokens and r.target_forwards > 2
    report = force_graphed(program, pair, s["prompts"], s["reference"], capture=False)
    assert_clean(report, s["reference"])


def test_round_timing_runs_every_row_on():
    from specpilot.bench.step_costs import measure_round

    s = pair_setup(4)
    for topology in (Chain(3), Tree((2, 2)), DynamicTree(budget=4, depth=2, width=2)):
        assert 0 < measure_round(s["target"], s["drafter"], 2, topology, context=8,
                                 graphed=False, warmup=1, repeats=2) < 5.0
    decoder = GraphedChainDecoder(s["target"], s["drafter"], 2, 40, 3, capture=False)
    run = decoder.timing_round(8)
    run()
    assert bool(decoder.active.all()) and (decoder.length > 8).all()
    with pytest.raises(CapacityError):
        decoder.timing_round(38)


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("cap", [2, 5])
def test_adaptive_lengths_keep_the_output_and_follow_acceptance(seed, cap):
    s = pair_setup(seed)
    decoder = GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 5, s["eos"], capture=False,
                                  adaptive=True, length_cap=cap)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    # No request ever accepts more than the cap; rounds of several lengths were replayed
    # (0: plain steps, where the batch stopped speculating).
    assert max(a for row in r.accepted_lengths for a in row) <= cap
    used = {int(k.rsplit("_", 1)[1]) for k in r.stats}
    assert used <= set(range(cap + 1)) and cap in used
    assert sum(r.stats.values()) == r.target_forwards - 1
    assert_clean(compare_to_reference(decoder.force(s["prompts"], s["reference"].tokens),
                                      s["reference"], default_tolerance(torch.float32)),
                 s["reference"])


@pytest.mark.parametrize("turn_off", [True, False])
def test_a_drafter_that_is_always_wrong_shortens_the_chain_and_turns_speculation_off(turn_off):
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"],
                                  capture=False, adaptive=True, turn_off=turn_off)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    # The batch's length after each round, by the rule in float64 (every request accepts
    # nothing, so they share one estimate): 3, 2, 1, 1, ..., then plain steps for good from the
    # tenth round on (or 1 draft, where the batch may not turn off): the upper bound on the
    # acceptance after n rejected rounds, the mean of Beta(1, n + 1) plus two deviations, first
    # falls below 0.25 (where E(1) = 1 + alpha < cost(1) = 1.25) at n = 10 (0.237; 0.257 at 9).
    # The first two rounds run the full length (the host reads the length two replays behind).
    rounds = r.target_forwards - 1
    wanted = reference_batch_lengths(4, lambda n: 0, rounds, turn_off=turn_off)[1:]
    graphs = [4, 4] + wanted[:rounds - 2]
    assert wanted[:10] == [3, 2] + [1] * 7 + [0 if turn_off else 1] and rounds > 12
    assert r.stats == {f"rounds_chain_{n}": graphs.count(n) for n in sorted(set(graphs))}
    assert r.drafter_forwards == 1 + sum(graphs)       # plain steps run no drafter


def test_measured_round_costs_decide_whether_speculation_pays():
    s = pair_setup(11)
    cheap, dear = [1.0, 1.1, 1.2, 1.3], [1.0, 3.0, 5.0, 7.0]
    for costs, off in ((cheap, False), (dear, True)):
        decoder = GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 3, s["eos"],
                                      capture=False, adaptive=True, round_costs=costs)
        r = decoder.generate(s["prompts"], MAX_NEW)
        assert r.tokens == s["reference"].tokens
        assert ("rounds_chain_0" in r.stats) == off
    with pytest.raises(SpecPilotError, match="one cost per length 0..3"):
        GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 3, capture=False, adaptive=True,
                            round_costs=[1.0, 2.0])


@pytest.mark.parametrize("cap", [3, 5])
def test_a_perfect_drafter_keeps_adaptive_rounds_at_the_cap(cap):
    s = pair_setup(11)
    decoder = GraphedChainDecoder(s["target"], s["target"], 4, 48, 5, s["eos"], capture=False,
                                  adaptive=True, length_cap=cap)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    assert set(r.stats) == {f"rounds_chain_{cap}"}
    assert all(a == cap for row in r.accepted_lengths for a in row)


def test_a_drafter_that_turns_right_gets_adaptive_rounds_back_to_the_cap():
    s = pair_setup(4)
    k, new, switch = 4, 40, 16
    reference = generate_ar(s["target"], s["prompts"], new)
    # A batch that may turn speculation off would, before the switch, and not come back.
    decoder = GraphedChainDecoder(s["target"], WrongBefore(s["target"], switch), 4, 64, k,
                                  capture=False, adaptive=True, turn_off=False)
    r = decoder.generate(s["prompts"], new)
    assert r.tokens == reference.tokens
    # Drafts were rejected before the switch. The batch's length follows its slowest request,
    # so once every request's root is past the switch the batch is back at the full chain
    # within four rounds, for good: from the worst state it wants 1, 3, then 4 drafts, and the
    # graph's length follows two rounds behind (accepted 1, 1, 1, 3, 4 at the slowest).
    rows = list(zip(s["prompts"], r.accepted_lengths))
    assert all(0 in accepted for _, accepted in rows)
    right = max(rounds_from(accepted, len(prompt), switch) for prompt, accepted in rows)
    longest = max(len(accepted) for _, accepted in rows)
    assert longest > right + 5
    for _, accepted in rows:
        assert accepted[right + 4:] == [k] * max(0, len(accepted) - right - 4)


@pytest.mark.parametrize("budget,expect_off", [(4, True), (12, False)])
def test_a_token_budget_caps_the_chain_or_turns_speculation_off(budget, expect_off):
    from specpilot.deploy import build_deployment
    from specpilot.ir import CaptureGraphs, SetDraftLengthPolicy, SetMaxBatchSize, apply, stock_program
    from specpilot.runtime.decoder import ModelPair
    from specpilot.runtime.graphed_program import (force_graphed, length_cap, release_decoders,
                                                   run_graphed)

    s = pair_setup(11)
    stock = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    program = apply(apply(apply(stock, CaptureGraphs(on=True)), SetMaxBatchSize(4)),
                    SetDraftLengthPolicy("per_request_adaptive", budget))
    # Padded rounds verify 4 x (L + 1) tokens: budget 12 allows L = 2; budget 4 allows none.
    assert length_cap(program) == (0 if expect_off else 2)
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    release_decoders()
    r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert r.tokens == s["reference"].tokens
    if expect_off:
        assert r.stats == {"speculation_off": 1} and r.mean_accepted == 1.0
        # One target forward per token (plus at most one step queued past the last EOS).
        assert 0 <= r.target_forwards - max(len(t) for t in r.tokens) <= 1
    else:
        assert max(a for row in r.accepted_lengths for a in row) <= 2 and r.mean_accepted > 1.0
    assert_clean(force_graphed(program, pair, s["prompts"], s["reference"], capture=False),
                 s["reference"])


def test_chains_of_zero_without_a_drafter_are_plain_greedy_decoding():
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], None, 4, 48, 0, s["eos"], capture=False)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    assert r.mean_accepted == 1.0 and r.drafter_forwards == 0      # no drafter, no prefill
    assert 0 <= r.target_forwards - max(len(t) for t in r.tokens) <= 1
    assert_clean(compare_to_reference(decoder.force(s["prompts"], s["reference"].tokens),
                                      s["reference"], default_tolerance(torch.float32)),
                 s["reference"])
    with pytest.raises(SpecPilotError, match="without one"):
        GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 0, capture=False)
    with pytest.raises(SpecPilotError, match="at least 1"):
        GraphedChainDecoder(s["target"], None, 4, 48, 2, capture=False)


@pytest.mark.parametrize("adaptive", [False, True])
def test_several_rounds_per_replay_give_the_same_output(adaptive):
    s = pair_setup(11)
    one = GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 3, s["eos"], capture=False,
                              adaptive=adaptive, rounds_per_replay=1)
    three = GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 3, s["eos"], capture=False,
                                adaptive=adaptive, rounds_per_replay=3)
    a, b = one.generate(s["prompts"], MAX_NEW), three.generate(s["prompts"], MAX_NEW)
    assert a.tokens == b.tokens == s["reference"].tokens
    if not adaptive:   # (adaptive lengths follow the host's choice, which is per replay)
        assert a.accepted_lengths == b.accepted_lengths
    # Rounds come in threes; at most two run after the last request finished, plus the
    # replay queued before the host saw the finish.
    rounds = b.target_forwards - 1
    assert rounds % 3 == 0 and rounds - (a.target_forwards - 1) <= 2 + 3
    assert_clean(compare_to_reference(three.force(s["prompts"], s["reference"].tokens),
                                      s["reference"], default_tolerance(torch.float32)),
                 s["reference"])
    with pytest.raises(SpecPilotError, match="at least 1"):
        GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 3, capture=False,
                            rounds_per_replay=0)


@pytest.mark.parametrize("k", [0, 3])
def test_reference_margins_equal_greedy_ars(k):
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], None if k == 0 else s["drafter"], 4, 48, k,
                                  s["eos"], capture=False, record_margins=True,
                                  rounds_per_replay=2)
    got = decoder.generate_reference(s["prompts"], MAX_NEW)
    want = s["reference"]
    assert got.tokens == want.tokens
    for g, w in zip(got.margins, want.margins):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-4, atol=1e-4)
    with pytest.raises(SpecPilotError, match="record_margins"):
        GraphedChainDecoder(s["target"], None, 4, 48, 0, capture=False).generate_reference(
            s["prompts"], 4)
