"""TuneKernel: one kernel parameter of one node in `kernels.overrides`. Golden canonical JSON and
diff, byte-identical round trips and replay, canonical order whatever the order of application,
replacement, and each structural refusal (which nodes and parameters exist is lowering's
question, tested in tests/codegen/test_lower_tune_kernel.py)."""
import json

import pytest

from specpilot.ir import (TRANSFORMATIONS, IRError, SetTopology, TransformRefused, Tree,
                          TuneKernel, apply, check, diff, format_diff, program_from_json,
                          program_id, program_to_json, replay, transformation_from_json,
                          transformation_from_obj, transformation_to_json)

TUNED = [TuneKernel("target.mlp.down_proj", "BLOCK_N", 32),
         TuneKernel("target.layers.1.mlp.down_proj", "num_warps", 8),
         TuneKernel("target.lm_head", "family", "gemv_bf16"),
         TuneKernel("target.layers.1.mlp.down_proj", "USE_DOT", True)]


def _kernels_json(program):
    text = program_to_json(program)
    return json.dumps(json.loads(text)["kernels"], sort_keys=True, separators=(",", ":"))


# ------------------------------------------------------------------------ the record

def test_registered_and_declared_output_preserving():
    assert TRANSFORMATIONS["TuneKernel"] is TuneKernel
    assert all(t.may_change_output is False for t in TUNED)


@pytest.mark.parametrize("t", TUNED, ids=str)
def test_record_json_round_trip(t):
    text = transformation_to_json(t)
    again = transformation_from_json(text)
    assert again == t and type(again.value) is type(t.value)
    assert transformation_to_json(again) == text


def test_record_golden_text():
    assert transformation_to_json(TUNED[2]) == \
        '{"name":"TuneKernel","params":{"node":"target.lm_head","param":"family",' \
        '"value":"gemv_bf16"}}\n'
    assert str(TUNED[0]) == 'TuneKernel(node="target.mlp.down_proj", param="BLOCK_N", value=32)'
    assert str(TUNED[3]) == \
        'TuneKernel(node="target.layers.1.mlp.down_proj", param="USE_DOT", value=True)'
    # JSON has one number type: an integral float is read as the int it spells
    read = transformation_from_obj({"name": "TuneKernel",
                                    "params": {"node": "a.b", "param": "BLOCK_K", "value": 64.0}})
    assert read.value == 64 and type(read.value) is int


@pytest.mark.parametrize("value,message", [
    (1.5, "TuneKernel.value: expected int, str or bool, got float 1.5"),
    (None, "TuneKernel.value: expected int, str or bool, got null"),
    ([32], "TuneKernel.value: expected int, str or bool, got list"),
])
def test_mistyped_value_is_an_ir_error(value, message):
    with pytest.raises(IRError) as info:
        TuneKernel("target.lm_head", "BLOCK_N", value)
    assert str(info.value).startswith(message)
    with pytest.raises(IRError):
        transformation_from_obj({"name": "TuneKernel",
                                 "params": {"node": "target.lm_head", "param": "BLOCK_N",
                                            "value": value}})


# ------------------------------------------------------------------------ apply: golden

def test_golden_program_json(stock):
    tuned = replay(stock, TUNED)
    assert _kernels_json(tuned) == (
        '{"backend":"torch","capture_graphs":false,"overrides":{'
        '"target.layers.1.mlp.down_proj":{"USE_DOT":true,"num_warps":8},'
        '"target.lm_head":{"family":"gemv_bf16"},'
        '"target.mlp.down_proj":{"BLOCK_N":32}}}')
    text = program_to_json(tuned)
    assert ('"history":[{"name":"TuneKernel","params":{"node":"target.mlp.down_proj",'
            '"param":"BLOCK_N","value":32}},') in text
    again = program_from_json(text)
    assert again == tuned and program_to_json(again) == text
    assert program_id(again) == program_id(tuned) != program_id(stock)
    # history replays onto the stock Program to the same decoder
    assert replay(stock, again.history) == tuned


