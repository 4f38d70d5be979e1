"""How the torch backend's attention runs, in the IR: `kernels.attention_kernels` ("model" or
"generated") and the SetAttentionKernels record. Golden canonical JSON and diff (the default is
not written, so every existing Program keeps its text and id), byte-identical round trips, each
refusal, and the rules that tie the generated attention to the torch backend (per op or in
the compiled blocks of the layers fast path)."""
import json
from dataclasses import replace

import pytest

from specpilot.ir import (CaptureGraphs, IllFormed, IRError, SetAttentionKernels, SetBackend,
                          SetDrafter, SetDrafterKernels, SetFastPath, TransformRefused, apply,
                          check, diff, format_diff, program_from_json, program_id,
                          program_to_json, replay, transformation_from_json,
                          transformation_to_json, verify)


def test_golden_json_and_diff_of_the_generated_attention(stock):
    generated = apply(stock, SetAttentionKernels("generated"))
    # canonical JSON sorts keys: the field opens the kernels object
    assert program_to_json(generated) == program_to_json(stock).replace(
        '"kernels":{"backend"', '"kernels":{"attention_kernels":"generated","backend"').replace(
        '"history":[]',
        '"history":[{"name":"SetAttentionKernels","params":{"kernels":"generated"}}]')
    # the default is left out: Programs from before the field keep their text and their id
    assert "attention_kernels" not in json.loads(program_to_json(stock))["kernels"]
    assert format_diff(diff(stock, generated)) == """\
kernels.attention_kernels: model → generated
history[0]: absent → SetAttentionKernels(kernels="generated")"""
    back = apply(generated, SetAttentionKernels("model"))
    assert back.kernels.attention_kernels == "model"
    assert program_id(back) == program_id(stock) != program_id(generated)


@pytest.mark.parametrize("order", ["layers-first", "attention-first"])
def test_golden_diff_of_the_generated_attention_on_compiled_layers(stock, order):
    """The layers fast path calls the generated attention from its compiled blocks: the two
    choices combine in either order, to one Program."""
    steps = [SetFastPath("layers"), SetAttentionKernels("generated")]
    if order == "attention-first":
        steps.reverse()
    both = replay(stock, steps)
    assert (both.kernels.fast_path, both.kernels.attention_kernels) == ("layers", "generated")
    verify(both)
    first, second = (str(t) for t in steps)
    assert format_diff(diff(stock, both)) == (
        "kernels.fast_path: ops → layers\n"
        "kernels.attention_kernels: model → generated\n"
        f"history[0]: absent → {first}\n"
        f"history[1]: absent → {second}")
    assert '"attention_kernels":"generated"' in program_to_json(both)
    assert '"fast_path":"layers"' in program_to_json(both)
    other = replay(stock, list(reversed(steps)))
    assert other.kernels == both.kernels


def test_round_trip_is_byte_identical_and_keeps_the_other_kernel_choices(stock):
    p = replay(stock, [CaptureGraphs(True), SetDrafterKernels("fused"),
                       SetAttentionKernels("generated")])
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p and program_to_json(again) == text
    k = again.kernels
    assert (k.attention_kernels, k.drafter_kernels, k.capture_graphs) == ("generated", "fused",
                                                                          True)
    assert program_from_json(program_to_json(stock)).kernels.attention_kernels == "model"


def test_record_json_and_text():
    t = SetAttentionKernels("generated")
    text = transformation_to_json(t)
    assert text == '{"name":"SetAttentionKernels","params":{"kernels":"generated"}}\n'
    assert transformation_from_json(text) == t
    assert str(t) == 'SetAttentionKernels(kernels="generated")'
    assert t.may_change_output is False
    with pytest.raises(IRError, match="SetAttentionKernels.kernels: expected str"):
        SetAttentionKernels(1)


@pytest.mark.parametrize("before,t,reason", [
    ([], SetAttentionKernels("flash"),
     "unknown attention kernels 'flash' (known: model, generated)"),
    ([], SetAttentionKernels("model"), "already attention kernels model"),
    ([SetAttentionKernels("generated")], SetAttentionKernels("generated"),
     "already attention kernels generated"),
    ([SetBackend("generated")], SetAttentionKernels("generated"),
     "the generated attention replaces the torch backend's; this Program runs the generated "
     "backend's own kernels (SetBackend('torch') first)"),
    ([SetAttentionKernels("generated")], SetBackend("generated"),
     "the generated backend runs its own kernels, not the torch backend's generated attention "
     "(SetAttentionKernels('model') first)"),
], ids=["unknown", "model-no-op", "generated-no-op", "generated-backend", "to-generated-backend"])
def test_refusals_name_the_fix(stock, before, t, reason):
    program = replay(stock, before)
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert reason in info.value.reason, info.value.reason


def test_plain_ar_may_run_the_generated_attention(stock):
    """The target's attention is the same op with or without a drafter: a greedy AR Program
    keeps the choice both ways."""
    ar = apply(stock, SetDrafter("none"))
    assert check(ar, SetAttentionKernels("generated")) is None
    generated = apply(stock, SetAttentionKernels("generated"))
    assert check(generated, SetDrafter("none")) is None


@pytest.mark.parametrize("change,message", [
    (lambda p: replace(p, kernels=replace(p.kernels, attention_kernels="flash")),
     "kernels.attention_kernels: expected one of model, generated, got 'flash'"),
    (lambda p: replace(p, kernels=replace(apply(p, SetBackend("generated")).kernels,
                                          attention_kernels="generated")),
     "kernels.attention_kernels: the generated attention replaces the torch backend's; this "
     "Program runs backend 'generated' (expected 'model', got 'generated')"),
], ids=["unknown", "generated-backend"])
def test_a_hand_made_program_with_bad_attention_kernels_is_ill_formed(stock, change, message):
    with pytest.raises(IllFormed) as info:
        verify(change(stock))
    assert str(info.value) == message


def test_bad_attention_kernels_in_json_are_refused(stock):
    text = program_to_json(stock)
    for value, message in (("7", "kernels.attention_kernels: expected str"),
                           ('"flash"', "kernels.attention_kernels: expected one of model, "
                                       "generated")):
        bad = text.replace('"overrides":{}}', f'"attention_kernels":{value},"overrides":{{}}}}')
        assert bad != text
        with pytest.raises(IRError, match=message):
            program_from_json(bad)
