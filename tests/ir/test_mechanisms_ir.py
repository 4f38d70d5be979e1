"""IR of the verification structures and batching mechanisms: dynamic and sparse (shaped) trees,
two-level verification (`verify.prune`), adaptive draft length with a token budget, continuous
refill. Golden canonical JSON and diffs, byte-identical round trips, stock Programs unchanged,
and each rule's refusals."""
import json
from dataclasses import replace

import pytest

from specpilot.ir import (Chain, DynamicTree, IllFormed, IRError, LayerSkipPrune,
                          LowPrecisionPrune, SetBatchLayout, SetDraftLengthPolicy,
                          SetMaxBatchSize, SetRefill, SetTopology, SetVerifyPrune, SparseTree,
                          Tree, apply, check, dataflow_graph, diff, format_diff, program_from_json,
                          program_id, program_to_json, replay, transformation_from_json,
                          transformation_to_json, verify)

SPARSE = SparseTree(((0,), (1,), (0, 0), (0, 0, 0)))
NEW_RECORDS = [SetTopology(DynamicTree(8, 4, 3)), SetTopology(SPARSE),
               SetVerifyPrune(LayerSkipPrune((0,), 2)),
               SetVerifyPrune(LowPrecisionPrune("bfloat16", 1)),
               SetVerifyPrune(None), SetDraftLengthPolicy("per_request_adaptive", 16),
               SetDraftLengthPolicy("fixed", 0), SetRefill("continuous")]


def _section(program, name):
    return json.loads(program_to_json(program))[name]


# ------------------------------------------------------------------------ values and JSON

def test_stock_json_has_none_of_the_new_fields(stock):
    text = program_to_json(stock)
    assert '"verify":{"acceptance":"greedy","mask":"causal"}' in text
    assert '"batch":{"draft_length_policy":"fixed","layout":"padded","max_batch_size":1}' in text
    assert stock.verify.prune is None and stock.batch.refill == "drain"
    assert stock.batch.token_budget is None


def test_golden_dynamic_tree_json(stock):
    p = apply(stock, SetTopology(DynamicTree(8, 4, 3)))
    assert '"topology":{"budget":8,"depth":4,"kind":"dynamic_tree","width":3}' in program_to_json(p)
    assert (p.verify.mask, p.commit.kv) == ("tree", "compact")
    assert str(p.draft.topology) == "dynamic_tree(budget=8, depth=4, width=3)"


def test_golden_sparse_tree_json_and_one_spelling(stock):
    p = apply(stock, SetTopology(SparseTree(((0, 0, 0), (0, 0), (1,), (0,)))))  # any order
    assert p.draft.topology == SPARSE
    assert '"topology":{"kind":"sparse_tree","paths":[[0],[1],[0,0],[0,0,0]]}' in program_to_json(p)
    assert str(SPARSE) == "sparse_tree([[0], [1], [0, 0], [0, 0, 0]])"
    assert SPARSE.shape().parents == (-1, -1, 0, 2) and SPARSE.level_widths() == (2, 1, 1)


def test_golden_prune_json(stock, make_stock):
    p = apply(apply(stock, SetTopology(Tree((2, 2)))), SetVerifyPrune(LayerSkipPrune((0,), 2)))
    assert _section(p, "verify") == {"acceptance": "greedy", "mask": "tree",
                                     "prune": {"keep_layers": [0], "kind": "layer_skip",
                                               "top_k": 2}}
    fp32 = apply(make_stock(dtype="float32"), SetVerifyPrune(LowPrecisionPrune("bfloat16", 1)))
    assert '"prune":{"dtype":"bfloat16","kind":"low_precision","top_k":1}' in program_to_json(fp32)


def test_golden_batch_json(stock):
    p = replay(stock, [SetBatchLayout("ragged"), SetMaxBatchSize(4),
                       SetDraftLengthPolicy("per_request_adaptive", 16), SetRefill("continuous")])
    assert '"batch":{"draft_length_policy":"per_request_adaptive","layout":"ragged",' \
           '"max_batch_size":4,"refill":"continuous","token_budget":16}' in program_to_json(p)


@pytest.mark.parametrize("records", [
    [SetTopology(DynamicTree(8, 4, 3)), SetVerifyPrune(LayerSkipPrune((1,), 3))],
    [SetTopology(SPARSE), SetMaxBatchSize(8), SetRefill("continuous"), SetBatchLayout("ragged")],
    [SetMaxBatchSize(4), SetDraftLengthPolicy("per_request_adaptive", 12)],
], ids=["dynamic+prune", "sparse+continuous", "adaptive"])
def test_round_trip_is_byte_identical(stock, records):
    p = replay(stock, records)
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p and program_to_json(again) == text
    assert program_id(again) == program_id(p) != program_id(stock)


