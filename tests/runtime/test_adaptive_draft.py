"""Per-request adaptive draft length under a batch token budget: the length rule by hand and
against a float64 statement of it, its dynamics with drafters of known quality (perfect, always
wrong, wrong then right), the budget, exactness against greedy AR, forcing, and a varlen read
bug (rows of different lengths read as if all were the longest) that is caught.
"""
import random

import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain
from specpilot.runtime import batch_layout
from specpilot.runtime.adaptive_draft import (AcceptanceEstimate, AdaptiveChainProposer,
                                              best_lengths, fit_budget, ridge_token_budget,
                                              update_acceptance)
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.step_loop import decode_with_mechanisms

from adaptive_reference import (WrongBefore, expected_tokens, reference_length,
                                reference_lengths, rounds_from)
from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import (SEEDS, ContraryDrafter, assert_caught, assert_clean, decode, force,
                             pair_setup)


def best(alpha, cap, cost=0.25):
    return int(best_lengths(torch.tensor(alpha, dtype=torch.float64), cap, cost))


def test_length_choice_by_hand():
    # E(L) / (1 + L/4) for L = 1..4, by hand:
    # alpha 0.5: 1.5/1.25 = 1.2, 1.75/1.5 = 1.167, 1.875/1.75 = 1.071, 1.9375/2 = 0.969 -> 1
    assert best(0.5, 4) == 1
    # alpha 0.8: 1.8/1.25 = 1.44, 2.44/1.5 = 1.627, 2.952/1.75 = 1.687, 3.3616/2 = 1.681 -> 3
    assert best(0.8, 4) == 3 and best(0.8, 2) == 2
    # alpha 0.9: ..., 3.439/1.75 = 1.965, 4.0951/2 = 2.048 -> 4
    assert best(0.9, 4) == 4
    # alpha 0: every draft is wasted, the shortest chain is cheapest.
    assert best(0.0, 4) == 1 and best(0.0, 1) == 1
    # alpha 1: (L + 1) / (1 + L/4) grows with L, so the cap; free drafts (cost 0) likewise.
    assert [best(1.0, cap) for cap in range(1, 9)] == list(range(1, 9))
    assert best(0.3, 6, cost=0.0) == 6
    # Drafts as dear as a verification: alpha 0.8 gives 1.8/2, 2.44/3, ...: one draft.
    assert best(0.8, 4, cost=1.0) == 1


def test_length_choice_matches_the_closed_form_in_float64():
    rng = random.Random(5)
    checked = 0
    for _ in range(400):
        alpha, cap, cost = rng.random(), rng.randint(1, 8), rng.choice([0.05, 0.25, 0.5])
        values = sorted(expected_tokens(alpha, n) / (1 + cost * n) for n in range(1, cap + 1))
        if cap > 1 and values[-1] - values[-2] < 1e-9:
            continue   # a near-tie: either answer is right
        assert best(alpha, cap, cost) == reference_length(alpha, cap, cost), (alpha, cap, cost)
        checked += 1
    assert checked > 350
    # Batched and in float32 (as on the device): same answers away from ties.
    alphas = [0.05, 0.5, 0.62, 0.75, 0.85, 0.97, 1.0]
    got = best_lengths(torch.tensor(alphas, dtype=torch.float32), 5).tolist()
    assert got == [reference_length(a, 5) for a in alphas]


def test_estimate_by_hand():
    e = AcceptanceEstimate.fresh(4)
    assert (e.accepted, e.rejected, e.alpha) == (4.0, 0.0, 1.0)
    e = e.after(2, 4)                     # a rejection: a = (2 + 4) / 2, r = (1 + 0) / 2
    assert (e.accepted, e.rejected) == (3.0, 0.5) and e.alpha == pytest.approx(6 / 7)
    e = e.after(4, 4)                     # all accepted: a = (4 + 3) / 2, r = (0 + 0.5) / 2
    assert (e.accepted, e.rejected) == (3.5, 0.25) and e.alpha == pytest.approx(14 / 15)
    # The tensor form (the graphed decoder's) gives the same numbers, row by row.
    a, r = update_acceptance(torch.tensor([4.0, 3.0]), torch.tensor([0.0, 0.5]),
                             torch.tensor([2, 4]), torch.tensor([4, 4]))
    assert a.tolist() == [3.0, 3.5] and r.tolist() == [0.5, 0.25]


