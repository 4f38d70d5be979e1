"""The bucketed static prefill (runtime/graphed_prefill.py), run eagerly on CPU against the eager
padded prefill (runtime/steps.append_step) in float32; capture is covered by tests/gpu."""
import torch

from specpilot.runtime.graphed_prefill import BUCKET, StaticPrefill
from specpilot.runtime.steps import append_step

from mechanism_setup import fill_with_noise, pair_setup


def test_bucketed_prefill_gives_the_eager_prefills_logits_and_cache():
    s = pair_setup(11)
    target, drafter = s["target"], s["drafter"]
    rows = [list(p) for p in s["prompts"]]          # lengths 5, 11, 2, 8: one bucket of 64
    static_caches = (target.new_cache(4, 96), drafter.new_cache(4, 96))
    prefill = StaticPrefill([(target, static_caches[0]), (drafter, static_caches[1])], 4, 96,
                            capture=False)
    assert prefill.width_for(11) == BUCKET and prefill.width_for(65) == 96   # capped
    got = prefill.run(rows)
    eager_caches = (target.new_cache(4, 96), drafter.new_cache(4, 96))
    zeros = torch.zeros(4, dtype=torch.int64)
    want = append_step(target, eager_caches[0], zeros, rows)
    append_step(drafter, eager_caches[1], zeros, rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for mine, theirs in zip(static_caches, eager_caches):
        for layer in range(len(mine.k)):
            for r, row in enumerate(rows):   # every prompt position, in both models' caches
                torch.testing.assert_close(mine.k[layer][r, :len(row)],
                                           theirs.k[layer][r, :len(row)], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(mine.v[layer][r, :len(row)],
                                           theirs.v[layer][r, :len(row)], rtol=1e-5, atol=1e-5)
    # A second call with other prompts reuses the bucket's buffers without leftovers.
    again = prefill.run([row[:2] for row in rows])
    want = append_step(target, target.new_cache(4, 96), zeros, [row[:2] for row in rows])
    torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-5)


def test_a_first_model_only_prefill_fills_the_target_and_leaves_the_drafter_cache_alone():
    s = pair_setup(12)
    target, drafter = s["target"], s["drafter"]
    rows = [list(p) for p in s["prompts"]]
    tcache, dcache = target.new_cache(4, 96), drafter.new_cache(4, 96)
    untouched = fill_with_noise(dcache)
    prefill = StaticPrefill([(target, tcache), (drafter, dcache)], 4, 96, capture=False)
    got = prefill.run(rows, first_only=True)
    eager = target.new_cache(4, 96)
    want = append_step(target, eager, torch.zeros(4, dtype=torch.int64), rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for r, row in enumerate(rows):
        torch.testing.assert_close(tcache.k[0][r, :len(row)], eager.k[0][r, :len(row)],
                                   rtol=1e-5, atol=1e-5)
    assert all(untouched())
    # Both models again, from the same bucket width: the drafter's cache is written now.
    prefill.run(rows)
    assert not any(untouched())


def test_a_decoder_without_a_drafter_prefills_with_the_graph_it_prepared():
    """A plain decoder's prefill already is target-only: `generate` must use the bucket that
    `prepare_prefill` built (captured outside timed runs), not build a second one."""
    from specpilot.runtime.graphed_chain import GraphedChainDecoder

    s = pair_setup(13)
    target = s["target"]
    decoder = GraphedChainDecoder(target, None, 4, 48, 0, s["eos"], capture=False)
    decoder._prefiller = StaticPrefill([(target, decoder.tcache)], 4, 48, capture=False)
    decoder.prepare_prefill(s["prompts"])
    prepared = set(decoder._prefiller._buckets)
    out = decoder.generate(s["prompts"], 6)
    assert set(decoder._prefiller._buckets) == prepared
    assert out.drafter_forwards == 0
    assert out.tokens == [t[:6] for t in s["reference"].tokens]
