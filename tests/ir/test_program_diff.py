"""Structural diff: golden text of format_diff for typical round outcomes."""
from dataclasses import replace

from specpilot.ir import (CaptureGraphs, Change, SetBatchLayout, SetTopology, SetWeightFormat,
                          Tree, apply, diff, format_diff, record_escape_rates, replay)


def test_no_differences(stock):
    assert diff(stock, stock) == []
    assert format_diff(diff(stock, replace(stock))) == "no differences"


def test_golden_round_diff(make_stock):
    stock = make_stock(num_layers=4)
    measured = record_escape_rates(stock, "target", {"layers.3.mlp.down_proj": 500})
    tuned = replay(measured, [SetTopology(Tree((4, 2, 2, 1))),
                              SetWeightFormat("target.layers.3.mlp.down_proj", "lossless12"),
                              SetBatchLayout("ragged"), CaptureGraphs(True)])
    assert format_diff(diff(stock, tuned)) == """\
models.target.weight_formats[layers.3.mlp.down_proj]: bf16 → lossless12
models.target.lossless12_escape_ppm[layers.3.mlp.down_proj]: absent → 500
draft.topology: chain(4) → tree([4, 2, 2, 1])
verify.mask: causal → tree
commit.kv: in_place → compact
batch.layout: padded → ragged
kernels.capture_graphs: false → true
history[0]: absent → SetTopology(topology=tree([4, 2, 2, 1]))
history[1]: absent → SetWeightFormat(scope="target.layers.3.mlp.down_proj", fmt="lossless12")
history[2]: absent → SetBatchLayout(layout="ragged")
history[3]: absent → CaptureGraphs(on=True)"""
    # Read the other way round, old and new swap.
    assert format_diff(diff(tuned, stock)).splitlines()[2] == \
        "draft.topology: tree([4, 2, 2, 1]) → chain(4)"


def test_golden_deployment_diff(make_stock):
    a = make_stock(num_layers=1)
    b = make_stock(num_layers=2, gpu="NVIDIA H200")
    b = replace(b, kernels=replace(b.kernels, overrides={"target.lm_head": {"BLOCK_N": 64}}))
    assert format_diff(diff(a, b)) == """\
gpu: cpu → NVIDIA H200
models.target.num_layers: 1 → 2
models.target.layer_kinds: ["attention"] → ["attention", "attention"]
models.target.weight_formats[layers.1.mlp.down_proj]: absent → bf16
models.target.weight_formats[layers.1.mlp.gate_proj]: absent → bf16
models.target.weight_formats[layers.1.mlp.up_proj]: absent → bf16
models.target.weight_formats[layers.1.self_attn.k_proj]: absent → bf16
models.target.weight_formats[layers.1.self_attn.o_proj]: absent → bf16
models.target.weight_formats[layers.1.self_attn.q_proj]: absent → bf16
models.target.weight_formats[layers.1.self_attn.v_proj]: absent → bf16
kernels.overrides[target.lm_head][BLOCK_N]: absent → 64"""


def test_same_decoder_different_history_shows_history_only(stock):
    tree = apply(stock, SetTopology(Tree((2, 2))))
    back = apply(tree, SetTopology(stock.draft.topology))
    changes = diff(stock, back)
    assert [c.path for c in changes] == ["history[0]", "history[1]"]
    assert changes[0] == Change("history[0]", None, SetTopology(Tree((2, 2))))
