"""Speculation off in the IR: `draft.drafter` "none" (greedy AR of the target) and the
SetDrafter record. Golden canonical JSON and diff, byte-identical round trips, the
well-formedness rules of a Program that does not speculate, each refusal, and the graph view."""
import json
from dataclasses import replace

import pytest

from specpilot.ir import (CaptureGraphs, Chain, IllFormed, LayerSkipPrune, SetBackend,
                          SetBatchLayout, SetDrafter, SetDraftLength, SetDraftLengthPolicy,
                          SetMaxBatchSize, SetRefill, SetTopology, SetVerifyPrune,
                          SetWeightFormat, TransformRefused, Tree, apply, check, dataflow_graph,
                          diff, format_diff, program_from_json, program_id, program_to_json,
                          record_escape_rates, replay, transformation_from_json,
                          transformation_to_json, verify)


def test_golden_json_and_diff_of_speculation_off(stock):
    off = apply(stock, SetDrafter("none"))
    draft = json.loads(program_to_json(off))["draft"]
    assert draft == {"drafter": "none", "topology": {"k": 4, "kind": "chain"}}
    assert '"history":[{"name":"SetDrafter","params":{"drafter":"none"}}]' in program_to_json(off)
    assert format_diff(diff(stock, off)) == """\
draft.drafter: model → none
history[0]: absent → SetDrafter(drafter="none")"""
    # the topology, the drafter model and everything else are kept, so "model" restores it
    assert off.models == stock.models and off.draft.topology == stock.draft.topology
    back = apply(off, SetDrafter("model"))
    assert program_id(back) == program_id(stock) != program_id(off)
    assert not off.draft.speculates and back.draft.speculates
    assert off.draft.describe() == "no speculation (greedy AR)"
    assert back.draft.describe() == "chain(4)"


def test_round_trip_is_byte_identical(stock):
    off = replay(stock, [SetTopology(Tree((2, 2))), SetMaxBatchSize(16), SetDrafter("none")])
    text = program_to_json(off)
    again = program_from_json(text)
    assert again == off and program_to_json(again) == text
    assert again.draft.drafter == "none" and again.draft.topology == Tree((2, 2))


def test_record_json_and_text():
    t = SetDrafter("none")
    text = transformation_to_json(t)
    assert text == '{"name":"SetDrafter","params":{"drafter":"none"}}\n'
    assert transformation_from_json(text) == t and str(t) == 'SetDrafter(drafter="none")'
    assert t.may_change_output is False


@pytest.mark.parametrize("before,t,reason", [
    ([], SetDrafter("ngram"), "unknown drafter 'ngram' (known: model, none)"),
    ([], SetDrafter("model"), "the drafter is already 'model'"),
    ([SetDrafter("none")], SetDrafter("none"), "the drafter is already 'none'"),
    ([SetTopology(Tree((2, 2))), SetVerifyPrune(LayerSkipPrune((0,), 2))], SetDrafter("none"),
     "verify.prune is layer_skip(keep_layers=[0], top_k=2): apply SetVerifyPrune(None) first"),
    ([SetMaxBatchSize(4), SetDraftLengthPolicy("per_request_adaptive", 8)], SetDrafter("none"),
     "batch.draft_length_policy is per_request_adaptive: apply SetDraftLengthPolicy('fixed', 0)"),
    ([SetBatchLayout("ragged")], SetDrafter("none"),
     "batch.layout is ragged: apply SetBatchLayout('padded') first"),
], ids=["unknown", "model-no-op", "none-no-op", "pruned", "adaptive", "ragged"])
def test_set_drafter_refusals(stock, before, t, reason):
    program = replay(stock, before)
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert reason in info.value.reason, info.value.reason


