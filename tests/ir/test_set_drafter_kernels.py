"""How the drafter runs, in the IR: `kernels.drafter_kernels` ("model" or "fused") and the
SetDrafterKernels record. Golden canonical JSON and diff (the default is not written, so every
existing Program keeps its text and id), byte-identical round trips, each refusal, and the rules
that tie the fused kernels to a drafter and to the torch backend."""
import json
from dataclasses import replace

import pytest

from specpilot.ir import (CaptureGraphs, IllFormed, IRError, SetBackend,
                          SetDrafter, SetDrafterKernels, SetFastPath, TransformRefused, apply,
                          check, diff, format_diff, program_from_json, program_id,
                          program_to_json, replay, transformation_from_json,
                          transformation_to_json, verify)


def test_golden_json_and_diff_of_the_fused_drafter(stock):
    fused = apply(stock, SetDrafterKernels("fused"))
    assert program_to_json(fused) == program_to_json(stock).replace(
        '"overrides":{}}', '"drafter_kernels":"fused","overrides":{}}').replace(
        '"history":[]', '"history":[{"name":"SetDrafterKernels","params":{"kernels":"fused"}}]')
    # the default is left out: Programs from before the field keep their text and their id
    assert "drafter_kernels" not in json.loads(program_to_json(stock))["kernels"]
    assert format_diff(diff(stock, fused)) == """\
kernels.drafter_kernels: model → fused
history[0]: absent → SetDrafterKernels(kernels="fused")"""
    back = apply(fused, SetDrafterKernels("model"))
    assert back.kernels.drafter_kernels == "model"
    assert program_id(back) == program_id(stock) != program_id(fused)


def test_round_trip_is_byte_identical_and_keeps_the_other_kernel_choices(stock):
    p = replay(stock, [CaptureGraphs(True), SetFastPath("layers"), SetDrafterKernels("fused")])
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p and program_to_json(again) == text
    k = again.kernels
    assert (k.drafter_kernels, k.fast_path, k.capture_graphs) == ("fused", "layers", True)
    # a text without the field reads as the default
    plain = program_from_json(program_to_json(stock))
    assert plain.kernels.drafter_kernels == "model"


def test_record_json_and_text():
    t = SetDrafterKernels("fused")
    text = transformation_to_json(t)
    assert text == '{"name":"SetDrafterKernels","params":{"kernels":"fused"}}\n'
    assert transformation_from_json(text) == t and str(t) == 'SetDrafterKernels(kernels="fused")'
    assert t.may_change_output is False
    with pytest.raises(IRError, match="SetDrafterKernels.kernels: expected str"):
        SetDrafterKernels(1)


@pytest.mark.parametrize("before,t,reason", [
    ([], SetDrafterKernels("triton"), "unknown drafter kernels 'triton' (known: model, fused)"),
    ([], SetDrafterKernels("model"), "already drafter kernels model"),
    ([SetDrafterKernels("fused")], SetDrafterKernels("fused"), "already drafter kernels fused"),
    ([SetDrafter("none")], SetDrafterKernels("fused"),
     "the Program does not speculate (draft.drafter 'none'): the drafter kernels 'fused' "
     "changes nothing it does; SetDrafter('model') first"),
    ([SetDrafterKernels("fused")], SetDrafter("none"),
     "kernels.drafter_kernels is fused: apply SetDrafterKernels('model') first"),
    ([SetBackend("generated")], SetDrafterKernels("fused"),
     "the fused drafter kernels read the torch backend's dense weights; this Program runs the "
     "generated backend's own kernels (SetBackend('torch') first)"),
    ([SetDrafterKernels("fused")], SetBackend("generated"),
     "the generated backend runs its own kernels, not the fused drafter kernels, which read the "
     "torch backend's dense weights (SetDrafterKernels('model') first)"),
], ids=["unknown", "model-no-op", "fused-no-op", "no-drafter", "drafter-off", "generated",
        "to-generated"])
def test_refusals_name_the_fix(stock, before, t, reason):
    program = replay(stock, before)
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert reason in info.value.reason, info.value.reason


def test_what_a_fused_drafter_program_may_still_change(stock):
    fused = apply(stock, SetDrafterKernels("fused"))
    for t in (CaptureGraphs(True), SetFastPath("layers"), SetDrafterKernels("model")):
        assert check(fused, t) is None, t
    # speculation off and back: the drafter kernels go back to the model's first
    off = replay(fused, [SetDrafterKernels("model"), SetDrafter("none")])
    assert check(off, SetDrafter("model")) is None


@pytest.mark.parametrize("change,message", [
    (lambda p: replace(p, kernels=replace(p.kernels, drafter_kernels="fast")),
     "kernels.drafter_kernels: expected one of model, fused, got 'fast'"),
    (lambda p: replace(p, kernels=replace(p.kernels, drafter_kernels=None)),
     "kernels.drafter_kernels: expected one of model, fused, got None"),
    (lambda p: replace(apply(p, SetBackend("generated")),
                       kernels=replace(apply(p, SetBackend("generated")).kernels,
                                       drafter_kernels="fused")),
     "kernels.drafter_kernels: the fused drafter kernels read the torch backend's dense "
     "weights; the generated backend runs its own kernels (expected 'model', got 'fused')"),
    (lambda p: replace(apply(p, SetDrafter("none")),
                       kernels=replace(p.kernels, drafter_kernels="fused")),
     "kernels.drafter_kernels: a Program without a drafter runs no drafter kernels: expected "
     "'model', got 'fused'"),
], ids=["unknown", "not-a-string", "generated", "no-drafter"])
def test_a_hand_made_program_with_bad_drafter_kernels_is_ill_formed(stock, change, message):
    with pytest.raises(IllFormed) as info:
        verify(change(stock))
    assert str(info.value) == message


def test_bad_drafter_kernels_in_json_are_refused(stock):
    text = program_to_json(stock)
    for value, message in (("7", "kernels.drafter_kernels: expected str"),
                           ('"fast"', "kernels.drafter_kernels: expected one of model, fused")):
        bad = text.replace('"overrides":{}}', f'"drafter_kernels":{value},"overrides":{{}}}}')
        assert bad != text
        with pytest.raises(IRError, match=message):
            program_from_json(bad)
    off = program_to_json(apply(stock, SetDrafter("none")))
    with pytest.raises(IllFormed, match="a Program without a drafter runs no drafter kernels"):
        program_from_json(off.replace('"overrides":{}}',
                                      '"drafter_kernels":"fused","overrides":{}}'))