@pytest.mark.parametrize("t", NEW_RECORDS, ids=str)
def test_record_json_round_trip(t):
    text = transformation_to_json(t)
    again = transformation_from_json(text)
    assert again == t and type(again) is type(t) and transformation_to_json(again) == text
    assert t.may_change_output is False


def test_record_text():
    assert str(SetVerifyPrune(LayerSkipPrune((0, 2), 1))) == \
        "SetVerifyPrune(prune=layer_skip(keep_layers=[0, 2], top_k=1))"
    assert str(SetDraftLengthPolicy("per_request_adaptive", 16)) == \
        'SetDraftLengthPolicy(policy="per_request_adaptive", token_budget=16)'
    assert transformation_to_json(SetVerifyPrune(None)) == \
        '{"name":"SetVerifyPrune","params":{"prune":null}}\n'


# ------------------------------------------------------------------------ diffs

def test_golden_mechanisms_diff(stock):
    tuned = replay(stock, [SetTopology(DynamicTree(8, 4, 3)),
                           SetVerifyPrune(LayerSkipPrune((0,), 2)), SetBatchLayout("ragged"),
                           SetMaxBatchSize(4), SetRefill("continuous")])
    assert format_diff(diff(stock, tuned)) == """\
draft.topology: chain(4) → dynamic_tree(budget=8, depth=4, width=3)
verify.mask: causal → tree
verify.prune: absent → layer_skip(keep_layers=[0], top_k=2)
commit.kv: in_place → compact
batch.layout: padded → ragged
batch.max_batch_size: 1 → 4
batch.refill: drain → continuous
history[0]: absent → SetTopology(topology=dynamic_tree(budget=8, depth=4, width=3))
history[1]: absent → SetVerifyPrune(prune=layer_skip(keep_layers=[0], top_k=2))
history[2]: absent → SetBatchLayout(layout="ragged")
history[3]: absent → SetMaxBatchSize(max_batch_size=4)
history[4]: absent → SetRefill(refill="continuous")"""


def test_golden_adaptive_and_shaped_diff(stock):
    adaptive = replay(stock, [SetMaxBatchSize(4), SetDraftLengthPolicy("per_request_adaptive", 16)])
    assert format_diff(diff(stock, adaptive)).splitlines()[:3] == [
        "batch.max_batch_size: 1 → 4",
        "batch.draft_length_policy: fixed → per_request_adaptive",
        "batch.token_budget: absent → 16"]
    shaped = apply(stock, SetTopology(SPARSE))
    pruned = apply(shaped, SetVerifyPrune(LayerSkipPrune((0,), 1)))
    repruned = apply(pruned, SetVerifyPrune(LayerSkipPrune((1,), 1)))
    assert format_diff(diff(pruned, repruned)).splitlines() == [
        "verify.prune.keep_layers: [0] → [1]",
        "history[2]: absent → SetVerifyPrune(prune=layer_skip(keep_layers=[1], top_k=1))"]
    assert format_diff(diff(stock, shaped)).splitlines()[0] == \
        "draft.topology: chain(4) → sparse_tree([[0], [1], [0, 0], [0, 0, 0]])"


def test_dataflow_graph_of_a_dynamic_tree(stock):
    g = dataflow_graph(apply(stock, SetTopology(DynamicTree(8, 4, 3))))
    assert g.graph["verify_tokens"] == 9 and g.graph["draft_tokens"] == 8
    assert [g.nodes[f"draft.forward[{d}]"]["tokens"] for d in range(1, 5)] == [1, 3, 3, 3]
    assert g.nodes["draft.build"]["structure"] == "dynamic_tree"


# ------------------------------------------------------------------------ refusals and checks

def _refused(program, t, reason_part):
    reason = check(program, t)
    assert reason is not None and reason_part in reason, reason


def test_refusals(stock, make_stock):
    _refused(stock, SetTopology(SparseTree(((0,), (1,), (0, 0), (1, 0)))),
             "is tree([2, 1]), use that")
    _refused(stock, SetTopology(SparseTree(((0,), (0, 0)))), "is chain(2), use that")
    _refused(stock, SetDraftLengthPolicy("per_request_adaptive", 0), "below the max batch size")
    _refused(stock, SetDraftLengthPolicy("fixed", 8), "takes no token budget")
    _refused(stock, SetDraftLengthPolicy("fixed", 0), "already fixed")
    _refused(stock, SetDraftLengthPolicy("ema", 4), "unknown draft length policy")
    tree = apply(stock, SetTopology(Tree((2, 2))))
    _refused(tree, SetDraftLengthPolicy("per_request_adaptive", 8), "adapts a chain's length")
    adaptive = apply(stock, SetDraftLengthPolicy("per_request_adaptive", 4))
    _refused(adaptive, SetTopology(DynamicTree(8, 4, 3)), "is not a chain")
    _refused(adaptive, SetMaxBatchSize(8), "batch.token_budget")   # budget below the batch
    assert apply(adaptive, SetTopology(Chain(6))).batch.token_budget == 4
    _refused(stock, SetRefill("eager"), "unknown refill policy")
    _refused(stock, SetRefill("drain"), "already drain refill")
    _refused(stock, SetVerifyPrune(None), "already unpruned")
    _refused(stock, SetVerifyPrune(LayerSkipPrune((2,), 1)), "layer 2 does not exist")
    _refused(stock, SetVerifyPrune(LayerSkipPrune((0, 1), 1)), "keeps every layer")
    _refused(stock, SetVerifyPrune(LowPrecisionPrune("bfloat16", 1)),   # bf16 target already
             "not a lower precision than the target's bfloat16")
    pruned = apply(stock, SetVerifyPrune(LayerSkipPrune((1,), 1)))
    assert apply(pruned, SetVerifyPrune(None)).verify.prune is None


