"""Continuous refill in the graphed runtime (runtime/graphed_refill.py), its rounds run eagerly
(capture=False) on CPU in float32: outputs equal greedy AR for more requests than slots,
finishing at different times; forcing is clean; and a refill that leaves a stale part of the
row behind is caught."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

from mechanism_setup import (MAX_NEW, ContraryDrafter, assert_clean, one_thread,  # noqa: F401
                             pair_setup)
from refill_setup import (NoTargetPrefill, ReplayLog, StaleLength, count_prefills,
                          mixed_requests)


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("k,batch", [(0, 3), (1, 2), (3, 3), (4, 2)])
def test_refilled_slots_give_greedy_ar_for_every_request(seed, k, batch):
    s, prompts, reference = mixed_requests(seed)
    lengths = [len(t) for t in reference.tokens]
    assert min(lengths) < MAX_NEW == max(lengths)       # requests end at different times
    drafter = s["drafter"] if k else None
    decoder = GraphedRefillDecoder(s["target"], drafter, batch, 48, k, s["eos"], capture=False)
    r = decoder.generate(prompts, MAX_NEW)
    assert r.tokens == reference.tokens
    assert r.stats["refills"] == len(prompts) - batch
    assert len(r.accepted_lengths) == len(prompts)
    # every request's rounds commit its tokens: one per round plus the accepted drafts, after
    # the prefill's first token (the last round may overshoot the limit or pass an EOS)
    for tokens, accepted in zip(r.tokens, r.accepted_lengths):
        assert all(0 <= a <= k for a in accepted)
        assert sum(a + 1 for a in accepted) >= len(tokens) - 1
        assert sum(a + 1 for a in accepted[:-1]) < len(tokens) - 1 or len(tokens) == 1
    # a second call on the same decoder starts clean
    assert decoder.generate(prompts[:4], MAX_NEW).tokens == reference.tokens[:4]


@pytest.mark.parametrize("placement,depth", [("ahead", 1), ("ahead", 3), ("beside", None)])
def test_newcomers_are_prefilled_ahead_of_their_rows_each_once(placement, depth):
    """Placed ahead, the decoder holds the queue's next `depth` newcomers prefilled before a
    row is free for them: every newcomer is prefilled once, and each admission only copies
    from staging, but for those admitted in the same gap as more than `depth` others; none is
    left held at the call's end (ahead is the default). Placed beside, each is prefilled at
    its admission. The output is greedy AR's either way."""
    s, prompts, reference = mixed_requests(11)
    decoder = GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, 3, s["eos"], capture=False,
                                   prefill_placement=placement, ahead_depth=depth)
    prefill = decoder._row_prefill
    assert prefill.depth == (depth or 0)
    prefilled, copied_only = count_prefills(prefill)
    assert decoder.generate(prompts, MAX_NEW).tokens == reference.tokens
    newcomers = [tuple(p) for p in prompts[2:]]
    assert sorted(prefilled) == sorted(newcomers)          # each newcomer once, none wasted
    if placement == "ahead":
        # two slots: at most two newcomers a gap, so three held cover every admission
        assert sum(copied_only) >= (len(newcomers) if depth >= 2 else len(newcomers) // 2)
        assert not prefill._held
    else:
        assert not any(copied_only)


@pytest.mark.parametrize("k", [0, 3])
def test_forcing_with_refill_is_clean(k):
    s, prompts, reference = mixed_requests(11)
    drafter = s["drafter"] if k else None
    decoder = GraphedRefillDecoder(s["target"], drafter, 2, 48, k, s["eos"], capture=False)
    report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert_clean(report, reference)


@pytest.mark.parametrize("lag", [2, 3])
@pytest.mark.parametrize("k,batch,adaptive", [(0, 2, False), (3, 3, False), (4, 2, True)])
def test_reading_finished_rows_back_later_still_gives_greedy_ar(k, batch, adaptive, lag):
    """With the read-back `lag` replays behind, a finished row runs that many rounds empty
    before its newcomer; every request's output is still greedy AR's, with per-request limits
    too, and forcing is clean."""
    s, prompts, reference = mixed_requests(4)
    drafter = s["drafter"] if k else None
    decoder = GraphedRefillDecoder(s["target"], drafter, batch, 48, k, s["eos"], capture=False,
                                   adaptive=adaptive, readback_lag=lag)
    assert decoder.lag == lag and decoder.host_active.shape[0] == lag + 2
    r = decoder.generate(prompts, MAX_NEW)
    assert r.tokens == reference.tokens
    assert r.stats["refills"] == len(prompts) - batch
    limits = [1 + (7 * i) % MAX_NEW for i in range(len(prompts))]
    assert decoder.generate(prompts, limits).tokens == [t[:m] for t, m in
                                                       zip(reference.tokens, limits)]
    report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert_clean(report, reference)


def test_the_readback_lag_is_checked(monkeypatch):
    s = pair_setup(11)
    monkeypatch.setenv("SPECPILOT_REFILL_LAG", "2")
    assert GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False).lag == 2
    # given to the constructor, the lag overrides the environment's
    assert GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False,
                                readback_lag=1).lag == 1
    for bad in ("0", "5", "two", "-1", "1.5", "\u0662"):
        monkeypatch.setenv("SPECPILOT_REFILL_LAG", bad)
        with pytest.raises(SpecPilotError, match="SPECPILOT_REFILL_LAG"):
            GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False)
    monkeypatch.delenv("SPECPILOT_REFILL_LAG")
    assert GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False).lag == 1
    for bad in (0, 5, True, 1.0):
        with pytest.raises(SpecPilotError, match="readback lag"):
            GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False, readback_lag=bad)


