"""TuneKernel records reach the kernels through lowering: the tuned parameter changes exactly the
nodes the record names (one layer, or every layer by the layer-less name), and what the IR
cannot know (does the node exist, does its family take the parameter and the value) is a
LoweringError naming the override."""
import pytest

from specpilot.codegen.lower import LoweringError, lower_program
from specpilot.codegen.plan import diff_plans
from specpilot.ir import TuneKernel, apply, replay

from test_lower import tiny_program


def changed(a, b):
    return [line.split(":", 1)[0] for line in diff_plans(lower_program(a), lower_program(b))]


def test_one_layer_and_every_layer():
    base = tiny_program()
    one = apply(base, TuneKernel("target.layers.1.mlp.down_proj", "BLOCK_N", 32))
    assert changed(base, one) == ["target.layers.1.mlp.down_proj"]
    assert lower_program(one).spec_of("target.layers.1.mlp.down_proj").get("BLOCK_N") == 32
    every = apply(base, TuneKernel("target.self_attn.attention", "BLOCK_S", 32))
    assert changed(base, every) == ["target.layers.0.self_attn.attention",
                                    "target.layers.1.self_attn.attention"]
    plan = lower_program(every)
    assert {plan.spec_of(f"target.layers.{i}.self_attn.attention").get("BLOCK_S")
            for i in range(2)} == {32}
    # the other parameters stay the lowering's defaults
    before = lower_program(base).spec_of("target.layers.0.self_attn.attention")
    after = plan.spec_of("target.layers.0.self_attn.attention")
    assert {k: v for k, v in after.params if k != "BLOCK_S"} == \
        {k: v for k, v in before.params if k != "BLOCK_S"}


def test_a_family_switch_then_its_parameter():
    tuned = replay(tiny_program(), [TuneKernel("target.lm_head", "family", "gemv_bf16"),
                                    TuneKernel("target.lm_head", "COLS_PER_WARP", 2)])
    spec = lower_program(tuned).spec_of("target.lm_head")
    assert (spec.family, spec.get("COLS_PER_WARP")) == ("gemv_bf16", 2)


@pytest.mark.parametrize("t,needles", [
    (TuneKernel("target.layers.7.mlp.down_proj", "BLOCK_N", 32),
     ["kernels.overrides[target.layers.7.mlp.down_proj]", "no node of this Program"]),
    (TuneKernel("target.mlp.gate_proj", "BLOCK_N", 32),
     ["fuses gate_proj and up_proj", "target.mlp.gate_up"]),
    (TuneKernel("target.lm_head", "BLOCK_Q", 16), ["has no parameter 'BLOCK_Q'"]),
    (TuneKernel("target.lm_head", "BLOCK_N", 48), ["BLOCK_N", "48 is not a power of two"]),
    (TuneKernel("target.lm_head", "BLOCK_N", True), ["BLOCK_N", "expected an integer"]),
    (TuneKernel("target.lm_head", "DTYPE", "fp16"), ["follows from the Program"]),
    (TuneKernel("target.lm_head", "family", "rmsnorm"), ["rmsnorm cannot run target.lm_head"]),
], ids=["no-such-layer", "fused-away", "unknown-param", "bad-value", "bool-for-int", "locked",
        "wrong-family"])
def test_what_only_lowering_knows_is_a_lowering_error(t, needles):
    program = apply(tiny_program(), t)   # structurally fine: the IR accepts it
    with pytest.raises(LoweringError) as info:
        lower_program(program)
    for needle in needles:
        assert needle in str(info.value), str(info.value)