@pytest.mark.parametrize("t,reason", [
    (SetTopology(Tree((2, 2))), "the topology tree([2, 2]) changes nothing it does"),
    (SetDraftLength(2), "the draft length 2 changes nothing it does"),
    (SetWeightFormat("drafter.*", "fp32"), "the drafter's weight format changes nothing"),
    (SetDraftLengthPolicy("per_request_adaptive", 4), "an adaptive draft length changes nothing"),
    (SetVerifyPrune(LayerSkipPrune((0,), 1)), "pruning the draft"),
    (SetBatchLayout("ragged"), "batch.layout: a Program without a drafter decodes with greedy AR"),
], ids=str)
def test_draft_attributes_of_a_program_without_drafter_are_refused(stock, t, reason):
    off = replay(stock, [SetMaxBatchSize(4), SetDrafter("none")])
    assert reason in check(off, t)


def test_what_a_program_without_drafter_may_still_change(stock):
    off = apply(stock, SetDrafter("none"))
    measured = record_escape_rates(off, "target", {n: 10 for n in off.models.target.linears})
    assert check(measured, SetWeightFormat("target.mlp.*", "lossless12")) is None
    for t in (SetMaxBatchSize(16), CaptureGraphs(True), SetBackend("generated"),
              SetRefill("continuous")):
        assert check(off, t) is None, t


def test_greedy_ar_may_refill_its_slots(stock):
    # Greedy AR that refills finished slots is its own decoder (chains of 0 on the refill
    # loop): reached from either side, one Program, one id, one diff line.
    refilled = replay(stock, [SetMaxBatchSize(4), SetDrafter("none"), SetRefill("continuous")])
    other_way = replay(stock, [SetMaxBatchSize(4), SetRefill("continuous"), SetDrafter("none")])
    verify(refilled)
    assert program_id(refilled) == program_id(other_way)
    drained = replay(stock, [SetMaxBatchSize(4), SetDrafter("none")])
    assert program_id(refilled) != program_id(drained)
    assert format_diff(diff(drained, refilled)) == """\
batch.refill: drain → continuous
history[2]: absent → SetRefill(refill="continuous")"""
    back = apply(refilled, SetDrafter("model"))        # speculation back, refill kept
    assert back.draft.speculates and back.batch.refill == "continuous"


@pytest.mark.parametrize("change,message", [
    (lambda p: replace(p, verify=replace(p.verify, prune=LayerSkipPrune((0,), 2))),
     "verify.prune: a Program without a drafter verifies no draft"),
    (lambda p: replace(p, batch=replace(p.batch, layout="ragged")),
     "batch.layout: a Program without a drafter decodes with greedy AR in padded batches: "
     "expected 'padded', got 'ragged'"),
    (lambda p: replace(p, batch=replace(p.batch, draft_length_policy="per_request_adaptive",
                                        token_budget=4)), "batch.draft_length_policy:"),
    # the kept topology is checked like any other (its mask still follows it)
    (lambda p: replace(p, verify=replace(p.verify, mask="tree")), "verify.mask:"),
], ids=["prune", "ragged", "adaptive", "mask"])
def test_well_formedness_of_a_program_without_drafter(stock, change, message):
    off = apply(stock, SetDrafter("none"))
    with pytest.raises(IllFormed) as info:
        verify(change(off))
    assert str(info.value).startswith(message), str(info.value)


def test_graph_view_is_one_ar_step(stock):
    off = apply(stock, SetDrafter("none"))
    g = dataflow_graph(off)
    speculative = dataflow_graph(stock)
    assert g.graph == {"topology": "no speculation (greedy AR)", "draft_tokens": 0,
                       "verify_tokens": 1}
    assert {a["role"] for _, a in g.nodes(data=True)} == {"target", None}
    assert all(a["tokens"] == 1 for _, a in g.nodes(data=True))
    # the same target nodes as the speculative step, drafter and draft layout removed
    dropped = {n for n, a in speculative.nodes(data=True)
               if a["kind"] in ("drafter_forward", "build_draft")}
    assert set(g.nodes) == set(speculative.nodes) - dropped and dropped
    assert list(g.successors("target.lm_head")) == ["verify.accept"]
    assert g.nodes["target.embed"]["weight_bytes"] == 8 * 2    # one bf16 row of hidden 8
    assert speculative.graph["topology"] == str(Chain(4))
