"""codegen/fused_layer.py: the fused forward's kernel specs, by hand for the zoo drafter's widths
(hidden 384, 6 heads of 64, intermediate 1024, vocabulary 8192) and a head too narrow for tl.dot."""
from specpilot.codegen.fused_layer import fused_layer_specs


def _params(spec):
    return dict(spec.params)


def test_the_zoo_drafters_tiles():
    specs = fused_layer_specs("bf16", 384, 6, 64, 1024, 8192)
    assert set(specs) == {"qkv", "attention", "o_proj", "down", "mlp", "head"}
    qkv, head = _params(specs["qkv"]), _params(specs["head"])
    # reductions of 384 and 1024 in one step of 256 (the widest); 16 rows a program
    assert qkv["BLOCK_K"] == 256 and qkv["BLOCK_M"] == 16 and qkv["USE_DOT"]
    # 384 columns in blocks of 16 are 24 programs; 8192 need 32 (512 blocks of 16 > 264)
    assert _params(specs["o_proj"])["BLOCK_N"] == 16 and head["BLOCK_N"] == 32
    assert head["NORM"] and head["OUT_FP32"] and not head.get("RESIDUAL", False)
    assert _params(specs["attention"])["num_warps"] == 8
    # o_proj (384 wide) and down_proj (1024 wide) reduce in the same steps: one kernel
    assert specs["o_proj"] == specs["down"]


def test_heads_too_narrow_for_tl_dot_multiply_add():
    qkv = _params(fused_layer_specs("fp32", 48, 3, 16, 40, 100)["qkv"])
    assert not qkv["USE_DOT"] and qkv["BLOCK_K"] == 16 and qkv["HEAD_DIM"] == 16
