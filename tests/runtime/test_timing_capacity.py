"""`timing_capacity`: a cache sized for timing rounds holds as many rounds that each accept their
whole depth as the decoder itself allows in it, so no timed round runs at clamped positions; it
grows with a tree's span once, not once a round, and is rounded up as a decode's capacity is
(hand-checked cases)."""
import pytest

from specpilot.ir import Chain, DynamicTree, SparseTree, Tree
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.errors import CapacityError
from specpilot.runtime.graphed_program import graphed_decoder, round_span, timing_capacity

from mechanism_setup import SEEDS, one_thread, pair_setup  # noqa: F401


def test_sizes_by_hand():
    # 10 rounds of chain(4): 5 tokens each at most, then its span and one slot (155), rounded
    # up to a multiple of 8 as a decode's cache is
    assert timing_capacity(100, Chain(4), 10) == 160
    assert timing_capacity(99, Chain(4), 10) == 160 and timing_capacity(106, Chain(4), 10) == 168
    # tree([4, 3, 2, 1]): depth 4, 64 nodes; one span, not one a round (265)
    assert timing_capacity(100, Tree((4, 3, 2, 1)), 20) == 272
    # tree([64]): two rounds' spans (130) are more than ten two-token rounds and a span (85)
    assert timing_capacity(0, Tree((64,)), 10) == 136


TOPOLOGIES = [Chain(3), Tree((2, 2, 1)), SparseTree(((0,), (1,), (0, 0), (0, 0, 0))),
              DynamicTree(budget=4, depth=3, width=2)]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_the_decoder_takes_that_cache_for_as_many_whole_rounds(topology):
    """The decoder's own capacity rule, with rounds that accept everything (the target drafts
    for itself): `rounds` whole rounds after the longest prompt fit the timing capacity, and
    output stays greedy AR's. One token more than that is refused."""
    s = pair_setup(SEEDS[0])
    target, prompts, rounds = s["target"], s["prompts"][:2], 4
    context = max(len(p) for p in prompts)
    capacity = timing_capacity(context, topology, rounds)
    new = rounds * (topology.depth + 1)
    dec = graphed_decoder(target, target, 2, capacity, topology, capture=False)
    assert dec.generate(prompts, new).tokens == generate_ar(target, prompts, new).tokens
    needed = context + new + round_span(topology) + 1
    assert needed <= capacity < needed + 8          # nothing more than the rounding
    with pytest.raises(CapacityError):
        dec.generate(prompts, new + capacity - needed + 1)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_timed_rounds_stay_inside_the_cache(topology):
    """`rounds` calls of `timing_round` (what measure_round makes) on that cache: each moves the
    rows by at most depth + 1, and the last still has its span of free slots."""
    s = pair_setup(SEEDS[1])
    target, context, rounds = s["target"], 9, 5
    capacity = timing_capacity(context, topology, rounds)
    dec = graphed_decoder(target, s["drafter"], 2, capacity, topology, capture=False)
    replay = dec.timing_round(context)
    before = dec.length.clone()
    for _ in range(rounds):
        replay()
        moved = dec.length - before
        assert ((moved >= 1) & (moved <= topology.depth + 1)).all()
        before = dec.length.clone()
    assert int(dec.length.max()) + round_span(topology) + 1 <= capacity


def test_a_timing_context_keeps_the_cache_within_the_models_positions():
    from types import SimpleNamespace

    from specpilot.bench.step_costs import round_timing_capacity, round_timing_context

    for limit in (300, 301, 307):
        model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=limit))
        for topology in (Chain(1), Tree((4, 4)), DynamicTree(budget=4, depth=3, width=2)):
            assert round_timing_context(model, 100, topology, 2, 5) == 100     # it fits
            at = round_timing_context(model, 10 ** 4, topology, 2, 5)
            assert round_timing_capacity(at, topology, 2, 5) <= limit
            assert round_timing_capacity(at + 8, topology, 2, 5) > limit     # no more held back
        # 2 warm-up, 5 timed and 3 more rounds of chain(1): 2 tokens each, its slot and one
        # (22, rounded to 24) after the context, within the limit rounded down to 8 slots
        assert round_timing_context(model, 10 ** 4, Chain(1), 2, 5) == limit // 8 * 8 - 24
