"""codegen/fused_layer.py: the fused forward's kernel specs, by hand for the zoo drafter's widths
(hidden 384, 6 heads of 64, intermediate 1024, vocabulary 8192) and a head too narrow for tl.dot."""
from specpilot.codegen.fused_layer import attention_splits, fused_layer_specs


def _params(spec):
    return dict(spec.params)


def test_the_zoo_drafters_tiles():
    specs = fused_layer_specs("bf16", 384, 6, 64, 1024, 8192)
    assert set(specs) == {"qkv", "attention", "o_proj", "down", "mlp", "head"}
    qkv, head, mlp = _params(specs["qkv"]), _params(specs["head"]), _params(specs["mlp"])
    o_proj, down = _params(specs["o_proj"]), _params(specs["down"])
    # the q/k/v projection reduces 384 in steps of 256 (its widest); 16 rows a program
    assert qkv["BLOCK_K"] == 256 and qkv["BLOCK_M"] == 16 and qkv["USE_DOT"]
    # o_proj reduces 384 in one step of 512, down_proj 1024 in two, unpipelined: one kernel
    assert o_proj["BLOCK_K"] == 512 and o_proj["num_stages"] == 1 and specs["o_proj"] == specs["down"]
    # 384 columns in blocks of 16 are 24 programs; 8192 in blocks of 16 would be 512 (> 264),
    # of 32 are 256: the head takes twice that, 64, and the MLP's 1024 columns twice 16
    assert o_proj["BLOCK_N"] == 16 and head["BLOCK_N"] == 64 and mlp["BLOCK_N"] == 32
    assert head["BLOCK_K"] == 128 and mlp["BLOCK_K"] == 128 and head["num_warps"] == 8
    assert head["NORM"] and head["OUT_FP32"] and not head.get("RESIDUAL", False)
    attention = _params(specs["attention"])
    assert attention["num_warps"] == 8 and attention["SPLITS"] == 4
    two = fused_layer_specs("bf16", 384, 6, 64, 1024, 8192, attention_splits=2)
    assert _params(two["attention"])["SPLITS"] == 2


def test_a_launch_splits_its_walks_while_they_fit_two_waves():
    # The zoo drafter at batch 16 and 64: 2 kv heads, one row block each (3 query heads a kv
    # head, 1 or 2 tokens) -> 32 and 128 walks. 32 x 4 = 128 programs; 128 x 4 = 512 is past
    # 264, 128 x 2 = 256 is not.
    assert attention_splits(32, 4) == 4 and attention_splits(128, 4) == 2
    assert attention_splits(133, 4) == 1 and attention_splits(600, 4) == 1
    assert attention_splits(8, 2) == 2 and attention_splits(8, 1) == 1


def test_heads_too_narrow_for_tl_dot_multiply_add():
    qkv = _params(fused_layer_specs("fp32", 48, 3, 16, 40, 100)["qkv"])
    assert not qkv["USE_DOT"] and qkv["BLOCK_K"] == 16 and qkv["HEAD_DIM"] == 16
