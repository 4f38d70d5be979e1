"""Transformation records (JSON, registry, declarations) and apply/check: each rule's accept
path and each of its refusals."""
from dataclasses import replace

import pytest

from specpilot.ir import (LOSSLESS12_MAX_ESCAPE_PPM, TRANSFORMATIONS, CaptureGraphs, Chain,
                          IllFormed, IRError, SetBackend, SetBatchLayout, SetDraftLength,
                          SetMaxBatchSize, SetTopology, SetWeightFormat, TransformRefused, Tree,
                          apply, check, program_id, record_escape_rates, replay,
                          transformation_from_json, transformation_to_json, verify)

ALL_RECORDS = [SetTopology(Tree((4, 2, 2, 1))), SetTopology(Chain(6)), SetDraftLength(3),
               SetWeightFormat("target.mlp.*", "lossless12"), SetBatchLayout("ragged"),
               SetMaxBatchSize(16), SetBackend("generated"), CaptureGraphs(True),
               CaptureGraphs(False)]


# ---------------------------------------------------------------------------- the records

@pytest.mark.parametrize("t", ALL_RECORDS, ids=str)
def test_record_json_round_trip(t):
    text = transformation_to_json(t)
    assert text.endswith("\n") and " " not in text.strip()
    again = transformation_from_json(text)
    assert again == t and type(again) is type(t)
    assert transformation_to_json(again) == text


def test_registry_names_every_record():
    assert set(TRANSFORMATIONS) == {"SetTopology", "SetDraftLength", "SetWeightFormat",
                                    "SetBatchLayout", "SetMaxBatchSize", "SetBackend",
                                    "CaptureGraphs", "SetDraftLengthPolicy", "SetRefill",
                                    "SetVerifyPrune", "TuneKernel", "SetDrafter",
                                    "SetFastPath", "SetDrafterKernels", "SetAttentionKernels",
                                    "SetLengthEstimator", "SetAcceptKernels", "SetLengthDrain"}
    for name, cls in TRANSFORMATIONS.items():
        assert cls.name == name


def test_record_text():
    assert str(SetWeightFormat("target.mlp.*", "lossless12")) == \
        'SetWeightFormat(scope="target.mlp.*", fmt="lossless12")'
    assert str(SetTopology(Tree((4, 2)))) == "SetTopology(topology=tree([4, 2]))"
    assert str(CaptureGraphs(True)) == "CaptureGraphs(on=True)"


@pytest.mark.parametrize("make,message", [
    (lambda: SetDraftLength("4"), "SetDraftLength.k: expected int, got str '4'"),
    (lambda: SetDraftLength(True), "SetDraftLength.k: expected int, got bool True"),
    (lambda: CaptureGraphs(1), "CaptureGraphs.on: expected bool, got int 1"),
    (lambda: SetWeightFormat("target.*", None), "SetWeightFormat.fmt: expected str, got null"),
    (lambda: SetTopology([4, 2]), "SetTopology.topology: expected Chain, Tree, SparseTree or DynamicTree"),
])
def test_mistyped_record_is_an_ir_error(make, message):
    with pytest.raises(IRError) as info:
        make()
    assert str(info.value).startswith(message)


def test_records_are_frozen():
    t = SetDraftLength(3)
    with pytest.raises(AttributeError):
        t.k = 5


def test_may_change_output_declarations():
    """Every transformation here is output-preserving: the dense formats are the checkpoint's
    own values and lossless12 restores every bit."""
    for t in ALL_RECORDS + [SetWeightFormat("target.*", "bf16")]:
        assert t.may_change_output is False, t
    assert SetWeightFormat("target.*", "int4").may_change_output is True  # unknown: assume so


# ---------------------------------------------------------------------------- apply / check

def _refusal(program, t):
    reason = check(program, t)
    assert reason is not None, f"{t} should be refused"
    with pytest.raises(TransformRefused) as info:
        apply(program, t)
    assert info.value.reason == reason and info.value.name == t.name
    assert str(info.value) == f"transformation {t.name} refused: {reason}"
    return reason


def _accepted(program, t):
    assert check(program, t) is None
    new = apply(program, t)
    assert new.history == program.history + (t,)
    assert program_id(new) != program_id(program)
    verify(new)
    return new


