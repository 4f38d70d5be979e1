"""Per-request adaptive draft length under a batch token budget: the policy by hand, its
dynamics with drafters of known quality, the budget, exactness against greedy AR, forcing, and
a varlen read bug (rows of different lengths read as if all were the longest) that is caught.
"""
import pytest

from specpilot.ir.topology import Chain
from specpilot.runtime import batch_layout
from specpilot.runtime.adaptive_draft import (AdaptiveChainProposer, desired_length, fit_budget,
                                              ridge_token_budget, update_ema)

from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import (SEEDS, ContraryDrafter, assert_caught, assert_clean, decode, force,
                             pair_setup)


def test_policy_by_hand():
    assert [desired_length(e, 4) for e in (0.0, 0.4, 1.0, 2.99, 3.0, 9.0)] == [1, 1, 2, 3, 4, 4]
    assert update_ema(4.0, 0) == 2.0 and update_ema(2.0, 3) == 2.5
    # 13 tokens over a budget of 9: shorten the longest, the later request first on a tie.
    assert fit_budget([4, 4, 2], 9) == [2, 2, 2]
    assert fit_budget([4, 1, 3], 7) == [2, 1, 1]
    assert fit_budget([3, 0, 1], 3) == [0, 0, 0]        # only the roots fit
    assert fit_budget([1, 2], 10) == [1, 2]


def test_ridge_budget_is_where_compute_time_overtakes_memory_time():
    # An 8B bf16 model on an H200-like GPU: 989 TFLOP/s dense, 4.8 TB/s.
    peak, bandwidth, weights, per_token = 989e12, 4.8e12, 16e9, 16e9
    t = ridge_token_budget(peak, bandwidth, weights, per_token)
    assert t == 206                                     # = 989 / 4.8, by hand
    assert t * per_token / peak <= weights / bandwidth < (t + 1) * per_token / peak
    # Reading the batch's KV cache as well moves the ridge out.
    kv = 4e9
    assert ridge_token_budget(peak, bandwidth, weights, per_token, kv) == int(989 / 4.8 * 1.25)
    assert ridge_token_budget(1.0, 1e9, 1.0, 1.0, batch_size=8) == 8


def lengths_after_rejections(k, steps):
    """Chain lengths of a request whose drafts are never accepted (the policy by hand)."""
    out, ema = [], None
    for _ in range(steps):
        n = desired_length(k if ema is None else ema, k)
        out.append(n)
        ema = update_ema(k if ema is None else ema, 0)
    return out


def test_lengths_follow_acceptance():
    s = pair_setup(SEEDS[0])
    k = 4
    # A drafter that is always right keeps the full chain and accepts it all.
    right = decode(s, AdaptiveChainProposer(Chain(k), 100), 3, drafter=s["target"])
    assert right.tokens == s["reference"].tokens
    assert all(n == k for a in right.accepted_lengths for n in a)
    # A drafter that is always wrong is cut back to one draft per step.
    wrong = decode(s, AdaptiveChainProposer(Chain(k), 100), 3,
                   drafter=ContraryDrafter(s["target"]))
    assert wrong.tokens == s["reference"].tokens
    expected = sum(sum(lengths_after_rejections(k, len(a))) for a in wrong.accepted_lengths)
    assert wrong.stats["drafted_nodes"] == expected
    assert wrong.stats["drafted_nodes"] < k * sum(len(a) for a in wrong.accepted_lengths) / 2


@pytest.mark.parametrize("layout", ["padded", "ragged"])
@pytest.mark.parametrize("batch,budget", [(1, 1), (1, 3), (3, 3), (3, 8), (4, 40)])
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_ar_within_budget(seed, batch, budget, layout):
    s = pair_setup(seed)
    result = decode(s, AdaptiveChainProposer(Chain(5), budget), batch, layout=layout)
    assert result.tokens == s["reference"].tokens
    assert result.stats["max_step_tokens"] <= budget
    if budget == 1:   # room for the root only: plain decoding, one token per step
        assert result.stats["drafted_nodes"] == 0 and result.mean_accepted == 1.0
    else:             # drafts are made (when fewer requests are left, even at budget == batch)
        assert result.stats["drafted_nodes"] > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_forcing_is_clean(seed):
    s = pair_setup(seed)
    assert_clean(force(s, AdaptiveChainProposer(Chain(5), 9), 3), s["reference"])


def test_rows_read_at_the_longest_length_is_caught(monkeypatch):
    # Requests draft different lengths; reading every padded row as if its tokens ended where
    # the longest row's do picks up pad logits.
    def at_the_end(f, width):
        k = len(f) - f.logits_from
        return list(range(width - k, width))

    s = pair_setup(SEEDS[0])
    monkeypatch.setattr(batch_layout, "logit_reads", at_the_end)
    assert_caught(force(s, AdaptiveChainProposer(Chain(5), 9), 3, layout="padded"),
                  s["reference"])