@pytest.mark.parametrize("make,message", [
    (lambda: DynamicTree(20, 4, 3), "dynamic tree budget must be in width..depth*width (3..12)"),
    (lambda: DynamicTree(2, 4, 3), "dynamic tree budget must be in width..depth*width"),
    (lambda: DynamicTree(8, 0, 3), "dynamic tree depth must be an integer >= 1"),
    (lambda: SparseTree(((0,), (0, 1))), "sparse tree node [0, 1] has no elder sibling [0, 0]"),
    (lambda: SparseTree(((1,),)), "sparse tree node [1] has no elder sibling [0]"),
    (lambda: SparseTree(((0,), (1, 0))), "sparse tree node [1, 0] has no parent [1]"),
    (lambda: SparseTree(((0,), (0,))), "sparse tree paths list a node twice"),
    (lambda: LayerSkipPrune((1, 0), 1), "layer_skip keep_layers must be strictly increasing"),
    (lambda: LayerSkipPrune((0,), 0), "prune top_k must be an integer >= 1"),
    (lambda: SetVerifyPrune("layer_skip"), "SetVerifyPrune.prune: expected LayerSkipPrune"),
])
def test_malformed_values_are_ir_errors(make, message):
    with pytest.raises(IRError) as info:
        make()
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("edit,message", [
    (lambda o: o["verify"].update(prune={"kind": "skip", "top_k": 1}),
     "verify.prune.kind: expected one of layer_skip, low_precision, got 'skip'"),
    (lambda o: o["verify"].update(prune={"kind": "layer_skip", "keep_layers": [0]}),
     "verify.prune.top_k: missing field"),
    (lambda o: o["batch"].update(refill=3), "batch.refill: expected str, got int 3"),
    (lambda o: o["batch"].update(token_budget="8"), "batch.token_budget: expected int"),
    (lambda o: o["batch"].update(colour="red"), "batch.colour: unknown field"),
    (lambda o: o["draft"].update(topology={"kind": "dynamic_tree", "budget": 4, "depth": 2}),
     "draft.topology.width: missing field"),
    (lambda o: o["draft"].update(topology={"kind": "sparse_tree", "paths": [[0], [0, "1"]]}),
     "draft.topology.paths[1][1]: expected int"),
])
def test_malformed_json_names_the_field(stock, edit, message):
    obj = json.loads(program_to_json(apply(stock, SetTopology(Tree((2, 2))))))
    edit(obj)
    with pytest.raises(IRError) as info:
        program_from_json(json.dumps(obj))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("breaker,message", [
    (lambda p: replace(p, batch=replace(p.batch, refill="eager")),
     "batch.refill: expected one of drain, continuous, got 'eager'"),
    (lambda p: replace(p, batch=replace(p.batch, token_budget=8)),
     "batch.token_budget: only per_request_adaptive takes a token budget"),
    (lambda p: replace(p, batch=replace(p.batch, draft_length_policy="per_request_adaptive")),
     "batch.token_budget: expected an int >= max_batch_size (1"),
    (lambda p: replace(p, verify=replace(p.verify, prune="layer_skip")),
     "verify.prune: expected None, LayerSkipPrune or LowPrecisionPrune"),
    (lambda p: replace(p, verify=replace(p.verify, prune=LayerSkipPrune((5,), 1))),
     "verify.prune.keep_layers: layer 5 does not exist (the target has 2 layers)"),
    (lambda p: replace(p, draft=replace(p.draft, topology=DynamicTree(4, 2, 2))),
     "verify.mask: dynamic_tree(budget=4, depth=2, width=2) needs the tree mask"),
])
def test_ill_formed_programs(stock, breaker, message):
    with pytest.raises(IllFormed) as info:
        verify(breaker(stock))
    assert str(info.value).startswith(message), str(info.value)