def test_set_topology_to_tree_switches_mask_and_commit(stock):
    new = _accepted(stock, SetTopology(Tree((4, 2, 2, 1))))
    assert new.draft.topology == Tree((4, 2, 2, 1))
    assert (new.verify.mask, new.commit.kv) == ("tree", "compact")
    back = _accepted(new, SetTopology(Chain(5)))
    assert back.draft.topology == Chain(5)
    assert (back.verify.mask, back.commit.kv) == ("causal", "in_place")
    assert stock.draft.topology == Chain(4)  # the input is untouched


def test_set_topology_refusals(stock):
    assert _refusal(stock, SetTopology(Chain(4))) == "already chain(4)"
    tree = apply(stock, SetTopology(Tree((3, 1))))
    assert _refusal(tree, SetTopology(Tree((3, 1)))) == "already tree([3, 1])"
    assert _refusal(stock, SetTopology(Tree((1, 1, 1)))) == \
        "tree([1, 1, 1]) has no branches; it is chain(3), use that"


def test_set_draft_length(stock):
    new = _accepted(stock, SetDraftLength(7))
    assert new.draft.topology == Chain(7)
    assert (new.verify, new.commit) == (stock.verify, stock.commit)


def test_set_draft_length_refusals(stock):
    assert _refusal(stock, SetDraftLength(4)) == "already chain(4)"
    assert _refusal(stock, SetDraftLength(0)) == "draft length must be in 1..64, got 0"
    assert _refusal(stock, SetDraftLength(65)) == "draft length must be in 1..64, got 65"
    tree = apply(stock, SetTopology(Tree((2, 2))))
    assert _refusal(tree, SetDraftLength(3)) == \
        "the draft is tree([2, 2]), whose length is its depth; change it with SetTopology"


def _measured(program, role="target", ppm=100):
    model = getattr(program.models, role)
    return record_escape_rates(program, role, {name: ppm for name in model.linears})


def test_set_weight_format_short_glob_matches_every_layer(make_stock):
    p = _measured(make_stock(num_layers=3))
    new = _accepted(p, SetWeightFormat("target.mlp.*", "lossless12"))
    changed = {n for n, f in new.models.target.weight_formats if f == "lossless12"}
    assert changed == {f"layers.{i}.mlp.{n}_proj" for i in range(3) for n in ("gate", "up", "down")}
    assert new.models.drafter == p.models.drafter


@pytest.mark.parametrize("scope,expected", [
    ("target.layers.1.*", {f"layers.1.{k}" for k in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}),
    ("target.self_attn.[qk]_proj", {f"layers.{i}.self_attn.{n}_proj" for i in range(2)
                                    for n in ("q", "k")}),
    ("target.lm_head", {"lm_head"}),
    ("target.*", None),  # every linear
    ("target.*down_proj", {"layers.0.mlp.down_proj", "layers.1.mlp.down_proj"}),
])
def test_set_weight_format_scopes(stock, scope, expected):
    p = _measured(stock)
    new = apply(p, SetWeightFormat(scope, "lossless12"))
    changed = {n for n, f in new.models.target.weight_formats if f == "lossless12"}
    assert changed == (expected if expected is not None else set(p.models.target.linears))


def test_set_weight_format_only_changes_what_differs(stock):
    p = _measured(stock)
    once = apply(p, SetWeightFormat("target.mlp.down_proj", "lossless12"))
    twice = _accepted(once, SetWeightFormat("target.mlp.*", "lossless12"))
    assert sum(f == "lossless12" for _, f in twice.models.target.weight_formats) == 6
    back = _accepted(twice, SetWeightFormat("target.*", "bf16"))
    assert back.models.target.weight_formats == stock.models.target.weight_formats


def test_set_weight_format_on_drafter(stock):
    p = _measured(stock, "drafter", ppm=LOSSLESS12_MAX_ESCAPE_PPM)  # the limit itself is allowed
    new = _accepted(p, SetWeightFormat("drafter.lm_head", "lossless12"))
    assert new.models.drafter.format_of("lm_head") == "lossless12"
    assert new.models.target == p.models.target


