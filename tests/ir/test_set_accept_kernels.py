"""How a graphed chain round ends, in the IR: `kernels.accept_kernels` ("ops" or "fused") and
the SetAcceptKernels record. Golden canonical JSON and diff (the default is not written, so
every existing Program keeps its text and id), byte-identical round trips, each refusal, and
the rules that tie the fused round end to a speculating chain."""
import json
from dataclasses import replace

import pytest

from specpilot.ir import (Chain, IllFormed, IRError, SetAcceptKernels, SetDrafter,
                          SetDrafterKernels, SetRefill, SetTopology, Tree, TransformRefused,
                          apply, diff, format_diff, program_from_json, program_id,
                          program_to_json, replay, transformation_from_json,
                          transformation_to_json, verify)


def test_golden_json_and_diff_of_the_fused_round_end(stock):
    fused = apply(stock, SetAcceptKernels("fused"))
    # canonical JSON sorts keys: the field opens the kernels object
    assert program_to_json(fused) == program_to_json(stock).replace(
        '"kernels":{"backend"', '"kernels":{"accept_kernels":"fused","backend"').replace(
        '"history":[]',
        '"history":[{"name":"SetAcceptKernels","params":{"kernels":"fused"}}]')
    assert "accept_kernels" not in json.loads(program_to_json(stock))["kernels"]
    assert format_diff(diff(stock, fused)) == """\
kernels.accept_kernels: ops → fused
history[0]: absent → SetAcceptKernels(kernels="fused")"""
    back = apply(fused, SetAcceptKernels("ops"))
    assert back.kernels.accept_kernels == "ops"
    assert program_id(back) == program_id(stock) != program_id(fused)


def test_round_trip_is_byte_identical_and_keeps_the_other_kernel_choices(stock):
    p = replay(stock, [SetRefill("continuous"), SetDrafterKernels("fused"),
                       SetAcceptKernels("fused")])
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p and program_to_json(again) == text
    assert (again.kernels.accept_kernels, again.kernels.drafter_kernels) == ("fused", "fused")


def test_record_json_and_text():
    t = SetAcceptKernels("fused")
    text = transformation_to_json(t)
    assert text == '{"name":"SetAcceptKernels","params":{"kernels":"fused"}}\n'
    assert transformation_from_json(text) == t
    assert str(t) == 'SetAcceptKernels(kernels="fused")'
    assert t.may_change_output is False


TREE = Tree((2, 1))


@pytest.mark.parametrize("before,t,reason", [
    ([], SetAcceptKernels("cuda"), "unknown accept kernels 'cuda' (known: ops, fused)"),
    ([], SetAcceptKernels("ops"), "already accept kernels ops"),
    ([SetDrafter("none")], SetAcceptKernels("fused"),
     "the Program does not speculate (draft.drafter 'none'): the accept kernels 'fused'"),
    ([SetTopology(TREE)], SetAcceptKernels("fused"),
     f"the fused round end accepts chains; {TREE} is not one"),
    ([SetAcceptKernels("fused")], SetTopology(TREE),
     f"the fused round end accepts chains; {TREE} is not one (SetAcceptKernels('ops') first)"),
    ([SetAcceptKernels("fused")], SetDrafter("none"),
     "kernels.accept_kernels is fused: apply SetAcceptKernels('ops') first"),
], ids=["unknown", "no-op", "no-drafter", "tree", "to-tree", "to-no-drafter"])
def test_refusals_name_the_fix(stock, before, t, reason):
    program = replay(stock, before)
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert reason in info.value.reason, info.value.reason


def test_a_longer_chain_keeps_the_fused_round_end(stock):
    p = replay(stock, [SetAcceptKernels("fused"), SetTopology(Chain(6))])
    assert p.kernels.accept_kernels == "fused" and p.draft.topology == Chain(6)


@pytest.mark.parametrize("change,message", [
    (lambda p: replace(p, kernels=replace(p.kernels, accept_kernels="cuda")),
     "kernels.accept_kernels: expected one of ops, fused, got 'cuda'"),
    (lambda p: replace(apply(p, SetTopology(TREE)),
                       kernels=replace(p.kernels, accept_kernels="fused")),
     f"kernels.accept_kernels: the fused round end accepts chains; {TREE} is not one "
     "(expected 'ops', got 'fused')"),
], ids=["unknown", "tree"])
def test_a_hand_made_program_with_bad_accept_kernels_is_ill_formed(stock, change, message):
    with pytest.raises(IllFormed) as info:
        verify(change(stock))
    assert str(info.value) == message


def test_bad_accept_kernels_in_json_are_refused(stock):
    text = program_to_json(stock)
    for value, message in (("7", "kernels.accept_kernels: expected str"),
                           ('"cuda"', "kernels.accept_kernels: expected one of ops, fused")):
        bad = text.replace('"overrides":{}}', f'"accept_kernels":{value},"overrides":{{}}}}')
        assert bad != text
        with pytest.raises(IRError, match=message):
            program_from_json(bad)