@pytest.mark.parametrize("lag", [1, 2])
@pytest.mark.parametrize("mutant", [StaleLength, NoTargetPrefill])
def test_a_refilled_slot_reading_a_stale_row_is_caught(mutant, lag):
    s, prompts, reference = mixed_requests(4)
    decoder = mutant(s["target"], s["drafter"], 2, 48, 3, s["eos"], capture=False,
                     readback_lag=lag)
    assert decoder.generate(prompts, MAX_NEW).tokens != reference.tokens


def test_what_refill_does_not_run_is_refused():
    s = pair_setup(11)
    with pytest.raises(SpecPilotError, match="margins"):
        GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, 3, capture=False,
                             record_margins=True)
    decoder = GraphedRefillDecoder(s["target"], None, 2, 48, 0, capture=False)
    with pytest.raises(SpecPilotError, match="no prompts"):
        decoder.generate([], 4)
    with pytest.raises(SpecPilotError, match="non-empty"):
        decoder.force([], [])


@pytest.mark.parametrize("k", [0, 3])
def test_each_request_may_bring_its_own_limit(k):
    s, prompts, reference = mixed_requests(4)
    limits = [1 + (7 * i) % MAX_NEW for i in range(len(prompts))]        # 1, 8, 15, 6, ...
    want = [t[:m] for t, m in zip(reference.tokens, limits)]
    drafter = s["drafter"] if k else None
    refill = GraphedRefillDecoder(s["target"], drafter, 2, 48, k, s["eos"], capture=False)
    assert refill.generate(prompts, limits).tokens == want
    padded = GraphedChainDecoder(s["target"], drafter, 4, 48, k, s["eos"], capture=False)
    assert padded.generate(prompts[:4], limits[:4]).tokens == want[:4]
    for bad in ([4] * (len(prompts) - 1), [0] + limits[1:], 0):
        with pytest.raises(SpecPilotError, match="max_new_tokens"):
            refill.generate(prompts, bad)
    with pytest.raises(SpecPilotError, match="prompts per call"):     # not max() of nothing
        padded.generate([], 4)


