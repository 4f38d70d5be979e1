"""Systems timed side by side (specpilot/bench/interleave.py): the order of every call, rotated
passes, failures kept to their own system, and the decoder cache held open for the group."""
import random

import pytest

from specpilot.bench.interleave import measure_interleaved, rotated
from specpilot.bench.systems import RunOutput, System
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime import graphed_program
from specpilot.runtime.ar import ARResult


class Recorded(System):
    """A system that logs every call in a shared list and decodes by a rule of its own (each
    prompt's tokens shifted by `shift`), so each row can be checked against its own output."""
    graphed = True

    def __init__(self, name, log, shift=0, fail_in=None, fail_on_run=None, missing=None):
        super().__init__()
        self.name, self.log, self.shift = name, log, shift
        self.fail_in, self.fail_on_run, self.missing = fail_in, fail_on_run, missing
        self.runs = 0

    def unavailable(self, batch_size):
        return self.missing

    def setup(self, batch_size, prompts, max_new_tokens):
        self.log.append(("setup", self.name))
        if self.fail_in == "setup":
            raise SpecPilotError(f"{self.name} cannot set up")

    def run(self, prompts, batch_size, max_new_tokens):
        self.runs += 1
        self.log.append(("run", self.name, len(prompts)))
        if self.fail_on_run == self.runs:
            raise SpecPilotError(f"{self.name} failed on run {self.runs}")
        tokens = [[(t + self.shift) % 97 for t in p][:max_new_tokens] for p in prompts]
        return RunOutput(tokens, target_forwards=len(prompts) * 2, mean_accepted=1.5)

    def check(self, prompts, batch_size, reference, output):
        self.log.append(("check", self.name))
        if self.fail_in == "check":
            raise SpecPilotError(f"{self.name} failed its check")
        return {"forcing": {"passed": True}}

    def teardown(self):
        self.log.append(("teardown", self.name))


def _inputs(n=5, seed=0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(2, 7))] for _ in range(n)]
    return prompts, ARResult([list(p) for p in prompts], [[] for _ in prompts], 0)


def test_rotated_starts_each_pass_one_later():
    assert [rotated("abc", t) for t in range(4)] == [list("abc"), list("bca"), list("cab"),
                                                     list("abc")]
    assert rotated([], 3) == []


def test_every_system_is_set_up_first_then_timed_in_rotated_passes_then_checked():
    log = []
    systems = [Recorded(name, log, shift) for name, shift in (("a", 0), ("b", 1), ("c", 2))]
    prompts, reference = _inputs()
    measured = measure_interleaved(systems, prompts, reference, batch_size=2,
                                   max_new_tokens=8, warmup=1, repeats=3, device="cpu")
    filled = 6                                           # 5 prompts filled to whole batches of 2
    names = ["a", "b", "c"]
    want = ([e for n in names for e in (("setup", n), ("run", n, filled))]     # warm-ups
            + [("run", n, filled) for t in range(3) for n in rotated(names, t)]
            + [("check", n) for n in names] + [("teardown", n) for n in names])
    assert log == want
    for (row, first), name, shift in zip(measured, names, (0, 1, 2)):
        assert row["status"] == "measured" and row["system"] == name
        timing = dict(row["timing"])
        started = timing.pop("started")
        assert timing == {"mode": "interleaved", "systems": names,
                          "places": [rotated(names, t).index(name) for t in range(3)]}
        assert len(started) == 3 and started == sorted(started)
        assert len(row["seconds"]["runs"]) == 3 and row["requests"] == filled
        new = sum(len(t) for t in first.tokens)
        assert row["new_tokens"] == new
        assert row["tokens_per_s"]["runs"] == pytest.approx(
            [new / s for s in row["seconds"]["runs"]])
        # The first timed run's own output, compared with the reference as it stands.
        cycled = [prompts[i % len(prompts)] for i in range(filled)]
        assert first.tokens == [[(t + shift) % 97 for t in p] for p in cycled]
        # Shifted by 1 or 2 (mod 97) no token stays itself: only the unshifted system is exact.
        assert row["exact_match"]["exact_requests"] == (filled if shift == 0 else 0)
        assert row["exact_match"]["all_exact"] == (shift == 0)
        assert row["peak_memory_bytes"] is None               # no GPU here
    # The runs' start times, sorted, give back the passes' rotated order.
    starts = sorted((t, row["system"]) for row, _ in measured for t in row["timing"]["started"])
    assert [name for _, name in starts] == [n for t in range(3) for n in rotated(names, t)]


def test_a_failing_system_gets_its_own_row_and_the_others_go_on():
    log = []
    systems = [Recorded("ok", log), Recorded("bad_setup", log, fail_in="setup"),
               Recorded("bad_run", log, fail_on_run=3), Recorded("bad_check", log, fail_in="check"),
               Recorded("absent", log, missing="needs a GPU")]
    prompts, reference = _inputs(4, seed=1)
    rows = [r for r, _ in measure_interleaved(systems, prompts, reference, batch_size=4,
                                              max_new_tokens=8, warmup=1, repeats=2,
                                              device="cpu")]
    by = {r["system"]: r for r in rows}
    assert [r["system"] for r in rows] == [s.name for s in systems]
    assert by["ok"]["status"] == "measured"
    assert (by["bad_setup"]["status"], by["bad_setup"]["reason"]) == ("failed",
                                                                      "bad_setup cannot set up")
    # Its warm-up was run 1; its second timed run (run 3) failed.
    assert (by["bad_run"]["status"], by["bad_run"]["reason"]) == ("failed",
                                                                  "bad_run failed on run 3")
    assert by["bad_check"]["status"] == "failed"
    assert (by["absent"]["status"], by["absent"]["reason"]) == ("skipped", "needs a GPU")
    assert ("setup", "absent") not in log
    # The group its passes started with; pass 2 was bad_run (failing), bad_check, ok.
    assert by["ok"]["timing"]["systems"] == ["ok", "bad_run", "bad_check"]
    assert by["ok"]["timing"]["places"] == [0, 2]
    assert len(by["ok"]["seconds"]["runs"]) == 2
    assert ("check", "bad_run") not in log
    assert [e for e in log if e[0] == "teardown"] == [("teardown", s.name) for s in systems]


def test_no_pass_at_all_is_refused():
    with pytest.raises(SpecPilotError, match="at least one timed pass"):
        measure_interleaved([Recorded("a", [])], *_inputs(), batch_size=1, max_new_tokens=4,
                            warmup=0, repeats=0, device="cpu")


def test_the_decoder_cache_holds_the_group_and_shrinks_back_after(monkeypatch):
    cache = graphed_program._decoders
    monkeypatch.setattr(graphed_program, "_decoders", type(cache)())
    usual = graphed_program.KEPT_DECODERS
    with graphed_program.kept_decoders(usual + 3):
        assert graphed_program._kept == usual + 3
        for key in range(usual + 3):
            graphed_program._decoders[key] = object()
        graphed_program._trim_decoders(graphed_program._kept)    # as decoder_for trims
        assert len(graphed_program._decoders) == usual + 3
    assert graphed_program._kept == graphed_program.KEPT_DECODERS == usual
    # The newest are kept, the oldest dropped.
    assert list(graphed_program._decoders) == list(range(3, usual + 3))
    with graphed_program.kept_decoders(1):          # never below the usual count
        assert graphed_program._kept == usual
    with pytest.raises(SpecPilotError, match="at least 1"):
        with graphed_program.kept_decoders(0):
            pass
