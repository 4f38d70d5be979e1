"""Lowering a Program to a KernelPlan: every compute node, kernels chosen from shapes and
formats, identical specs shared, canonical JSON, and golden snapshots of a plan and a plan diff.

After an intended change to lowering, regenerate the snapshots with
    SPECPILOT_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_lower.py
and review the diff of tests/codegen/golden/.
"""
import json
import os
from pathlib import Path


from specpilot.codegen.kernel_spec import KernelSpec
from specpilot.codegen.lower import lower_program
from specpilot.codegen.plan import format_plan_diff, plan_from_json, plan_to_json
from specpilot.ir import (Deployment, ModelSpec, SetDraftLength, SetTopology, SetWeightFormat,
                          Tree, apply, canonical_json, record_escape_rates, stock_program)

GOLDEN = Path(__file__).parent / "golden"


def model_spec(role, hidden, layers, dtype="bfloat16", heads=4, kv_heads=2, head_dim=16,
               qkv_bias=False, qk_norm=False, vocab=97):
    return ModelSpec(role=role, family="qwen3" if qk_norm else "llama", checkpoint=f"/models/{role}",
                     dtype=dtype, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                     num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     qkv_bias=qkv_bias, qk_norm=qk_norm, tie_embeddings=False,
                     layer_kinds=("attention",) * layers, weight_formats=())


def tiny_program(dtype="bfloat16", **target_kw):
    """Stock Program of a 2-layer target (hidden 64) and a 1-layer drafter (hidden 32)."""
    target = model_spec("target", 64, 2, dtype, **target_kw)
    drafter = model_spec("drafter", 32, 1, dtype, heads=2, kv_heads=1)
    return stock_program(Deployment(target, drafter, "cpu", "test"))


def with_measured_escapes(program, ppm=100):
    for role in ("target", "drafter"):
        linears = getattr(program.models, role).linears
        program = record_escape_rates(program, role, {name: ppm for name in linears})
    return program


