"""Snapshots of rendered kernels: a template change shows up as a reviewable diff.

After an intended template change, regenerate with
    SPECPILOT_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_golden_kernels.py
and review the diff of tests/codegen/golden/.
"""
import os
from pathlib import Path

import pytest

from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.codegen.render import render_kernel

GOLDEN = Path(__file__).parent / "golden"

CASES = {
    "linear_default.py": kernel_spec("linear"),
    "linear_gemv_splitk_bias.py": kernel_spec("linear", USE_DOT=False, BLOCK_M=1, BLOCK_N=32,
                                              BLOCK_K=128, SPLIT_K=2, HAS_BIAS=True),
    "rmsnorm_residual_fp32.py": kernel_spec("rmsnorm", DTYPE="fp32", BLOCK_H=2048),
    "rope_table_d64.py": kernel_spec("rope", HEAD_DIM=64, COS_SIN="table"),
    "attention_d128.py": kernel_spec("attention", HEAD_DIM=128, BLOCK_R=32),
    "attention_d64_split4_fold_o.py": kernel_spec("attention", HEAD_DIM=64, SPLITS=4,
                                                  FOLD_O=True),
    "norm_gate_up_silu_fold_down.py": kernel_spec("norm_gate_up_silu", FOLD_DOWN=True),
    "greedy_accept_default.py": kernel_spec("greedy_accept"),
    "chain_commit_row.py": kernel_spec("chain_commit", LOG="row"),
    "length_policy_per_depth_throughput.py": kernel_spec("length_policy", ESTIMATOR="per_depth",
                                                         OBJECTIVE="throughput"),
    "length_admit_per_depth.py": kernel_spec("length_admit", ESTIMATOR="per_depth"),
    "row_start_default.py": kernel_spec("row_start"),
    "gemv_bf16_m4_bias.cu": kernel_spec("gemv_bf16", M_MAX=4, HAS_BIAS=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_kernel_matches_golden(name):
    path = GOLDEN / (name + ".golden")
    source = render_kernel(CASES[name])
    if os.environ.get("SPECPILOT_UPDATE_GOLDEN") == "1":
        path.write_text(source, encoding="utf-8")
    assert path.is_file(), f"no golden file {path.name}; regenerate with SPECPILOT_UPDATE_GOLDEN=1"
    assert source == path.read_text(encoding="utf-8"), (
        f"{name} differs from its golden file; if the change is intended, regenerate with "
        f"SPECPILOT_UPDATE_GOLDEN=1 and review the diff")
