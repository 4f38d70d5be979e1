"""The torch backend's fast path in the IR: `kernels.fast_path` ("ops" or "layers") and the
SetFastPath record. Golden canonical JSON and diff (the default is not written, so every
existing Program keeps its text and id), byte-identical round trips, each refusal, and the rule
that ties the fast path to the torch backend."""
import json
from dataclasses import replace

import pytest

from specpilot.ir import (CaptureGraphs, IllFormed, IRError, SetBackend, SetFastPath,
                          TransformRefused, apply, diff, format_diff, program_from_json,
                          program_id, program_to_json, replay, transformation_from_json,
                          transformation_to_json, verify)


def test_golden_json_and_diff_of_the_whole_layer_fast_path(stock):
    layers = apply(stock, SetFastPath("layers"))
    kernels = json.loads(program_to_json(layers))["kernels"]
    assert kernels == {"backend": "torch", "capture_graphs": False, "overrides": {},
                       "fast_path": "layers"}
    # the default is left out: Programs from before the field keep their text and their id
    assert "fast_path" not in json.loads(program_to_json(stock))["kernels"]
    assert format_diff(diff(stock, layers)) == """\
kernels.fast_path: ops → layers
history[0]: absent → SetFastPath(fast_path="layers")"""
    back = apply(layers, SetFastPath("ops"))
    assert program_id(back) == program_id(stock) != program_id(layers)


def test_round_trip_is_byte_identical(stock):
    p = replay(stock, [CaptureGraphs(True), SetFastPath("layers")])
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p and program_to_json(again) == text
    assert again.kernels.fast_path == "layers" and again.kernels.capture_graphs


def test_record_json_and_text():
    t = SetFastPath("layers")
    text = transformation_to_json(t)
    assert text == '{"name":"SetFastPath","params":{"fast_path":"layers"}}\n'
    assert transformation_from_json(text) == t and str(t) == 'SetFastPath(fast_path="layers")'


@pytest.mark.parametrize("before,t,reason", [
    ([], SetFastPath("fused"), "unknown fast path 'fused' (known: ops, layers)"),
    ([], SetFastPath("ops"), "already fast path ops"),
    ([SetBackend("generated")], SetFastPath("layers"),
     "the fast path is the torch backend's; this Program runs the generated backend's own "
     "kernels (SetBackend('torch') first)"),
    ([SetFastPath("layers")], SetBackend("generated"),
     "the generated backend runs its own kernels, not the torch backend's fast path 'layers' "
     "(SetFastPath('ops') first)"),
])
def test_refusals_name_the_fix(stock, before, t, reason):
    program = replay(stock, before)
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert reason in str(info.value)


def test_a_hand_made_program_with_a_bad_fast_path_is_ill_formed(stock):
    with pytest.raises(IllFormed, match="kernels.fast_path"):
        verify(replace(stock, kernels=replace(stock.kernels, fast_path="fast")))
    generated = apply(stock, SetBackend("generated"))
    with pytest.raises(IllFormed, match="the fast path is the torch backend's"):
        verify(replace(generated, kernels=replace(generated.kernels, fast_path="layers")))
    text = program_to_json(stock).replace('"overrides":{}', '"fast_path":7,"overrides":{}')
    with pytest.raises(IRError, match="kernels.fast_path"):
        program_from_json(text)