def policy_lengths(cap, accepted_fraction, rounds, estimate=None):
    """The lengths the proposer's rule drafts over `rounds` rounds (a request on its own)."""
    proposer = AdaptiveChainProposer(Chain(cap), 100)

    class Request:
        ema = estimate

    out = []
    for _ in range(rounds):
        n = proposer.lengths([Request])[0]
        out.append(n)
        Request.ema = proposer.estimate(Request).after(accepted_fraction(n), n)
    return out


def test_a_perfect_drafter_reaches_the_cap_within_a_few_rounds():
    for cap in (1, 4, 8):
        assert policy_lengths(cap, lambda n: n, 6) == [cap] * 6      # from the prior: at once
    # From the worst state (every recent round rejected, alpha near 0): 1, 1, 3, then 4.
    bad = AcceptanceEstimate(1e-6, 1.0)
    got = policy_lengths(4, lambda n: n, 8, bad)
    assert got == reference_lengths(4, lambda n: n, 8, start=(1e-6, 1.0))
    assert got[3:] == [4] * 5
    got = policy_lengths(8, lambda n: n, 8, bad)
    assert got == reference_lengths(8, lambda n: n, 8, start=(1e-6, 1.0))
    assert got[4:] == [8] * 4


def test_a_bad_drafter_shrinks_to_one_draft():
    got = policy_lengths(4, lambda n: 0, 8)
    assert got == reference_lengths(4, lambda n: 0, 8) and got[3:] == [1] * 5
    # Half the first draft then nothing: alpha settles near 1/3, one draft.
    got = policy_lengths(6, lambda n: 1 if n > 1 else 0, 10)
    assert got == reference_lengths(6, lambda n: 1 if n > 1 else 0, 10) and got[-1] == 1


def test_draft_cost_must_be_sane():
    with pytest.raises(SpecPilotError, match="relative cost"):
        AdaptiveChainProposer(Chain(4), 10, draft_cost=-0.5)
    with pytest.raises(SpecPilotError, match="relative cost"):
        AdaptiveChainProposer(Chain(4), 10, draft_cost=float("nan"))


def test_budget_by_hand():
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
    expected = sum(sum(reference_lengths(k, lambda n: 0, len(a)))
                   for a in wrong.accepted_lengths)
    assert wrong.stats["drafted_nodes"] == expected
    assert wrong.stats["drafted_nodes"] < k * sum(len(a) for a in wrong.accepted_lengths) / 2


def test_a_drafter_that_turns_right_gets_the_full_chain_back():
    s = pair_setup(SEEDS[0])
    k, new, switch = 4, 40, 20
    reference = generate_ar(s["target"], s["prompts"], new)
    drafter = WrongBefore(s["target"], switch)
    r = decode_with_mechanisms(s["target"], drafter, s["prompts"], new,
                               AdaptiveChainProposer(Chain(k), 100), max_batch_size=4)
    assert r.tokens == reference.tokens
    for prompt, accepted in zip(s["prompts"], r.accepted_lengths):
        assert 0 in accepted                 # drafts were rejected before the switch ...
        # ... and a request whose root is past it drafts (and accepts) the full chain within
        # three rounds (lengths 1, 1, 3, 4 from the worst state), for good.
        right = rounds_from(accepted, len(prompt) - 1, switch)
        assert len(accepted) > right + 4
        assert accepted[right + 3:] == [k] * (len(accepted) - right - 3)


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
