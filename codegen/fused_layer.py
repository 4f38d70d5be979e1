"""The kernel specs of a small model's forward in fused kernels (runtime/fused_forward.py): per
layer norm_qkv_rope, attention, fused_linear for o_proj and down_proj with the residual and
norm_gate_up_silu, and the LM head as fused_linear with the final norm and float32 logits.

Tiles for a decode step's few rows (16 a program), chosen by bench/fused_tile_sweep.py on an
H200 at the zoo drafter's shapes (BENCHMARKS.md, twenty-third set), where every kernel is bound
by latency, not by the bytes it reads:
- the q/k/v projection and the norms reduce in steps of up to 256 (their statistics pass walks
  the same steps);
- o_proj and down_proj, with no norm, in steps of up to 512, unpipelined (one or two steps);
- the MLP's input and the LM head in steps of 128, with column blocks twice the narrowest that
  keeps a launch within MAX_PROGRAMS programs per row block (the head with eight warps): fewer,
  fuller programs, which held up best at five tokens a request (80 rows).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

from .families import next_power_of_two
from .kernel_spec import KernelSpec, kernel_spec

# Programs per launch past which wider column blocks pay (two waves of an H200's 132 SMs).
MAX_PROGRAMS = 264
ROWS_PER_PROGRAM = 16
# Programs that share one (request, kv head)'s attention walk (the attention family's SPLITS),
# at most: a drafter step has one row block per request and kv head, too few programs to fill
# the GPU, and each walks the request's whole visible cache alone. On an H200 at the zoo
# drafter's shapes four were fastest at batch 16 (32 row blocks) and two at batch 64 (128):
# 6.1 and 7.4 us a launch against 9.0 and 9.2 unsplit (BENCHMARKS.md, twenty-seventh set),
# so a launch takes the most splits, up to this, that keep it within MAX_PROGRAMS programs
# (`attention_splits`).
ATTENTION_SPLITS = 4
# Whether a layer folds o_proj into the attention and down_proj into the MLP, adding both into
# a float32 residual stream atomically (three launches a layer, not five), in place of two
# launches of their own (some 6 us a layer of a drafter step at batch 16, BENCHMARKS.md
# twenty-third set). Off: on an H200 the folded chain(4) round ran 4.5-5 % longer at batch 16
# and 64, the attention's merge program folding after every split has finished (+7 us a
# launch; twenty-ninth set).
FOLD_RESIDUAL = False
# Overrides FOLD_RESIDUAL for experiments ("1" folds, "0" does not): how one bench run races a
# pair's rows with the drafter folded and not.
FOLD_ENV = "SPECPILOT_FOLD_RESIDUAL"
# Output columns per step of a folded projection.
FOLD_COLUMNS = 128


def fold_default() -> bool:
    """Whether fused layers fold by default: SPECPILOT_FOLD_RESIDUAL if it is "0" or "1",
    FOLD_RESIDUAL otherwise."""
    value = os.environ.get(FOLD_ENV, "").strip()
    return {"1": True, "0": False}.get(value, FOLD_RESIDUAL)


def reduction_block(k: int, widest: int = 256) -> int:
    """The reduction step for a reduction of length k: all of it, within 16..widest."""
    return min(widest, max(16, next_power_of_two(k)))


def attention_splits(row_blocks: int, most: int) -> int:
    """The split count for an attention launch of `row_blocks` (request, kv head, row block)
    walks: the largest power of two up to `most` whose programs stay within MAX_PROGRAMS (at
    least 1)."""
    splits = 1
    while splits * 2 <= most and row_blocks * splits * 2 <= MAX_PROGRAMS:
        splits *= 2
    return splits


def column_block(n: int) -> int:
    """The narrowest power-of-two column block (16 to 128) whose launch of n columns stays
    within MAX_PROGRAMS programs per row block."""
    block = 16
    while block < 128 and -(-n // block) > MAX_PROGRAMS:
        block *= 2
    return block


def fused_layer_specs(dtype: str, hidden: int, heads: int, head_dim: int, intermediate: int,
                      vocab: int, attention_splits: int = ATTENTION_SPLITS,
                      fold: Optional[bool] = None) -> Dict[str, KernelSpec]:
    """The six specs {qkv, attention, o_proj, down, mlp, head} for a model of these widths in
    `dtype` ("bf16", "fp16" or "fp32"), the attention's walk shared by `attention_splits`
    programs; with `fold`, four: o_proj folded into the attention and down_proj into the MLP
    over a float32 residual stream, which the q/k/v projection and the head read (default:
    `fold_default()`)."""
    def spec(family, **params):
        return kernel_spec(family, DTYPE=dtype, BLOCK_M=ROWS_PER_PROGRAM, **params)

    # tl.dot takes blocks of 16 columns: narrower heads' halves multiply-add instead.
    qkv_tiles = (dict(BLOCK_K=reduction_block(hidden)) if head_dim >= 32
                 else dict(BLOCK_K=16, USE_DOT=False))
    specs = {
        "qkv": spec("norm_qkv_rope", HEAD_DIM=head_dim, **qkv_tiles),
        # Eight warps: a step has one program per (request, kv head), too few to fill the GPU,
        # so each program's walk is the time (bench/attention_sweep.py on an H200, the zoo
        # drafter at batch 4-64: of slot blocks 32-256 and 2-8 warps, 64 slots and 8 warps were
        # the fastest at one token a request, and within 0.3 us of the fastest at two).
        "attention": kernel_spec("attention", DTYPE=dtype, HEAD_DIM=head_dim, num_warps=8,
                                 SPLITS=attention_splits),
        # o_proj and down_proj: hidden columns plus the residual.
        "o_proj": spec("fused_linear", RESIDUAL=True, BLOCK_N=column_block(hidden),
                       BLOCK_K=reduction_block(heads * head_dim, 512), num_stages=1),
        "down": spec("fused_linear", RESIDUAL=True, BLOCK_N=column_block(hidden),
                     BLOCK_K=reduction_block(intermediate, 512), num_stages=1),
        "mlp": spec("norm_gate_up_silu", BLOCK_N=min(128, 2 * column_block(intermediate)),
                    BLOCK_K=reduction_block(hidden, 128)),
        "head": spec("fused_linear", NORM=True, OUT_FP32=True,
                     BLOCK_N=min(128, 2 * column_block(vocab)),
                     BLOCK_K=reduction_block(hidden, 128), num_warps=8),
    }
    if not (fold_default() if fold is None else fold):
        return specs
    columns = dict(FOLD_N=min(FOLD_COLUMNS, max(16, next_power_of_two(hidden))))
    return {"qkv": specs["qkv"].with_params(X_FP32=True),
            "attention": specs["attention"].with_params(FOLD_O=True, **columns),
            "mlp": specs["mlp"].with_params(FOLD_DOWN=True, **columns),
            "head": specs["head"].with_params(X_FP32=True)}
