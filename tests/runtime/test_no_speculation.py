"""A Program that does not speculate (`draft.drafter` "none") decodes as greedy AR of the target:
eagerly with generate_ar's steps, and on the graphed runtime with the strong AR decoder (chain
decoder, no drafter, chains of 0; rounds run eagerly on CPU). Outputs equal the reference
(greedy AR, itself checked against HF in test_speculative.py), forcing is clean, a wrong target
is caught, and the run's counters say that nothing was drafted."""
from dataclasses import replace

import pytest

from specpilot.deploy import build_deployment
from specpilot.ir import CaptureGraphs, SetDrafter, SetTopology, Tree, apply, stock_program
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.decoder import ModelPair, force_program, timed_program
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_program import (decoder_for, force_graphed, graph_refusal,
                                               release_decoders, run_graphed)
from specpilot.runtime.mechanisms import run_program_decode

from mechanism_setup import (MAX_NEW, SEEDS, assert_caught, assert_clean, noisy_copy,
                             one_thread, pair_setup)  # noqa: F401 (autouse fixture)


def no_speculation(s, batch, capture=False, topology=None):
    stock = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    if topology is not None:
        stock = apply(stock, SetTopology(topology))
    if capture:
        stock = apply(stock, CaptureGraphs(True))
    program = apply(stock, SetDrafter("none"))
    return replace(program, batch=replace(program.batch, max_batch_size=batch))


def assert_ar_counters(r, reference, batch):
    """One target forward per generated token of each batch's longest request, no drafter."""
    tokens = reference.tokens
    longest = [max(len(t) for t in tokens[i:i + batch]) for i in range(0, len(tokens), batch)]
    assert r.drafter_forwards == 0
    assert r.accepted_lengths == [[0] * (len(t) - 1) for t in tokens]
    assert r.mean_accepted == 1.0          # tokens per target forward: the bonus token alone
    assert r.stats == {"speculation_off": len(longest)}
    return longest


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("batch", [1, 3])
def test_eager_decode_is_greedy_ar(seed, batch):
    s = pair_setup(seed)
    program = no_speculation(s, batch, topology=Tree((2, 2)))    # the kept topology is unused
    # no drafter model is given: none is needed
    r = run_program_decode(program, s["target"], None, s["prompts"], MAX_NEW, s["eos"])
    assert r.tokens == s["reference"].tokens
    longest = assert_ar_counters(r, s["reference"], batch)
    assert r.target_forwards == sum(longest)


@pytest.mark.parametrize("batch", [1, 3])
def test_graphed_decode_is_the_strong_ar_decoder(batch):
    s = pair_setup(11)
    program = no_speculation(s, batch, capture=True)
    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    release_decoders()
    decoder = decoder_for(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert type(decoder) is GraphedChainDecoder
    assert decoder.k == 0 and decoder.drafter is None and decoder.batch == batch
    r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert r.tokens == s["reference"].tokens
    assert_ar_counters(r, s["reference"], batch)
    assert_clean(force_graphed(program, pair, s["prompts"], s["reference"], capture=False),
                 s["reference"])
    release_decoders()


@pytest.mark.parametrize("seed", SEEDS)
def test_forcing_is_clean_without_a_drafter(seed):
    s = pair_setup(seed)
    pair = ModelPair(s["target"], None, None, s["eos"])
    program = no_speculation(s, 3)
    assert_clean(force_program(program, pair, s["prompts"], s["reference"]), s["reference"])
    run = timed_program(program, pair, s["prompts"], MAX_NEW)
    assert run.tokens == s["reference"].tokens and run.mean_accepted == 1.0
    # a Program that speculates still needs its drafter
    with pytest.raises(SpecPilotError, match="give a drafter"):
        timed_program(apply(program, SetDrafter("model")), pair, s["prompts"], MAX_NEW)


def test_capture_on_a_cpu_runs_eagerly():
    s = pair_setup(11)
    program = no_speculation(s, 2, capture=True)
    # CUDA graphs need a GPU; the Program's eager AR path runs instead
    assert graph_refusal(program, "cpu") == "CUDA graphs need a CUDA GPU"
    pair = ModelPair(s["target"], None, None, s["eos"])
    assert timed_program(program, pair, s["prompts"], MAX_NEW).tokens == s["reference"].tokens


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_a_wrong_target_is_caught_by_forcing(graphed):
    s = pair_setup(11)
    wrong = noisy_copy(s["target_dir"], 0.3, seed=5)     # not the model the reference decoded
    pair = ModelPair(wrong, None, None, s["eos"])
    program = no_speculation(s, 2, capture=graphed)
    if graphed:
        release_decoders()
        report = force_graphed(program, pair, s["prompts"], s["reference"], capture=False)
        release_decoders()
    else:
        report = force_program(program, pair, s["prompts"], s["reference"])
    assert_caught(report, s["reference"])


@pytest.mark.parametrize("capture", [False, True])
def test_greedy_ar_with_refill_runs_the_refill_loop(capture):
    from specpilot.ir import SetRefill
    from specpilot.runtime.graphed_refill import GraphedRefillDecoder
    from specpilot.runtime.mechanisms import force_program_decode

    s = pair_setup(4)
    program = apply(no_speculation(s, 2, capture=capture), SetRefill("continuous"))
    reference = s["reference"]
    if capture:             # the graphed Program: the refill decoder with chains of 0
        pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
        release_decoders()
        decoder = decoder_for(program, pair, s["prompts"], MAX_NEW, capture=False)
        assert type(decoder) is GraphedRefillDecoder
        assert decoder.k == 0 and decoder.drafter is None
        r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
        report = force_graphed(program, pair, s["prompts"], reference, capture=False)
        release_decoders()
    else:                   # eagerly, the same refill loop with its rounds run eagerly
        r = run_program_decode(program, s["target"], None, s["prompts"], MAX_NEW, s["eos"])
        report = force_program_decode(program, s["target"], None, s["prompts"], reference)
    assert r.tokens == reference.tokens
    assert r.stats == {"speculation_off": 1, "refills": len(s["prompts"]) - 2}
    assert r.drafter_forwards == 0 and r.mean_accepted == 1.0
    assert_clean(report, reference)
