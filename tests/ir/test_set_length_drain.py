"""What the adaptive draft length's batch rule optimises once a continuous refill's queue is
empty, in the IR: `batch.length_drain` ("makespan" or "throughput") and the SetLengthDrain
record. Golden canonical JSON and diff (the default is not written, so every existing Program
keeps its text and id), byte-identical round trips, each refusal, and the rule that ties the
drain to per_request_adaptive lengths with continuous refill."""
import json

import pytest

from specpilot.ir import (SetDraftLengthPolicy, SetLengthDrain,
                          SetMaxBatchSize, SetRefill, TransformRefused, apply, diff, format_diff,
                          program_from_json, program_id, program_to_json, replay,
                          transformation_from_json, transformation_to_json, verify)

from batch_field_checks import assert_batch_field_checked

REFILLED = [SetMaxBatchSize(4), SetDraftLengthPolicy("per_request_adaptive", 16),
            SetRefill("continuous")]


def test_golden_json_and_diff_of_the_throughput_drain(stock):
    refilled = replay(stock, REFILLED)
    drain = apply(refilled, SetLengthDrain("throughput"))
    assert json.loads(program_to_json(drain))["batch"] == {
        "draft_length_policy": "per_request_adaptive", "layout": "padded",
        "length_drain": "throughput", "max_batch_size": 4, "refill": "continuous",
        "token_budget": 16}
    assert '"batch":{"draft_length_policy":"per_request_adaptive","layout":"padded",' \
           '"length_drain":"throughput","max_batch_size":4,"refill":"continuous",' \
           '"token_budget":16}' in program_to_json(drain)
    # the default is left out: Programs from before the field keep their text and their id
    assert "length_drain" not in json.loads(program_to_json(refilled))["batch"]
    assert format_diff(diff(refilled, drain)) == """\
batch.length_drain: makespan → throughput
history[3]: absent → SetLengthDrain(drain="throughput")"""
    back = apply(drain, SetLengthDrain("makespan"))
    assert back.batch.length_drain == "makespan"
    assert program_to_json(back).count("length_drain") == 0
    assert program_id(back) != program_id(drain) != program_id(refilled)


def test_round_trip_is_byte_identical(stock):
    t = SetLengthDrain("throughput")
    text = transformation_to_json(t)
    assert text == '{"name":"SetLengthDrain","params":{"drain":"throughput"}}\n'
    assert transformation_from_json(text) == t and t.may_change_output is False
    p = replay(stock, [*REFILLED, t])
    again = program_from_json(program_to_json(p))
    assert again == p and program_to_json(again) == program_to_json(p)
    assert again.batch.length_drain == "throughput"


def test_refusals(stock):
    adaptive = replay(stock, REFILLED[:2])
    with pytest.raises(TransformRefused, match="per_request_adaptive"):
        apply(replay(stock, [SetMaxBatchSize(4), SetRefill("continuous")]),
              SetLengthDrain("throughput"))              # fixed lengths optimise nothing
    with pytest.raises(TransformRefused, match="continuous refill's queue; the refill is drain"):
        apply(adaptive, SetLengthDrain("throughput"))    # a drained batch has no queue
    refilled = replay(stock, REFILLED)
    with pytest.raises(TransformRefused, match="unknown length drain 'tail'"):
        apply(refilled, SetLengthDrain("tail"))
    with pytest.raises(TransformRefused, match="already the makespan drain"):
        apply(refilled, SetLengthDrain("makespan"))


def test_fixed_lengths_or_a_drained_batch_take_the_drain_back_to_its_default(stock):
    drain = replay(stock, [*REFILLED, SetLengthDrain("throughput")])
    for t in (SetDraftLengthPolicy("fixed", 0), SetRefill("drain")):
        back = apply(drain, t)
        assert back.batch.length_drain == "makespan"
        assert "batch.length_drain: throughput → makespan" in format_diff(diff(drain, back))
        verify(back)
    # a new budget keeps it
    rebudgeted = apply(drain, SetDraftLengthPolicy("per_request_adaptive", 12))
    assert rebudgeted.batch.length_drain == "throughput"


def test_verify_ties_the_drain_to_adaptive_lengths_with_continuous_refill(stock):
    # drained, an adaptive batch has no queue to follow
    assert_batch_field_checked("length_drain", replay(stock, REFILLED[:2]), "throughput",
                               replay(stock, REFILLED), "tail")


def test_the_cost_model_says_it_does_not_price_the_drain(stock):
    from specpilot.cost.model import unmodelled

    refilled = replay(stock, REFILLED)
    drain = apply(refilled, SetLengthDrain("throughput"))
    assert any("its throughput drain" in note for note in unmodelled(drain))
    assert not any("drain chooses" in note for note in unmodelled(refilled))
