"""What the adaptive draft length's batch rule expects a chain to commit, in the IR:
`batch.length_estimator` ("geometric" or "per_depth") and the SetLengthEstimator record. Golden
canonical JSON and diff (the default is not written, so every existing Program keeps its text
and id), byte-identical round trips, each refusal, and the rule that ties the estimator to
per_request_adaptive lengths."""
import json

import pytest

from specpilot.ir import (SetDraftLengthPolicy, SetLengthEstimator,
                          SetMaxBatchSize, TransformRefused, apply, diff, format_diff,
                          program_from_json, program_id, program_to_json, replay,
                          transformation_from_json, transformation_to_json)

from batch_field_checks import assert_batch_field_checked

ADAPTIVE = [SetMaxBatchSize(4), SetDraftLengthPolicy("per_request_adaptive", 16)]


def test_golden_json_and_diff_of_the_per_depth_estimator(stock):
    adaptive = replay(stock, ADAPTIVE)
    depth = apply(adaptive, SetLengthEstimator("per_depth"))
    assert json.loads(program_to_json(depth))["batch"] == {
        "draft_length_policy": "per_request_adaptive", "layout": "padded",
        "length_estimator": "per_depth", "max_batch_size": 4, "token_budget": 16}
    assert '"batch":{"draft_length_policy":"per_request_adaptive","layout":"padded",' \
           '"length_estimator":"per_depth","max_batch_size":4,"token_budget":16}' \
           in program_to_json(depth)
    # the default is left out: Programs from before the field keep their text and their id
    assert "length_estimator" not in json.loads(program_to_json(adaptive))["batch"]
    assert format_diff(diff(adaptive, depth)) == """\
batch.length_estimator: geometric → per_depth
history[2]: absent → SetLengthEstimator(estimator="per_depth")"""
    back = apply(depth, SetLengthEstimator("geometric"))
    assert back.batch.length_estimator == "geometric"
    assert program_to_json(back).count("length_estimator") == 0
    assert program_id(back) != program_id(depth) != program_id(adaptive)


def test_round_trip_is_byte_identical():
    t = SetLengthEstimator("per_depth")
    text = transformation_to_json(t)
    assert text == '{"name":"SetLengthEstimator","params":{"estimator":"per_depth"}}\n'
    assert transformation_from_json(text) == t and t.may_change_output is False


def test_program_round_trip(stock):
    p = replay(stock, [*ADAPTIVE, SetLengthEstimator("per_depth")])
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p and program_to_json(again) == text
    assert again.batch.length_estimator == "per_depth"


def test_refusals(stock):
    with pytest.raises(TransformRefused, match="per_request_adaptive"):
        apply(stock, SetLengthEstimator("per_depth"))          # fixed lengths estimate nothing
    adaptive = replay(stock, ADAPTIVE)
    with pytest.raises(TransformRefused, match="unknown length estimator 'depth'"):
        apply(adaptive, SetLengthEstimator("depth"))
    with pytest.raises(TransformRefused, match="already the geometric estimator"):
        apply(adaptive, SetLengthEstimator("geometric"))


def test_fixed_lengths_take_the_estimator_back_to_its_default(stock):
    depth = replay(stock, [*ADAPTIVE, SetLengthEstimator("per_depth")])
    fixed = apply(depth, SetDraftLengthPolicy("fixed", 0))
    assert fixed.batch.length_estimator == "geometric"
    assert "batch.length_estimator: per_depth → geometric" in format_diff(diff(depth, fixed))
    # a new budget keeps it
    rebudgeted = apply(depth, SetDraftLengthPolicy("per_request_adaptive", 12))
    assert rebudgeted.batch.length_estimator == "per_depth"


def test_verify_ties_the_estimator_to_adaptive_lengths(stock):
    assert_batch_field_checked("length_estimator", stock, "per_depth", replay(stock, ADAPTIVE),
                               "depth")


def test_the_cost_model_says_it_does_not_price_the_estimator(stock):
    from specpilot.cost.model import unmodelled

    adaptive = replay(stock, ADAPTIVE)
    depth = apply(adaptive, SetLengthEstimator("per_depth"))
    assert any("per_depth length estimator" in note for note in unmodelled(depth))
    assert not any("estimator" in note for note in unmodelled(adaptive))
