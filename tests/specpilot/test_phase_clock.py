"""specpilot/bench/phase_clock.py: each split fires once, in order (a clock that ticks once
per reading gives every phase one tick), the decoder computes what it computes unsplit, and
every wrapper is removed afterwards (padded and refill decoders, whose loops are wrapped in
different places)."""
import itertools

import pytest
import torch

import specpilot.bench.phase_clock as phase_clock
from specpilot.bench.phase_clock import PHASES, PhaseClock, one_call
from specpilot.bench.shapes import random_pair
from specpilot.runtime import graphed_chain
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_loop import replay_until_done
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()
pytestmark = pytest.mark.usefixtures("cpu_only")     # off a GPU on any host


@pytest.mark.parametrize("cls", [GraphedChainDecoder, GraphedRefillDecoder])
def test_a_split_call_is_the_call_and_leaves_no_wrapper(cls, monkeypatch):
    target, drafter, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    prompts = torch.randint(0, target.config.vocab_size, (3, 5),
                            generator=torch.Generator().manual_seed(4)).tolist()
    whole, split_decoder = (cls(target, drafter, 3, 40, 2, capture=False, adaptive=True)
                            for _ in range(2))
    want = whole.generate(prompts, 12)
    own, policy_own = dict(vars(split_decoder)), dict(vars(split_decoder.policy))
    restore = PhaseClock().install(split_decoder)
    try:
        got = split_decoder.generate(prompts, 12)        # the wrapped call: the same run
    finally:
        restore()
    assert (got.tokens, got.accepted_lengths, got.stats, got.drafter_forwards) == (
        want.tokens, want.accepted_lengths, want.stats, want.drafter_forwards)
    assert vars(split_decoder) == own and vars(split_decoder.policy) == policy_own
    assert graphed_chain.replay_until_done is replay_until_done
    ticks = itertools.count()
    monkeypatch.setattr(phase_clock.time, "perf_counter", lambda: float(next(ticks)))
    seconds, phases = one_call(split_decoder, prompts, 12, PhaseClock())
    assert seconds == len(PHASES) and phases == {p: 1.0 for p in PHASES}
    assert vars(split_decoder) == own and vars(split_decoder.policy) == policy_own


def test_a_decoder_without_a_policy_has_no_start_decision():
    target, _, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    decoder = GraphedChainDecoder(target, None, 2, 30, 0, capture=False)
    _, phases = one_call(decoder, [[1, 2, 3], [4, 5]], 6, PhaseClock())
    assert phases["start decision"] == 0