def test_golden_diff(stock):
    tuned = replay(stock, TUNED)
    assert format_diff(diff(stock, tuned)) == """\
kernels.overrides[target.layers.1.mlp.down_proj][USE_DOT]: absent → true
kernels.overrides[target.layers.1.mlp.down_proj][num_warps]: absent → 8
kernels.overrides[target.lm_head][family]: absent → gemv_bf16
kernels.overrides[target.mlp.down_proj][BLOCK_N]: absent → 32
history[0]: absent → TuneKernel(node="target.mlp.down_proj", param="BLOCK_N", value=32)
history[1]: absent → TuneKernel(node="target.layers.1.mlp.down_proj", param="num_warps", value=8)
history[2]: absent → TuneKernel(node="target.lm_head", param="family", value="gemv_bf16")
history[3]: absent → TuneKernel(node="target.layers.1.mlp.down_proj", param="USE_DOT", value=True)"""


def test_a_new_value_replaces_the_old_one(stock):
    first = apply(stock, TuneKernel("target.lm_head", "BLOCK_K", 32))
    second = apply(first, TuneKernel("target.lm_head", "BLOCK_K", 128))
    assert second.kernels.overrides == (("target.lm_head", (("BLOCK_K", 128),)),)
    assert format_diff(diff(first, second)).splitlines()[0] == \
        "kernels.overrides[target.lm_head][BLOCK_K]: 32 → 128"
    # an int and a bool are different values, even where Python calls 1 == True
    as_bool = apply(apply(stock, TuneKernel("a.b", "FLAG", 1)), TuneKernel("a.b", "FLAG", True))
    assert as_bool.kernels.overrides == (("a.b", (("FLAG", True),)),)


def test_overrides_stay_canonical_whatever_the_order(stock):
    forward = replay(stock, TUNED)
    backward = replay(stock, list(reversed(TUNED)))
    assert forward.kernels == backward.kernels
    assert program_id(forward) == program_id(backward)
    nodes = [node for node, _ in forward.kernels.overrides]
    assert nodes == sorted(nodes)
    for _, params in forward.kernels.overrides:
        assert [name for name, _ in params] == sorted(name for name, _ in params)


def test_other_attributes_are_untouched(stock):
    base = apply(stock, SetTopology(Tree((2, 2))))
    tuned = apply(base, TuneKernel("drafter.layers.0.self_attn.attention", "BLOCK_S", 32))
    assert [c.path for c in diff(base, tuned)] == [
        "kernels.overrides[drafter.layers.0.self_attn.attention][BLOCK_S]", "history[1]"]


# ------------------------------------------------------------------------ apply: refusals

def _refused(program, t, needle):
    reason = check(program, t)
    assert reason is not None and needle in reason, reason
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert info.value.reason == reason and info.value.name == "TuneKernel"


def test_refuses_a_value_already_set(stock):
    tuned = apply(stock, TuneKernel("target.lm_head", "num_warps", 8))
    _refused(tuned, TuneKernel("target.lm_head", "num_warps", 8),
             "already num_warps=8 for target.lm_head")


def test_refuses_what_the_every_layer_key_already_sets(stock):
    tuned = apply(stock, TuneKernel("target.mlp.down_proj", "BLOCK_N", 32))
    _refused(tuned, TuneKernel("target.layers.0.mlp.down_proj", "BLOCK_N", 32),
             "target.mlp.down_proj already sets BLOCK_N=32 for every layer")
    # another value for one layer is a real change (exact names win in lowering)
    assert check(tuned, TuneKernel("target.layers.0.mlp.down_proj", "BLOCK_N", 64)) is None


@pytest.mark.parametrize("node", ["", "lm_head", "target.", "target lm_head", "target.lm-head",
                                  ".target.lm_head", "target.layers.0.mlp.down_proj\n"])
def test_refuses_a_malformed_node_name(stock, node):
    _refused(stock, TuneKernel(node, "BLOCK_N", 32), "node must be a dotted kernel node name")


@pytest.mark.parametrize("param", ["", "BLOCK N", "9BLOCK", "BLOCK-N", "block_n;x"])
def test_refuses_a_parameter_that_is_not_an_identifier(stock, param):
    _refused(stock, TuneKernel("target.lm_head", param, 32), "param must be a kernel parameter")


@pytest.mark.parametrize("value", ["", "gemv bf16", "x\"); import os", "1abc"])
def test_refuses_a_string_value_that_is_not_an_identifier(stock, value):
    _refused(stock, TuneKernel("target.lm_head", "family", value),
             "a string value must be an identifier")
