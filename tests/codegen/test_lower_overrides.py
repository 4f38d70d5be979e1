"""Kernel overrides in lowering (by node, for every layer, family switches) and the errors of bad
ones; kernels of a plan that fail to build are reported with the nodes that need them."""
import importlib.resources
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from specpilot.codegen.build import try_build_kernel
from specpilot.codegen.lower import LoweringError, lower_program
from specpilot.codegen.plan import PlanBuildError, build_plan, diff_plans
from specpilot.ir import SetWeightFormat, apply
from specpilot.ir.errors import SpecPilotError

from test_lower import tiny_program, with_measured_escapes


def with_overrides(program, overrides):
    return replace(program, kernels=replace(program.kernels, overrides=overrides))


def changed_nodes(a, b):
    return [line.split(":", 1)[0] for line in diff_plans(lower_program(a), lower_program(b))]


def test_exact_node_override_changes_only_that_node():
    base = tiny_program()
    tuned = with_overrides(base, {"target.layers.1.mlp.down_proj": {"BLOCK_N": 32, "SPLIT_K": 2}})
    assert changed_nodes(base, tuned) == ["target.layers.1.mlp.down_proj"]
    spec = lower_program(tuned).spec_of("target.layers.1.mlp.down_proj")
    assert (spec.get("BLOCK_N"), spec.get("SPLIT_K")) == (32, 2)


def test_layerless_override_changes_every_layer_and_exact_names_win():
    base = tiny_program()
    tuned = with_overrides(base, {"target.self_attn.attention": {"BLOCK_S": 32, "num_warps": 2},
                                  "target.layers.0.self_attn.attention": {"BLOCK_S": 16}})
    assert changed_nodes(base, tuned) == ["target.layers.0.self_attn.attention",
                                          "target.layers.1.self_attn.attention"]
    plan = lower_program(tuned)
    first = plan.spec_of("target.layers.0.self_attn.attention")
    second = plan.spec_of("target.layers.1.self_attn.attention")
    assert (first.get("BLOCK_S"), first.get("num_warps")) == (16, 2)  # merged: exact on top
    assert (second.get("BLOCK_S"), second.get("num_warps")) == (32, 2)


def test_family_override_switches_a_dense_bf16_linear_to_the_cuda_gemv():
    plan = lower_program(with_overrides(tiny_program(), {"target.lm_head": {"family": "gemv_bf16",
                                                                             "UNROLL": 2}}))
    spec = plan.spec_of("target.lm_head")
    assert spec.family == "gemv_bf16" and spec.backend == "cuda"
    # The GEMV takes the verification's 5 rows in one launch; the bias follows the Program.
    assert (spec.get("M_MAX"), spec.get("UNROLL"), spec.get("HAS_BIAS")) == (5, 2, False)


@pytest.mark.parametrize("overrides,needles", [
    ({"target.lm_head": {"family": "no_such_family"}},
     ["kernels.overrides[target.lm_head][family]", "unknown kernel family 'no_such_family'", "linear"]),
    ({"target.lm_head": {"BLOCK_Q": 16}},
     ["kernels.overrides[target.lm_head][BLOCK_Q]", "no parameter 'BLOCK_Q'", "BLOCK_N"]),
    ({"target.mlp.down_proj": {"BLOCK_N": 48}},
     ["target.layers.0.mlp.down_proj", "BLOCK_N", "not a power of two"]),
    ({"target.self_attn.attention": {"HEAD_DIM": 32}},
     ["[HEAD_DIM]", "follows from the Program", "16"]),
    ({"target.self_attn.rope": {"family": "linear"}},
     ["linear cannot run target.layers.0.self_attn.rope", "allowed: rope"]),
    ({"target.layers.7.input_norm": {"BLOCK_H": 64}},
     ["kernels.overrides[target.layers.7.input_norm]", "no node", "target.layers.0.input_norm"]),
    ({"target.layers.0.mlp.gate_proj": {"BLOCK_N": 16}},
     ["fuses gate_proj and up_proj", "target.layers.0.mlp.gate_up"]),
])
def test_bad_overrides_are_clear_lowering_errors(overrides, needles):
    with pytest.raises(LoweringError) as info:
        lower_program(with_overrides(tiny_program(), overrides))
    assert isinstance(info.value, SpecPilotError)
    for needle in needles:
        assert needle in str(info.value)


def test_lossless12_linear_cannot_be_overridden_to_a_dense_family():
    program = apply(with_measured_escapes(tiny_program()), SetWeightFormat("target.lm_head", "lossless12"))
    with pytest.raises(LoweringError, match=r"gemv_bf16 cannot run target.lm_head \(a linear node "
                                            r"in lossless12\); allowed: linear_lossless12"):
        lower_program(with_overrides(program, {"target.lm_head": {"family": "gemv_bf16"}}))


def test_a_shape_no_kernel_takes_is_refused_with_the_node():
    # The attention kernel family takes head_dim 16..256.
    with pytest.raises(LoweringError, match=r"target.layers.0.self_attn.attention: no attention "
                                            r"kernel fits this node.*HEAD_DIM: 8 is outside"):
        lower_program(tiny_program(heads=8, kv_heads=2, head_dim=8))


def test_a_kernel_that_fails_to_build_is_a_recorded_error_naming_its_nodes(tmp_path, kernel_cache):
    templates = tmp_path / "templates"
    shutil.copytree(Path(str(importlib.resources.files("specpilot.templates"))), templates)
    (templates / "triton" / "rope.py.j2").write_text("def launch(:\n", encoding="utf-8")
    plan = lower_program(tiny_program())
    built = build_plan(plan, kernel_cache, template_dir=templates)
    rope_nodes = ("target.layers.0.self_attn.rope", "target.layers.1.self_attn.rope",
                  "drafter.layers.0.self_attn.rope")
    # Target and drafter both have head_dim 16: one rope kernel serves all three nodes.
    assert [n.name for n in plan.nodes if n.op == "rope"] == list(rope_nodes)
    (error,) = built.errors
    assert error.key == plan.node(rope_nodes[0]).kernel and not built.ok
    assert error.nodes == rope_nodes
    assert error.stage == "syntax" and "for node target.layers.0.self_attn.rope" in str(error)
    assert isinstance(error, PlanBuildError) and isinstance(error, SpecPilotError)
    assert kernel_cache.stats.failures == 1 and kernel_cache.failures == [error.cause]
    # Every other kernel built, and each runs its nodes.
    assert set(built.modules) == {k for k, _ in plan.kernels} - {error.key}
    assert callable(built.module_of("target.layers.0.self_attn.q_proj").launch)
    with pytest.raises(PlanBuildError, match="target.layers.1.self_attn.rope"):
        built.module_of("drafter.layers.0.self_attn.rope")
    # Unrelated to the broken template, the same spec builds from the packaged templates.
    assert try_build_kernel(plan.spec_of("target.layers.0.self_attn.rope"), kernel_cache).ok


def test_a_lossless12_linear_may_run_the_cuda_fused_decode_gemv():
    program = apply(with_measured_escapes(tiny_program()), SetWeightFormat("target.mlp.*", "lossless12"))
    plan = lower_program(with_overrides(program, {"target.mlp.down_proj": {"family": "gemv_lossless12",
                                                                            "MATH": "mma"}}))
    for layer in (0, 1):
        spec = plan.spec_of(f"target.layers.{layer}.mlp.down_proj")
        assert (spec.family, spec.get("MATH"), spec.get("M_MAX")) == ("gemv_lossless12", "mma", 5)
    assert plan.spec_of("target.layers.0.mlp.up_proj").family == "linear_lossless12"