def test_set_weight_format_refusals(stock, make_stock):
    p = _measured(stock)
    assert _refusal(p, SetWeightFormat("mlp.*", "lossless12")) == \
        "scope must be '<target|drafter>.<glob>' (e.g. 'target.mlp.*'), got 'mlp.*'"
    assert _refusal(p, SetWeightFormat("target.", "lossless12")).startswith("scope must be")
    assert _refusal(p, SetWeightFormat("target.*", "int4")) == \
        "unknown weight format 'int4' (known: bf16, fp32, lossless12)"
    assert _refusal(p, SetWeightFormat("target.layers.7.*", "lossless12")).startswith(
        "scope 'target.layers.7.*' matches no linear of the target")
    assert _refusal(p, SetWeightFormat("target.mlp.*", "bf16")) == \
        "already bf16: all 6 linears matched by 'target.mlp.*'"
    assert _refusal(p, SetWeightFormat("target.mlp.*", "fp32")) == \
        ("fp32 is a dense float32 format but the target computes in bfloat16 "
         "(a dense format must match the compute dtype)")
    fp32 = _measured(make_stock(dtype="float32"))
    assert _refusal(fp32, SetWeightFormat("target.lm_head", "lossless12")) == \
        "lossless12 packs bfloat16 weights but the target's dtype is float32"
    assert _refusal(fp32, SetWeightFormat("drafter.lm_head", "bf16")).startswith(
        "bf16 is a dense bfloat16 format but the drafter computes in float32")


def test_lossless12_needs_a_measured_escape_rate_below_the_limit(stock):
    unmeasured = record_escape_rates(stock, "target", {"layers.0.mlp.down_proj": 10})
    assert _refusal(unmeasured, SetWeightFormat("target.mlp.down_proj", "lossless12")) == \
        ("the lossless12 escape rate of target.layers.1.mlp.down_proj is not measured "
         "(1 of 2 linears unmeasured); without it the byte saving is unknown")
    high = record_escape_rates(stock, "target", {"layers.0.mlp.down_proj": 10,
                                                 "layers.1.mlp.down_proj": 20_001})
    assert _refusal(high, SetWeightFormat("target.mlp.down_proj", "lossless12")) == \
        ("target.layers.1.mlp.down_proj escapes 20001 ppm of its weights, above the 20000 ppm "
         "limit beyond which the patch list eats the 25% byte saving")
    # the limit binds only the linears being changed
    assert check(high, SetWeightFormat("target.layers.0.mlp.down_proj", "lossless12")) is None


def test_batch_layout(stock):
    new = _accepted(stock, SetBatchLayout("ragged"))
    assert new.batch.layout == "ragged"
    assert _refusal(new, SetBatchLayout("ragged")) == "already ragged"
    assert _refusal(stock, SetBatchLayout("packed")) == \
        "unknown batch layout 'packed' (known: padded, ragged)"


def test_max_batch_size(stock):
    new = _accepted(stock, SetMaxBatchSize(32))
    assert new.batch.max_batch_size == 32
    assert _refusal(stock, SetMaxBatchSize(1)) == "already max batch size 1"
    assert _refusal(stock, SetMaxBatchSize(0)) == "max batch size must be in 1..256, got 0"
    assert _refusal(stock, SetMaxBatchSize(257)) == "max batch size must be in 1..256, got 257"


def test_backend(stock):
    new = _accepted(stock, SetBackend("generated"))
    assert new.kernels.backend == "generated"
    assert _refusal(stock, SetBackend("torch")) == "already backend torch"
    assert _refusal(stock, SetBackend("cuda")) == "unknown backend 'cuda' (known: torch, generated)"


def test_capture_graphs(stock):
    on = _accepted(stock, CaptureGraphs(True))
    assert on.kernels.capture_graphs is True
    off = _accepted(on, CaptureGraphs(False))
    assert off.kernels.capture_graphs is False and program_id(off) == program_id(stock)
    assert _refusal(stock, CaptureGraphs(False)) == "graph capture already off"
    assert _refusal(on, CaptureGraphs(True)) == "graph capture already on"


def test_apply_refuses_an_ill_formed_input(stock):
    bad = replace(stock, verify=replace(stock.verify, mask="tree"))
    with pytest.raises(IllFormed, match="verify.mask"):
        apply(bad, SetBatchLayout("ragged"))
    with pytest.raises(IllFormed):
        check(bad, SetBatchLayout("ragged"))


def test_apply_rejects_a_non_record(stock):
    with pytest.raises(IRError, match="not a registered Transformation"):
        apply(stock, {"name": "SetBackend", "params": {"backend": "generated"}})


def test_replaying_history_rebuilds_the_program(stock):
    p = _measured(stock)
    steps = [SetTopology(Tree((3, 2))), SetWeightFormat("target.mlp.*", "lossless12"),
             SetBatchLayout("ragged"), SetBackend("generated"), CaptureGraphs(True),
             SetTopology(Chain(2)), SetDraftLength(6)]
    final = replay(p, steps)
    assert final.history == tuple(steps)
    assert replay(p, final.history) == final
    assert final.draft.topology == Chain(6) and final.verify.mask == "causal"