def _adaptive(s, drafter, batch, capacity=48):
    return GraphedRefillDecoder(s["target"], drafter, batch, capacity, 4, s["eos"],
                                capture=False, adaptive=True)


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("batch", [2, 3])
def test_adaptive_lengths_with_refill_give_greedy_ar_and_pass_forcing(seed, batch):
    s, prompts, reference = mixed_requests(seed)
    decoder = _adaptive(s, s["drafter"], batch)
    r = decoder.generate(prompts, MAX_NEW)
    assert r.tokens == reference.tokens
    assert r.stats["refills"] == len(prompts) - batch
    assert all(0 <= a <= 4 for row in r.accepted_lengths for a in row)
    report = compare_to_reference(decoder.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert_clean(report, reference)


class _FullLog(GraphedRefillDecoder):
    """Logs plain steps as speculative rounds are logged: an entry of 0 per row that ran."""

    def _log_round(self, accepted, plain=False):
        super()._log_round(accepted, plain=False)


@pytest.mark.parametrize("seed,costs", [(11, [1.0, 2.0, 2.6, 3.2, 3.8]),
                                        (4, [1.0, 1.6, 2.0, 2.4, 2.8])])
def test_plain_steps_read_back_as_a_full_log_reads_them(seed, costs):
    # Dear rounds: the batch turns speculation off after some requests accepted drafts. Plain
    # steps log only their count; read back, each request's rounds must be what a log of
    # every round says, in order.
    s, prompts, reference = mixed_requests(seed)
    runs = [cls(s["target"], s["drafter"], 2, 48, 4, s["eos"], capture=False, adaptive=True,
                round_costs=costs).generate(prompts, MAX_NEW)
            for cls in (GraphedRefillDecoder, _FullLog)]
    counted, logged = runs
    assert counted.tokens == logged.tokens == reference.tokens
    assert counted.stats == logged.stats and counted.stats["rounds_chain_0"] > 0
    assert counted.accepted_lengths == logged.accepted_lengths
    # Not a trivial case: a request accepted drafts and then ran plain steps (zeros after).
    assert any(0 < max(row) and row[-1] == 0 for row in counted.accepted_lengths)


def test_adaptive_refill_turns_a_useless_drafter_off_and_keeps_a_perfect_one():
    s, prompts, reference = mixed_requests(11)
    # Twice the usual tokens: the turn-off waits until an upper bound on the acceptance says
    # plain steps win, and with drafts this cheap (1 + 0.25 L) that takes about ten rejected
    # rounds, as long as the longest of the usual requests.
    longer = generate_ar(s["target"], prompts, 2 * MAX_NEW, eos_ids=s["eos"])
    useless = _adaptive(s, ContraryDrafter(s["target"]), 2, capacity=64).generate(
        prompts, 2 * MAX_NEW)
    assert useless.tokens == longer.tokens
    spec = sum(c for key, c in useless.stats.items() if key.startswith("rounds_chain_")
               and key != "rounds_chain_0")
    assert useless.stats.get("rounds_chain_0", 0) > 2 * spec        # off after a few rounds
    # Every round, speculative or plain, commits one token: each request ran one round per
    # token after its first, plain steps included (they log nothing but their count).
    assert useless.accepted_lengths == [[0] * (len(t) - 1) for t in useless.tokens]
    perfect = _adaptive(s, s["target"], 2).generate(prompts, MAX_NEW)
    assert perfect.tokens == reference.tokens
    # every round the longest chain, also those where refilled slots wait for the host
    assert [key for key in perfect.stats if key.startswith("rounds_chain_")] == ["rounds_chain_4"]
    assert perfect.mean_accepted == 5


@pytest.mark.parametrize("seed", [11, 4])
def test_the_result_says_what_the_length_rule_decided_by(seed):
    # An adaptive call reports the round prices its rule used and the rounds queued when the
    # batch went plain, so that a turn-off can be replayed on the CPU. Dear rounds and a
    # useless drafter: the batch speculates, then turns off. A newcomer admitted when both
    # slots have just emptied starts the batch anew (a restart), which may speculate and turn
    # off again.
    s, prompts, reference = mixed_requests(seed)
    costs = [1.0, 1.6, 2.0, 2.4, 2.8]
    decoder = GraphedRefillDecoder(s["target"], ContraryDrafter(s["target"]), 2, 64, 4,
                                   s["eos"], capture=False, adaptive=True, round_costs=costs)
    r = decoder.generate(prompts, 2 * MAX_NEW)
    assert r.tokens == generate_ar(s["target"], prompts, 2 * MAX_NEW, eos_ids=s["eos"]).tokens
    rule = r.length_rule
    assert rule["prices"] == costs
    speculative = sum(c for key, c in r.stats.items()
                      if key.startswith("rounds_chain_") and key != "rounds_chain_0")
    off = rule["off_from_round"]
    # Each turn-off follows the batch's start or a restart, in the order they ran.
    assert 1 <= len(off) <= rule["restarts"] + 1 and off == sorted(off)
    # Every round queued before the first turn-off was speculative; with no restart, every
    # speculative round was.
    assert 0 < off[0] <= speculative
    if rule["restarts"] == 0:
        assert off == [speculative]
    # A fixed-length decoder has no rule to report.
    fixed = GraphedRefillDecoder(s["target"], s["drafter"], 2, 64, 4, s["eos"], capture=False)
    assert fixed.generate(prompts, MAX_NEW).length_rule == {}


COSTS = [1.0, 1.3, 1.6, 1.9, 2.2]


def _padded_per_batch(s, prompts, batch):
    """Adaptive lengths on the padded decoder, `batch` prompts per call: tokens, per-request
    accepted drafts per round, rounds per length."""
    padded = GraphedChainDecoder(s["target"], s["drafter"], batch, 48, 4, s["eos"], capture=False,
                                 adaptive=True, round_costs=COSTS)
    tokens, accepted, rounds = [], [], {}
    for start in range(0, len(prompts), batch):
        r = padded.generate(prompts[start:start + batch], MAX_NEW)
        tokens += r.tokens
        accepted += r.accepted_lengths
        for key, c in r.stats.items():
            rounds[key] = rounds.get(key, 0) + c
    return tokens, accepted, rounds


@pytest.mark.parametrize("seed", [11, 4])
def test_one_slot_judges_every_request_as_a_padded_batch_of_one_would(seed):
    s, prompts, reference = mixed_requests(seed)
    refill = GraphedRefillDecoder(s["target"], s["drafter"], 1, 48, 4, s["eos"], capture=False,
                                  adaptive=True, round_costs=COSTS)
    r = refill.generate(prompts, MAX_NEW)
    tokens, accepted, rounds = _padded_per_batch(s, prompts, 1)
    assert r.tokens == tokens == reference.tokens
    assert r.accepted_lengths == accepted
    assert {k: c for k, c in r.stats.items() if k != "refills"} == rounds


def test_with_no_queue_the_batch_drains_as_a_padded_batch():
    s, prompts, reference = mixed_requests(4)
    refill = GraphedRefillDecoder(s["target"], s["drafter"], 4, 48, 4, s["eos"], capture=False,
                                  adaptive=True, round_costs=COSTS)
    r = refill.generate(prompts[:4], MAX_NEW)
    tokens, accepted, rounds = _padded_per_batch(s, prompts[:4], 4)
    assert r.tokens == tokens == reference.tokens[:4]
    assert r.accepted_lengths == accepted and r.stats["refills"] == 0


def test_with_no_queue_the_batch_remembers_the_workload_as_a_padded_batch():
    # A useless drafter. Calls with no queue are padded batches: the refill decoder learns the
    # workload from them and starts the third off, round for round as the padded decoder does.
    # A call with a queue neither reads that memory nor adds to it.
    s, prompts, reference = mixed_requests(4)
    useless = ContraryDrafter(s["target"])
    refill = GraphedRefillDecoder(s["target"], useless, 4, 48, 4, s["eos"], capture=False,
                                  adaptive=True)
    padded = GraphedChainDecoder(s["target"], useless, 4, 48, 4, s["eos"], capture=False,
                                 adaptive=True)
    drafter_forwards = []
    for call in range(3):
        r = refill.generate(prompts[:4], MAX_NEW)
        p = padded.generate(prompts[:4], MAX_NEW)
        assert r.tokens == p.tokens == reference.tokens[:4]
        assert r.accepted_lengths == p.accepted_lengths
        assert {k: c for k, c in r.stats.items() if k != "refills"} == p.stats
        assert r.drafter_forwards == p.drafter_forwards
        drafter_forwards.append(r.drafter_forwards)
    # The first two calls speculated (the memory learned from them); the third started off.
    assert drafter_forwards[0] > 0 and drafter_forwards[1] > 0
    assert list(p.stats) == ["rounds_chain_0"] and r.drafter_forwards == 0
    memory = refill.policy.memory
    remembered = (list(memory.counts), list(memory.first_judged), memory.started_off_in_a_row)
    queued = refill.generate(prompts, MAX_NEW)
    assert queued.tokens == reference.tokens and queued.stats["refills"] == len(prompts) - 4
    assert any(k.startswith("rounds_chain_") and k != "rounds_chain_0" for k in queued.stats)
    # the first wave's drafter prefill and one per refill
    speculative = sum(int(k.rsplit("_", 1)[1]) * c for k, c in queued.stats.items()
                      if k.startswith("rounds_chain_"))
    assert queued.drafter_forwards == 1 + queued.stats["refills"] + speculative
    assert (memory.counts, memory.first_judged, memory.started_off_in_a_row) == remembered


class _Admissions(GraphedRefillDecoder):
    """A refill decoder that records, per newcomer, whether it was admitted alone."""

    def _admit(self, row, prompt, limit, reference=None, alone=False):
        self.admissions.append((row, alone))
        super()._admit(row, prompt, limit, reference, alone)


def test_a_newcomer_is_alone_when_every_other_row_finished_in_the_same_replay():
    # Both rows finish in the same round (plain steps, equal limits, no EOS) and one request
    # is left: it goes into an empty batch, so it starts the batch anew, whichever row it takes.
    s, prompts, _ = mixed_requests(11)
    decoder = _Admissions(s["target"], None, 2, 48, 0, capture=False)
    decoder.admissions = []
    decoder.generate(prompts[:3], [3, 3, 4])
    assert decoder.admissions == [(0, True)]
    # With two left, the first newcomer starts the batch anew and the second joins it.
    decoder.admissions = []
    decoder.generate(prompts[:4], [3, 3, 4, 4])
    assert decoder.admissions == [(0, True), (1, False)]


def test_a_captured_refill_decoders_rounds_a_replay_default_and_its_setting(monkeypatch):
    from specpilot.ir.errors import SpecPilotError
    from specpilot.runtime.graphed_refill import REFILL_ROUNDS_PER_REPLAY, refill_rounds_per_replay

    monkeypatch.delenv("SPECPILOT_REFILL_ROUNDS", raising=False)
    assert refill_rounds_per_replay() == REFILL_ROUNDS_PER_REPLAY
    monkeypatch.setenv("SPECPILOT_REFILL_ROUNDS", "2")
    assert refill_rounds_per_replay() == 2
    for bad in ("0", "-1", "two", "1.5", "\u0662"):          # the last an Arabic-Indic 2
        monkeypatch.setenv("SPECPILOT_REFILL_ROUNDS", bad)
        with pytest.raises(SpecPilotError, match="SPECPILOT_REFILL_ROUNDS"):
            refill_rounds_per_replay()


@pytest.mark.parametrize("per,lag", [(1, 1), (2, 1), (3, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("k,batch", [(0, 2), (3, 3)])
def test_the_refill_schedule_in_replays_counts_the_loops_rounds(k, batch, per, lag, monkeypatch):
    # specpilot/cost/refill_schedule.refill_steps with rounds_per_replay models this loop from
    # each request's rounds alone: every round the decoder runs, by length, is counted there.
    # It does not model the drain's plain blocks (their bound needs the limits, and a request
    # that ends by EOS within one leaves rounds run past it): without blocks the count is exact,
    # with them at most 2 x DRAIN_PLAIN_ROUNDS - 1 rounds more.
    import specpilot.runtime.graphed_refill as refill
    from specpilot.cost.refill_schedule import refill_steps

    s, prompts, reference = mixed_requests(5)
    drafter = s["drafter"] if k else None
    ran = {}
    for block in (refill.DRAIN_PLAIN_ROUNDS, 1):
        monkeypatch.setattr(refill, "DRAIN_PLAIN_ROUNDS", block)
        decoder = GraphedRefillDecoder(s["target"], drafter, batch, 48, k, s["eos"],
                                       capture=False, rounds_per_replay=per, readback_lag=lag)
        r = decoder.generate(prompts, MAX_NEW)
        assert r.tokens == reference.tokens
        ran[block] = sum(v for name, v in r.stats.items() if name.startswith("rounds_chain_"))
        rounds = [len(a) for a in r.accepted_lengths]
    assert ran[1] == refill_steps(rounds, batch, rounds_per_replay=per, lag=lag)
    monkeypatch.undo()
    assert 0 <= ran[refill.DRAIN_PLAIN_ROUNDS] - ran[1] <= 2 * refill.DRAIN_PLAIN_ROUNDS - 1


def test_many_rounds_a_replay_do_not_trip_the_runaway_guard():
    # Each request holds its slot for two replays at least: counted in rounds, forty rounds a
    # replay over nine requests would pass (requests + slots) x (cache slots + 1) and be taken
    # for a request that never finishes.
    s, prompts, reference = mixed_requests(11)
    decoder = GraphedRefillDecoder(s["target"], s["drafter"], 1, 48, 3, s["eos"], capture=False,
                                   rounds_per_replay=40)
    assert decoder.generate(prompts, MAX_NEW).tokens == reference.tokens


def _replay_log(s, drafter, batch, k, **options):
    decoder = ReplayLog(s["target"], drafter, batch, 64, k, s["eos"], capture=False, **options)
    decoder.log = []
    return decoder


@pytest.mark.parametrize("seed", [11, 4])
@pytest.mark.parametrize("batch", [2, 3])
def test_plain_steps_with_nobody_to_refill_run_in_blocks(seed, batch):
    # Plain AR with refill: while the queue holds requests every replay is one round (a slot
    # must be refilled as soon as it is free); once it is empty, blocks of DRAIN_PLAIN_ROUNDS
    # while the longest request still needs that many, and single rounds at the end.
    from specpilot.runtime.graphed_refill import DRAIN_PLAIN_ROUNDS

    s, prompts, reference = mixed_requests(seed)
    decoder = _replay_log(s, None, batch, 0)
    r = decoder.generate(prompts, MAX_NEW)
    assert r.tokens == reference.tokens
    log = decoder.log
    last_admit = max(i for i, e in enumerate(log) if e == "admit")
    assert set(log[:last_admit]) <= {1, "admit"}
    drain = log[last_admit + 1:]
    assert DRAIN_PLAIN_ROUNDS in drain and drain[-1] == 1
    assert r.stats["rounds_chain_0"] == sum(e for e in log if e != "admit")


def _with_and_without_blocks(monkeypatch, make, prompts, limits):
    """(result, replay log) of one decoder from `make()`, then of one with no blocks."""
    import specpilot.runtime.graphed_refill as refill

    blocks = make()
    with_blocks = blocks.generate(prompts, limits)
    monkeypatch.setattr(refill, "DRAIN_PLAIN_ROUNDS", 1)    # no coarser than a replay: no blocks
    singles = make()
    one_by_one = singles.generate(prompts, limits)
    monkeypatch.undo()
    return (with_blocks, blocks.log), (one_by_one, singles.log)


@pytest.mark.parametrize("limits,batch", [([16, 9, 13], 3), ([5, 16, 16, 2], 4), ([16], 1),
                                          ([7, 16, 3, 12, 16, 9, 5], 3),
                                          ([16, 3, 2, 4, 2], 2)])
def test_blocks_run_no_round_that_single_rounds_would_not(limits, batch, monkeypatch):
    # Without EOS a request runs exactly limit - 1 rounds after its prefill: the blocks must end
    # where one round a replay ends, in fewer replays, with the same tokens, with or without a
    # queue before the drain (more requests than slots).
    s, prompts, _ = mixed_requests(11)
    no_eos = dict(s, eos=())
    (blocked, log), (single, singles_log) = _with_and_without_blocks(
        monkeypatch, lambda: _replay_log(no_eos, None, batch, 0), prompts[:len(limits)], limits)
    assert blocked.tokens == single.tokens
    assert [len(t) for t in blocked.tokens] == limits
    assert blocked.stats == single.stats
    assert blocked.target_forwards == single.target_forwards
    assert set(singles_log) <= {1, "admit"}
    assert len(log) < len(singles_log)


@pytest.mark.parametrize("seed,costs", [(11, [1.0, 2.0, 2.6, 3.2, 3.8]),
                                        (4, [1.0, 1.6, 2.0, 2.4, 2.8])])
def test_a_batch_that_speculated_then_turned_off_drains_in_the_rounds_singles_run(seed, costs,
                                                                                monkeypatch):
    # Dear rounds: requests accept drafts (several tokens a round), then the batch turns
    # speculation off. The blocks' bound counts from a read-back taken after the last
    # speculative round, so even then they run exactly the rounds of one round a replay.
    s, prompts, _ = mixed_requests(seed)
    no_eos = dict(s, eos=())
    limits = [MAX_NEW] * len(prompts)
    (blocked, log), (single, _) = _with_and_without_blocks(
        monkeypatch, lambda: _replay_log(no_eos, s["drafter"], 2, 4, adaptive=True,
                                         round_costs=costs), prompts, limits)
    assert blocked.tokens == single.tokens == generate_ar(s["target"], prompts, MAX_NEW).tokens
    assert blocked.stats == single.stats
    assert blocked.accepted_lengths == single.accepted_lengths
    speculative = sum(c for key, c in blocked.stats.items()
                      if key.startswith("rounds_chain_") and key != "rounds_chain_0")
    assert speculative > 0 and any(a > 0 for row in blocked.accepted_lengths for a in row)
    assert 4 in log, "the drain should have run a block"


def test_a_turned_off_adaptive_batch_drains_in_plain_blocks():
    # A useless drafter turns speculation off; once the queue is empty the plain steps run in
    # blocks, and every request still decodes as greedy AR does.
    from specpilot.runtime.graphed_refill import DRAIN_PLAIN_ROUNDS

    s, prompts, _ = mixed_requests(11)
    longer = generate_ar(s["target"], prompts, 2 * MAX_NEW, eos_ids=s["eos"])
    decoder = _replay_log(s, ContraryDrafter(s["target"]), 2, 4, adaptive=True)
    r = decoder.generate(prompts, 2 * MAX_NEW)
    assert r.tokens == longer.tokens
    last_admit = max(i for i, e in enumerate(decoder.log) if e == "admit")
    assert DRAIN_PLAIN_ROUNDS in decoder.log[last_admit:]
    assert DRAIN_PLAIN_ROUNDS not in decoder.log[:last_admit]
    assert r.accepted_lengths == [[0] * (len(t) - 1) for t in r.tokens]


class _HostScalarCopies(TorchDispatchMode):
    """Records each copy of a host scalar lifted into a tensor (`t[i] = v` on one element)
    and each fill_ with a Python value: on a GPU the first is a blocking host-to-device copy
    that waits for every replay queued (torch 2.11), the second a kernel with the value.
    (Host lists lifted into host tables, as a prefill's token table is, copy no scalar.)"""

    def __init__(self):
        super().__init__()
        self.lifted, self.copies, self.fills = [], 0, 0   # kept alive: no id is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.lift_fresh.default:
            self.lifted.append(out)
        elif (func is torch.ops.aten.copy_.default and args[1].dim() == 0
              and any(args[1] is t for t in self.lifted)):
            self.copies += 1
        elif func is torch.ops.aten.fill_.Scalar:
            self.fills += 1
        return out


@pytest.mark.parametrize("adaptive", [False, True])
def test_an_admission_copies_no_host_scalar_into_the_row(adaptive):
    """The refill admits newcomers between replays while the next is queued: a row's state
    set by element assignment would make the host wait for the GPU at every admission."""
    s, prompts, reference = mixed_requests(6)
    costs = [1.0, 1.2, 1.4, 1.6] if adaptive else None
    decoder = GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, 3, s["eos"],
                                   capture=False, adaptive=adaptive, round_costs=costs)
    watched = decoder._admit

    def admit(*args, **kwargs):
        with _HostScalarCopies() as seen:
            watched(*args, **kwargs)
        assert seen.copies == 0
        assert seen.fills >= 5            # the row's count, limit, length, prev and rounds
        admitted.append(args[0])
    admitted = []
    decoder._admit = admit
    assert decoder.generate(prompts, MAX_NEW).tokens == reference.tokens
    assert len(admitted) == len(prompts) - 2          # every newcomer past the two slots
