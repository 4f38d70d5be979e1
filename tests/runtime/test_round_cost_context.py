"""An adaptive decoder times its round costs with every row at the call's typical context (the
mean prompt length plus half the longest limit, held to where two rounds fit), every row
inactive, and the call then decodes as greedy AR does: padded and with refill, generate and
force. The timing is replaced by a recorder (off a GPU nothing is captured to time)."""
import pytest

from specpilot.runtime import graphed_chain
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

from mechanism_setup import MAX_NEW, SEEDS, one_thread, pair_setup  # noqa: F401

COSTS = [1.0, 1.3, 1.5]


def _recording(monkeypatch, dec):
    """Make `dec` time its costs at its next call, into a list of (positions, any active)."""
    seen = []

    def measure(replays, reset, device):
        assert sorted(replays) == [0, 1, 2]
        reset()
        seen.append((dec.length.tolist(), bool(dec.active.any())))
        return COSTS

    monkeypatch.setattr(graphed_chain, "measure_round_costs", measure)
    dec._measure_costs = True
    return seen


@pytest.mark.parametrize("cls, batch", [(GraphedChainDecoder, 4), (GraphedRefillDecoder, 2)])
def test_costs_are_timed_at_the_calls_typical_context(monkeypatch, cls, batch):
    s = pair_setup(SEEDS[0])
    prompts, limits = s["prompts"][:4], [MAX_NEW, 3, MAX_NEW - 1, 2]
    capacity = max(len(p) for p in prompts) + MAX_NEW + 8
    dec = cls(s["target"], s["drafter"], batch, capacity, 2, capture=False, adaptive=True,
              round_costs=[1.0, 9.0, 9.0])
    seen = _recording(monkeypatch, dec)
    out = dec.generate(prompts, limits)
    # prompts of 5, 11, 2 and 8 tokens (PROMPT_LENGTHS): 26 // 4 + 16 // 2
    assert seen == [([14] * batch, False)]
    assert dec.policy.round_cost_host.tolist() == pytest.approx(COSTS)
    expected = generate_ar(s["target"], prompts, MAX_NEW).tokens
    assert out.tokens == [e[:n] for e, n in zip(expected, limits)]
    dec.generate(prompts, limits)               # timed once: the next call keeps the costs
    assert len(seen) == 1


def test_a_context_past_the_cache_is_held_to_where_two_rounds_fit(monkeypatch):
    s = pair_setup(SEEDS[1])
    prompts = s["prompts"][:2]
    reference = generate_ar(s["target"], prompts, MAX_NEW).tokens
    capacity = max(len(p) for p in prompts) + MAX_NEW + 5       # k = 2: a span of 2
    dec = GraphedChainDecoder(s["target"], s["drafter"], 2, capacity, 2, capture=False,
                              adaptive=True)
    seen = _recording(monkeypatch, dec)
    # forcing times the costs too (it comes first in a compile); half the limit is past the
    # last context two rounds of 3 slots can follow
    assert capacity == 32 and dec.timing_context(prompts, [4 * capacity]) == 26
    proposals = dec.force(prompts, reference)
    assert seen == [([16] * 2, False)]              # prompts of 5 and 11: 16 // 2 + 16 // 2
    assert proposals == reference
    assert dec.generate(prompts, MAX_NEW).tokens == reference     # and it decodes after
