"""When the refill loop tops up the newcomers held prefilled ahead (`topup`,
SPECPILOT_REFILL_TOPUP): right after a read-back's admissions, or once the replay after them is
queued. Either way every request's output is greedy AR's, forcing is clean, and each newcomer is
prefilled once; the loop's order of replays, admissions and top-ups is the one asked for."""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_refill import TOPUPS, GraphedRefillDecoder

from mechanism_setup import MAX_NEW, assert_clean, one_thread, pair_setup  # noqa: F401
from refill_setup import TopUpLog, count_prefills, mixed_requests


@pytest.mark.parametrize("k,batch,adaptive", [(0, 2, False), (3, 3, False), (4, 2, True)])
def test_either_top_up_gives_greedy_ar_with_the_same_rounds(k, batch, adaptive):
    s, prompts, reference = mixed_requests(4)
    drafter = s["drafter"] if k else None
    results = {}
    for topup in TOPUPS:
        decoder = GraphedRefillDecoder(s["target"], drafter, batch, 48, k, s["eos"],
                                       capture=False, adaptive=adaptive, topup=topup)
        results[topup] = decoder.generate(prompts, MAX_NEW)
        assert results[topup].tokens == reference.tokens
        report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                      default_tolerance(torch.float32))
        assert_clean(report, reference)
    first, later = results["admitted"], results["queued"]
    assert later.stats == first.stats and later.accepted_lengths == first.accepted_lengths


@pytest.mark.parametrize("topup", TOPUPS)
def test_the_top_up_comes_where_it_is_asked_for(topup):
    """`admitted`: a read-back's admissions are followed by the top-up at once. `queued`: by
    the next replay, and the top-up right after it. Each newcomer is prefilled once either way,
    and all but those of crowded gaps are admitted from staging."""
    s, prompts, reference = mixed_requests(11)
    decoder = TopUpLog(s["target"], s["drafter"], 2, 48, 3, s["eos"], capture=False,
                       topup=topup, prefill_placement="ahead", ahead_depth=3)
    decoder.log = []
    prefilled, staged = count_prefills(decoder._row_prefill)
    assert decoder.generate(prompts, MAX_NEW).tokens == reference.tokens
    log = ["replay" if isinstance(e, int) else e for e in decoder.log]   # a replay's rounds
    assert sorted(prefilled) == sorted(tuple(p) for p in prompts[2:])
    assert all(staged)          # two slots, three held: every newcomer was waiting in staging
    # The call's first top-up fills staging before the first replay (`admitted`) or once it
    # is queued (`queued`); the others follow read-backs that found finished rows (with the
    # queue empty there is nothing left to hold).
    assert log[:2] == (["top-up", "replay"] if topup == "admitted" else ["replay", "top-up"])
    assert log.count("admit") == len(prompts) - 2
    tops = ("top-up", "nothing to hold")
    after_admissions = {log[i + 1] for i in range(1, len(log) - 1)
                        if log[i] == "admit" and log[i + 1] != "admit"}
    before_top_ups = {log[i - 1] for i in range(1, len(log)) if log[i] == "top-up"}
    if topup == "admitted":
        assert after_admissions <= set(tops) and before_top_ups == {"admit"}
    else:
        assert after_admissions == {"replay"}
        assert {log[i - 1] for i in range(1, len(log)) if log[i] in tops} == {"replay"}
    # Every read-back that admitted is topped up after, once.
    gaps = sum(1 for i in range(1, len(log)) if log[i] != "admit" and log[i - 1] == "admit")
    assert log.count("top-up") - 1 <= gaps <= log.count("top-up") + log.count("nothing to hold")


def test_the_top_up_is_checked(monkeypatch):
    s = pair_setup(11)
    monkeypatch.setenv("SPECPILOT_REFILL_TOPUP", "admitted")
    assert GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False).topup == "admitted"
    # given to the constructor, it overrides the environment's
    assert GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False,
                                topup="queued").topup == "queued"
    monkeypatch.setenv("SPECPILOT_REFILL_TOPUP", "later")
    with pytest.raises(SpecPilotError, match="SPECPILOT_REFILL_TOPUP='later'"):
        GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False)
    monkeypatch.delenv("SPECPILOT_REFILL_TOPUP")
    # the default: once the next replay is queued (raced on an H200, BENCHMARKS.md)
    assert GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False).topup == "queued"
    with pytest.raises(SpecPilotError, match="top-up 'soon': expected one of admitted, queued"):
        GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False, topup="soon")
