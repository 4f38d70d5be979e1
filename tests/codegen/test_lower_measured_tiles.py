"""Lowering's default tiles for bf16 `linear` nodes come from the configurations measured best on
an H200 (params.LINEAR_TILES), chosen by the rows the node multiplies: 1 for the drafter's chain
steps, k+1 for chain verification, the tree's size plus its root for a tree, times the batch.
The table is checked against the measurements themselves (bench/results/kernels.json)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kernel_checks import assert_matches, poisoned, randn
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.lower import lower_program, measured_tiles
from specpilot.ir import (Deployment, SetDraftLength, SetMaxBatchSize, SetTopology, Tree, apply,
                          stock_program)
from specpilot.runtime.reference_ops import linear_ref

from test_lower import model_spec, tiny_program

KERNELS_JSON = Path(__file__).resolve().parents[2] / "bench" / "results" / "kernels.json"
TILE_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "USE_DOT", "SPLIT_K", "num_warps", "num_stages")


def llama8b_program(dtype="bfloat16"):
    """Stock Program of a 2-layer target with Llama-3.1-8B's widths (the measured shapes) and a
    1-layer drafter of the same widths."""
    kw = dict(dtype=dtype, heads=32, kv_heads=8, head_dim=128, vocab=128256)
    target = replace(model_spec("target", 4096, 2, **kw), intermediate_size=14336)
    drafter = replace(model_spec("drafter", 4096, 1, **kw), intermediate_size=14336)
    return stock_program(Deployment(target, drafter, "NVIDIA H200", "test"))


def tiles(plan, node):
    spec = plan.spec_of(node)
    return {name: spec.get(name) for name in TILE_NAMES}


def dot(m, n, k, split, stages=3):
    return dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, USE_DOT=True, SPLIT_K=split, num_warps=4,
                num_stages=stages)


# ------------------------------------------------------------------ against the measurements

def _measured():
    data = json.loads(KERNELS_JSON.read_text(encoding="utf-8"))
    assert data["environment"]["gpu"] == "NVIDIA H200"
    best = [b for b in data["best_configs"] if b["kernel"] == "linear"]
    runs = [r for r in data["results"] if r.get("kernel") == "linear" and r["status"] == "ok"]
    return best, runs


def test_every_covered_measurement_gets_a_measured_config_within_5_percent_of_the_best():
    best, runs = _measured()
    covered = 0
    for b in best:
        n, k, m = b["shape"]["N"], b["shape"]["K"], b["M"]
        chosen = measured_tiles(m, n, k)
        if chosen is None:
            continue
        covered += 1
        same = [r for r in runs if r["case"] == b["case"] and r["M"] == m
                and all(r["spec"]["params"][p] == v for p, v in chosen.items())]
        assert same, f"{b['case']} at M={m}: {chosen} was never measured"
        assert same[0]["pct_copy_bw"] >= 0.95 * b["pct_copy_bw"], (b["case"], m, chosen)
        # and it beats the multiply-add / shape-derived default it replaces
        default = next(r for r in runs if r["case"] == b["case"] and r["M"] == m
                       and r["role"] == "default")
        assert same[0]["pct_copy_bw"] > 1.4 * default["pct_copy_bw"], (b["case"], m)
    # M = 1, 4, 8 for all four shapes, 16 for three, 64 for two
    assert covered == 17


def test_rows_no_measurement_covers_keep_the_shape_derived_default():
    # 17..32 rows: only the defaults were measured; 9..16 rows of a wide matrix: the default won
    assert measured_tiles(20, 4096, 4096) is None
    assert measured_tiles(16, 28672, 4096) is None
    assert measured_tiles(65, 4096, 4096) is None
    assert measured_tiles(64, 4096, 14336) is None      # down at 64 rows was not swept


# ------------------------------------------------------------------ rows per node

def test_chain_verification_and_drafter_steps():
    plan = lower_program(llama8b_program())
    # target verifies root + 4 drafts = 5 rows; the drafter drafts one token at a time
    assert plan.node("target.layers.0.self_attn.q_proj").attr("rows") == 5
    assert tiles(plan, "target.layers.0.self_attn.q_proj") == dot(16, 64, 128, 2)
    assert tiles(plan, "target.layers.1.mlp.down_proj") == dot(16, 64, 128, 2)
    assert plan.node("drafter.layers.0.self_attn.o_proj").attr("rows") == 1
    assert tiles(plan, "drafter.layers.0.self_attn.o_proj") == dot(16, 64, 128, 2)
    # a vocabulary-wide head fills the GPU without splitting K
    assert tiles(plan, "target.lm_head") == dot(16, 32, 128, 1)


def test_a_longer_chain_a_tree_and_a_batch():
    base = llama8b_program()
    long = lower_program(apply(base, SetDraftLength(15)))          # 16 rows
    assert tiles(long, "target.layers.0.self_attn.o_proj") == dot(16, 32, 256, 1, stages=4)
    tree = lower_program(apply(base, SetTopology(Tree((4, 2, 2, 1)))))
    # 4 + 8 + 16 + 16 drafted nodes + the root = 45 rows; the drafter's widest level is 16
    assert tree.node("target.layers.0.self_attn.o_proj").attr("rows") == 45
    assert tiles(tree, "target.layers.0.self_attn.o_proj") == dot(64, 32, 256, 1, stages=4)
    assert tiles(tree, "drafter.layers.0.self_attn.o_proj") == dot(16, 32, 256, 1, stages=4)
    batched = lower_program(apply(base, SetMaxBatchSize(4)))       # 4 x 5 = 20 rows: unmeasured
    assert batched.node("target.layers.0.self_attn.o_proj").attr("rows") == 20
    assert tiles(batched, "target.layers.0.self_attn.o_proj") == dot(16, 64, 64, 1)
    assert tiles(batched, "drafter.layers.0.self_attn.o_proj") == dot(16, 64, 128, 2)  # 4 rows


def test_only_bf16_linear_nodes_change():
    fp32 = lower_program(llama8b_program("float32"))
    # measured in bf16 only: fp32 keeps the multiply-add tile of exactly the rows
    assert tiles(fp32, "target.layers.0.self_attn.q_proj")["USE_DOT"] is False
    assert tiles(fp32, "target.layers.0.self_attn.q_proj")["BLOCK_M"] == 8
    bf16 = lower_program(llama8b_program())
    gate_up = bf16.spec_of("target.layers.0.mlp.gate_up")          # another family: unchanged
    assert gate_up.family == "gate_up_silu" and gate_up.get("USE_DOT") is False


def test_small_matrices_narrow_the_tiles():
    plan = lower_program(tiny_program())
    # hidden 64: q_proj is 64 x 64, one K step of 64, so no split
    assert tiles(plan, "target.layers.0.self_attn.q_proj") == dot(16, 64, 64, 1)
    # drafter head: vocab 97 x hidden 32
    assert tiles(plan, "drafter.lm_head") == dot(16, 64, 32, 1)
    # down_proj reads K = 128 = one BLOCK_K step: no split either
    assert tiles(plan, "target.layers.0.mlp.down_proj") == dot(16, 64, 128, 1)
    assert measured_tiles(1, 24, 300) == dot(16, 32, 128, 2)       # 3 K steps: split in two


def test_the_lowered_default_computes_the_linear(kernel_cache, device):
    """The measured default (tensor-core tile of 16 rows, K split in two) on 3 rows of a
    200 x 300 matrix, against a float64-accumulated reference."""
    target = replace(model_spec("target", 64, 1, heads=4, kv_heads=2, head_dim=16),
                     intermediate_size=300)
    program = stock_program(Deployment(target, model_spec("drafter", 32, 1, heads=2, kv_heads=1),
                                       "cpu", "test"))
    spec = lower_program(apply(program, SetDraftLength(2))).spec_of("target.layers.0.mlp.down_proj")
    assert (spec.get("USE_DOT"), spec.get("BLOCK_M"), spec.get("SPLIT_K")) == (True, 16, 2)
    module = build_triton_module(spec, kernel_cache)
    x = randn(3, 300, dtype=torch.bfloat16, device=device)
    w = randn(64, 300, dtype=torch.bfloat16, device=device)
    out = poisoned((3, 64), torch.bfloat16, device)
    module.launch(x, w, out)
    assert_matches(out, linear_ref(x, w, None), "bf16")
    exact = (x.double() @ w.double().T).to(torch.bfloat16)
    assert_matches(out, exact, "bf16")


@pytest.mark.parametrize("rows", [1, 8, 9, 16, 33, 64])
def test_every_measured_choice_is_a_legal_spec(rows):
    from specpilot.codegen.kernel_spec import KernelSpec
    for n, k in ((4096, 4096), (128256, 4096), (24, 16), (1000, 14336)):
        chosen = measured_tiles(rows, n, k)
        if chosen is not None:
            KernelSpec.create("linear", DTYPE="bf16", **chosen)