def check_golden(name, text):
    path = GOLDEN / name
    if os.environ.get("SPECPILOT_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path.name}; regenerate with SPECPILOT_UPDATE_GOLDEN=1"
    return path.read_text(encoding="utf-8")


def test_plan_json_matches_golden():
    plan = lower_program(tiny_program())
    # The snapshot is the canonical JSON pretty-printed for review; both must be the same data.
    pretty = json.dumps(json.loads(plan_to_json(plan)), indent=1, sort_keys=True) + "\n"
    golden = check_golden("plan_tiny.json.golden", pretty)
    assert canonical_json(json.loads(golden)) == plan_to_json(plan)


def test_plan_diff_after_set_weight_format_matches_golden():
    before = with_measured_escapes(tiny_program())
    after = apply(before, SetWeightFormat("target.mlp.*", "lossless12"))
    text = format_plan_diff(lower_program(before), lower_program(after)) + "\n"
    assert check_golden("plan_diff_target_mlp_lossless12.txt.golden", text) == text


def test_every_compute_node_is_lowered_in_execution_order():
    plan = lower_program(tiny_program())
    layer = ["input_norm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
             "self_attn.rope", "self_attn.attention", "self_attn.o_proj", "post_attention_norm",
             "mlp.gate_up", "mlp.down_proj"]
    expected = ([f"target.layers.{i}.{part}" for i in range(2) for part in layer]
                + ["target.final_norm", "target.lm_head"]
                + [f"drafter.layers.0.{part}" for part in layer]
                + ["drafter.final_norm", "drafter.lm_head", "step.greedy_accept"])
    assert [n.name for n in plan.nodes] == expected
    fused = plan.node("target.layers.1.mlp.gate_up")
    assert fused.linears == ("layers.1.mlp.gate_proj", "layers.1.mlp.up_proj")
    assert plan.node("target.lm_head").linears == ("lm_head",)


def test_qk_norm_bias_and_tree_add_their_nodes():
    program = tiny_program(qkv_bias=True, qk_norm=True)
    program = apply(program, SetTopology(Tree((2, 2))))
    plan = lower_program(program)
    assert plan.spec_of("target.layers.0.self_attn.q_norm").get("BLOCK_H") == 16  # head_dim 16
    assert plan.spec_of("target.layers.0.input_norm").get("BLOCK_H") == 64        # hidden 64
    assert plan.spec_of("target.layers.0.self_attn.k_proj").get("HAS_BIAS") is True
    assert plan.spec_of("target.layers.0.self_attn.o_proj").get("HAS_BIAS") is False
    assert plan.node("target.layers.0.self_attn.attention").attr("mask") == "tree"
    # Tree commit compacts the accepted path: the step needs kv_compact over the target's rows.
    compact = plan.node("step.kv_compact")
    assert compact.attr("row") == 2 * 16 and compact.attr("layers") == 2
    assert plan.nodes[-1].name == "step.kv_compact"
    assert plan.node("step.greedy_accept").attr("draft_nodes") == 6


def test_chain_has_no_kv_compaction():
    assert not lower_program(tiny_program()).has_node("step.kv_compact")


def test_identical_specs_are_one_kernel():
    plan = lower_program(tiny_program())
    # Both target layers have the same shapes: each of their nodes shares the other's kernel.
    for node in plan.nodes_of("target"):
        if ".layers.0." in node.name:
            twin = plan.node(node.name.replace(".layers.0.", ".layers.1."))
            assert twin.kernel == node.kernel
    assert len(plan.kernels) == len({n.kernel for n in plan.nodes}) < len(plan.nodes)
    # Kernel keys are content addresses of the specs, so they differ exactly when specs differ.
    specs = dict(plan.kernels)
    assert len(set(specs.values())) == len(specs)


def test_kernel_parameters_follow_shapes_dtype_and_format():
    """Hand-checked choices for the tiny pair under chain(4) and batch 1."""
    plan = lower_program(tiny_program(dtype="float32"))
    q = plan.spec_of("target.layers.0.self_attn.q_proj")
    # Verification multiplies 5 rows (root + 4 drafts): an 8-row multiply-add tile, fp32.
    assert q == KernelSpec.create("linear", DTYPE="fp32", BLOCK_M=8, BLOCK_N=64, BLOCK_K=64,
                                  USE_DOT=False)
    # The drafter drafts one token at a time.
    assert plan.spec_of("drafter.layers.0.self_attn.q_proj").get("BLOCK_M") == 1
    assert plan.spec_of("target.lm_head").get("BLOCK_N") == 64  # vocab 97 > 64: capped
    attn = plan.spec_of("target.layers.0.self_attn.attention")
    assert (attn.get("DTYPE"), attn.get("HEAD_DIM"), attn.get("BLOCK_R")) == ("fp32", 16, 16)
    assert plan.spec_of("target.layers.0.self_attn.rope").get("COS_SIN") == "table"
    assert plan.spec_of("step.greedy_accept").get("BLOCK_V") == 128  # next power of two >= 97
    # A longer chain verifies more rows at once: from 16 rows on, tensor-core tiles.
    long = lower_program(apply(tiny_program(), SetDraftLength(15)))
    assert long.spec_of("target.layers.0.mlp.gate_up").get("USE_DOT") is True


def test_lossless12_linears_get_the_fused_decode_kernel_and_no_gate_up_fusion():
    program = apply(with_measured_escapes(tiny_program()), SetWeightFormat("drafter.*", "lossless12"))
    plan = lower_program(program)
    drafter = plan.nodes_of("drafter")
    linears = [n for n in drafter if n.op == "linear"]
    assert {plan.spec(n.kernel).family for n in linears} == {"linear_lossless12"}
    assert {n.attr("format") for n in linears} == {"lossless12"}
    # No fused gate/up kernel reads lossless12, so both projections stay separate nodes.
    assert plan.has_node("drafter.layers.0.mlp.gate_proj") and plan.has_node("drafter.layers.0.mlp.up_proj")
    assert not plan.has_node("drafter.layers.0.mlp.gate_up")
    assert plan.spec_of("drafter.lm_head").get("BASE") == "row"
    # The target is untouched.
    assert plan.spec_of("target.layers.0.mlp.gate_up").family == "gate_up_silu"


def test_plan_json_round_trips_and_lowering_is_deterministic():
    program = tiny_program(qk_norm=True)
    plan = lower_program(program)
    assert plan_from_json(plan_to_json(plan)) == plan
    assert plan_to_json(lower_program(program)) == plan_to_json(plan)
    # History is provenance, not behaviour: the same decoder reached another way lowers the same.
    there_and_back = apply(apply(program, SetDraftLength(2)), SetDraftLength(4))
    assert plan_to_json(lower_program(there_and_back)) == plan_to_json(plan)
