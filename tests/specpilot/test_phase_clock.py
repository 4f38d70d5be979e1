"""specpilot/bench/phase_clock.py: a split call's phases add up to the call, the decoder
computes what it computes unsplit, and every wrapper is removed afterwards (padded and refill
decoders, whose loops are wrapped in different places)."""
import pytest
import torch

from specpilot.bench.phase_clock import PHASES, PhaseClock, one_call
from specpilot.bench.shapes import random_pair
from specpilot.runtime import graphed_chain
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_loop import replay_until_done
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from bench_script import cpu_only  # noqa: F401
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()
pytestmark = pytest.mark.usefixtures("cpu_only")     # off a GPU on any host


@pytest.mark.parametrize("cls", [GraphedChainDecoder, GraphedRefillDecoder])
def test_a_split_call_is_the_call_and_leaves_no_wrapper(cls):
    target, drafter, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    prompts = torch.randint(0, target.config.vocab_size, (3, 5),
                            generator=torch.Generator().manual_seed(4)).tolist()
    decoder = cls(target, drafter, 3, 40, 2, capture=False, adaptive=True)
    before = decoder.generate(prompts, 12).tokens
    own, policy_own = dict(vars(decoder)), dict(vars(decoder.policy))
    clock = PhaseClock()
    restore = clock.install(decoder)
    try:
        split = decoder.generate(prompts, 12).tokens         # the wrapped call's own output
    finally:
        restore()
    assert split == before
    assert vars(decoder) == own and vars(decoder.policy) == policy_own
    assert graphed_chain.replay_until_done is replay_until_done
    seconds, phases = one_call(decoder, prompts, 12, PhaseClock())
    assert list(phases) == list(PHASES) and all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(seconds)
    assert vars(decoder) == own and vars(decoder.policy) == policy_own


def test_a_decoder_without_a_policy_has_no_start_decision():
    target, _, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    decoder = GraphedChainDecoder(target, None, 2, 30, 0, capture=False)
    _, phases = one_call(decoder, [[1, 2, 3], [4, 5]], 6, PhaseClock())
    assert phases["start decision"] == 0
