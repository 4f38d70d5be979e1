"""`run_program_decode`: a Program's mechanisms, read from the IR, decode exactly like greedy AR
and pass forcing; stock mechanisms keep the stock loop."""
from dataclasses import replace

import pytest

from specpilot.deploy import build_deployment
from specpilot.ir import (Chain, DynamicTree, LayerSkipPrune, LowPrecisionPrune, SetBatchLayout,
                          SetDraftLengthPolicy, SetMaxBatchSize, SetRefill, SetTopology,
                          SetVerifyPrune, SparseTree, Tree, replay, stock_program)
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.mechanisms import (force_program_decode, run_program_decode,
                                          uses_mechanisms)
from specpilot.runtime.speculative import speculative_generate

from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import MAX_NEW, SEEDS, assert_clean, pair_setup

PROGRAMS = {
    "dynamic+prune+ragged+continuous": [
        SetTopology(DynamicTree(6, 3, 3)), SetVerifyPrune(LayerSkipPrune((1,), 2)),
        SetBatchLayout("ragged"), SetMaxBatchSize(3), SetRefill("continuous")],
    "sparse+low-precision": [
        SetTopology(SparseTree(((0,), (1,), (0, 0), (0, 1), (1, 0)))), SetMaxBatchSize(2),
        SetVerifyPrune(LowPrecisionPrune("bfloat16", 1))],
    "adaptive+ragged": [SetMaxBatchSize(3), SetDraftLengthPolicy("per_request_adaptive", 8),
                        SetBatchLayout("ragged")],
    "tree+continuous": [SetTopology(Tree((2, 2))), SetMaxBatchSize(2), SetRefill("continuous")],
}


def program_of(s, records):
    stock = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    return replay(stock, records)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("seed", SEEDS)
def test_program_mechanisms_match_ar_and_pass_forcing(seed, name):
    s = pair_setup(seed)
    program = program_of(s, PROGRAMS[name])
    assert uses_mechanisms(program)
    result = run_program_decode(program, s["target"], s["drafter"], s["prompts"], MAX_NEW, s["eos"])
    assert result.tokens == s["reference"].tokens
    assert result.stats["steps"] == result.target_forwards > 0
    report = force_program_decode(program, s["target"], s["drafter"], s["prompts"], s["reference"])
    assert_clean(report, s["reference"])


def test_stock_mechanisms_keep_the_stock_loop():
    s = pair_setup(SEEDS[0])
    program = program_of(s, [SetTopology(Tree((2, 2))), SetMaxBatchSize(3)])
    assert not uses_mechanisms(program)
    result = run_program_decode(program, s["target"], s["drafter"], s["prompts"], MAX_NEW, s["eos"])
    first = speculative_generate(s["target"], s["drafter"], s["prompts"][:3], MAX_NEW, Tree((2, 2)),
                                 s["eos"])
    rest = speculative_generate(s["target"], s["drafter"], s["prompts"][3:], MAX_NEW, Tree((2, 2)),
                                s["eos"])
    assert result.tokens == first.tokens + rest.tokens == s["reference"].tokens
    assert result.target_forwards == first.target_forwards + rest.target_forwards
    assert result.accepted_lengths == first.accepted_lengths + rest.accepted_lengths
    assert_clean(force_program_decode(program, s["target"], s["drafter"], s["prompts"],
                                      s["reference"]), s["reference"])


def test_refuses_what_it_cannot_run():
    s = pair_setup(SEEDS[0])
    program = program_of(s, [SetMaxBatchSize(2)])
    with pytest.raises(SpecPilotError, match="drafter"):
        run_program_decode(program, s["target"], None, s["prompts"], 4)
    typical = replace(program, verify=replace(program.verify, acceptance="typical"))
    with pytest.raises(SpecPilotError, match="only 'greedy'"):
        run_program_decode(typical, s["target"], s["drafter"], s["prompts"], 4)
    assert program.draft.topology == Chain(4)
