"""The report's note on what the best Program's ratio to AR measures
(specpilot/report/baseline_note.py), on real Programs: speculation off, another fast path, both,
and neither."""
import pytest

from specpilot.deploy import build_deployment
from specpilot.ir import (CaptureGraphs, SetAttentionKernels, SetDrafter, SetFastPath,
                          SetMaxBatchSize, SetRefill, apply, load_program, replay, save_program,
                          stock_program)
from specpilot.report.baseline_note import baseline_note
from specpilot.report.run_report import _baseline_lines

from hf_factory import make_checkpoint

AR = "strong AR (CUDA graphs)"


@pytest.fixture(scope="module")
def graphed(tmp_path_factory):
    target = make_checkpoint(tmp_path_factory.mktemp("note"), "llama3", seed=61)
    return apply(stock_program(build_deployment(target, target, gpu="cpu", dtype="float32")),
                 CaptureGraphs(True))


def test_speculation_off_is_named_with_the_fast_path_it_gained_from(graphed):
    off = apply(graphed, SetDrafter("none"))
    same = baseline_note(off, AR, "ops")
    assert "does not speculate" in same and "decoding loop" in same and "'layers'" not in same
    layers = baseline_note(apply(off, SetFastPath("layers")), AR, "ops")
    assert "does not speculate" in layers and "'layers' fast path" in layers
    assert "fast path's gain, not speculation's" in layers


def test_a_speculating_program_is_noted_only_on_another_fast_path(graphed):
    assert baseline_note(graphed, AR, "ops") is None
    assert baseline_note(graphed, AR, None) is None
    note = baseline_note(apply(graphed, SetFastPath("layers")), AR, "ops")
    assert "part of its ratio" in note and "SPECPILOT_FAST_OPS=layers" in note
    # AR itself ran on whole layers (the variable set for the whole compile): no note
    assert baseline_note(apply(graphed, SetFastPath("layers")), AR, "layers") is None


def test_refill_is_named_alone_or_after_the_other_notes(graphed):
    refilled = replay(graphed, [SetMaxBatchSize(4), SetRefill("continuous")])
    alone = baseline_note(refilled, AR, "ops")
    assert alone.startswith("It refills finished slots") and "strong_ar_refill" in alone
    off = baseline_note(apply(refilled, SetDrafter("none")), AR, "ops")
    assert off.startswith("The best Program does not speculate") and "refill's gain" in off


def test_the_report_takes_ar_s_path_from_round_0_where_the_run_did_not_record_it(graphed,
                                                                                tmp_path):
    (tmp_path / "round-0").mkdir()
    save_program(graphed, str(tmp_path / "round-0" / "program.json"))
    save_program(apply(graphed, SetFastPath("layers")), str(tmp_path / "program.json"))
    zero = {"ar_timing": {"median_tokens_per_s": 100.0}, "ar_label": AR}
    stock = load_program(str(tmp_path / "round-0"))
    lines = _baseline_lines(tmp_path, zero, stock)
    assert len(lines) == 2 and "'ops' one" in lines[0]
    assert _baseline_lines(tmp_path, dict(zero, ar_fast_path="layers"), stock) == []
    assert _baseline_lines(tmp_path, {"ar_label": AR}, stock) == []   # no AR timed: nothing to say


def test_the_generated_attention_is_named_with_speculation_off_and_on(graphed):
    kernel = SetAttentionKernels("generated")
    off = baseline_note(replay(graphed, [SetDrafter("none"), kernel]), AR, "ops")
    assert off.startswith("The best Program does not speculate")
    assert "generated kernel" in off and "mech:graphed_ar_attention" in off
    on = baseline_note(apply(graphed, kernel), AR, "ops")
    assert on.startswith("Its attention runs by the generated kernel") and "part of" in on
    both = baseline_note(replay(graphed, [SetMaxBatchSize(4), kernel, SetRefill("continuous")]),
                         AR, "ops")
    assert both.index("generated kernel") < both.index("refill's gain")
    # on compiled layers, the bench's greedy AR with the kernel on that path is the one named
    layers = baseline_note(replay(graphed, [SetFastPath("layers"), kernel]), AR, "ops")
    assert "mech:graphed_ar_layers_attention" in layers and "'layers' fast path" in layers
    assert "mech:graphed_ar_attention)" not in layers
