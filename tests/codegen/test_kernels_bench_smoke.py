"""bench/kernels.py end to end on the CPU (--smoke: tiny shapes, Triton interpreter), and its
correctness check on outputs that are known to be wrong."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
GROUPS = {"linear", "rmsnorm", "rope", "attention", "gate_up_silu", "greedy_accept", "kv_compact"}
TIMED_FIELDS = {"us", "us_min", "us_max", "reps", "timing", "bytes", "gbps", "rotation_sets", "correctness"}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels-bench")
    env = dict(os.environ, SPECPILOT_CACHE=str(out / "cache"), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(BENCH / "kernels.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "kernels.json").read_text()), (out / "kernels.md").read_text(), proc.stdout


def test_document_records_the_environment_and_completes(smoke_run):
    doc, _, _ = smoke_run
    assert doc["schema"] == "specpilot.bench.kernels/1" and doc["complete"] is True
    env = doc["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert {"triton", "nvcc", "date", "command", "gpu"} <= set(env)
    assert "--smoke" in env["command"]
    assert doc["copy_bandwidth"]["gbps"] > 0
    assert doc["settings"]["smoke"] is True


def test_every_family_is_measured_and_checked(smoke_run):
    doc, _, _ = smoke_run
    rows = doc["results"]
    assert {r["group"] for r in rows} == GROUPS
    for row in rows:
        assert row["status"] in ("ok", "skipped"), row  # on the CPU every kernel must be correct
        if row["status"] == "ok":
            assert TIMED_FIELDS <= set(row), row
            c = row["correctness"]
            assert c["ok"] is True and c["rel_err"] is not None, row
            if c["tolerance"] == "exact":
                assert c["rel_err"] == 0.0
            else:
                assert c["rel_err"] <= c["tolerance"] and c["max_abs_err"] is not None
            assert row["us"] > 0 and row["gbps"] > 0
    ours = [r for r in rows if r["status"] == "ok" and r["impl"] == "triton"]
    assert {r["group"] for r in ours} == GROUPS
    assert all("speedup_vs_baseline" in r for r in ours if r["role"] == "default")
    # Each linear row count has cuBLAS, the default Triton kernels and a sweep.
    linear = [r for r in rows if r["group"] == "linear" and r["status"] == "ok"]
    for case in ("qkv", "down"):
        for M in (1, 4):
            kernels = {(r["kernel"], r["role"]) for r in linear if r["case"] == case and r["M"] == M}
            assert {("cublas", "baseline"), ("linear", "default"), ("linear_lossless12", "default"),
                    ("linear", "sweep"), ("linear_lossless12", "sweep")} <= kernels


def test_cuda_kernels_are_skipped_with_a_reason_without_a_gpu(smoke_run):
    doc, _, _ = smoke_run
    cuda = [r for r in doc["results"] if r["impl"] == "cuda"]
    assert {r["kernel"] for r in cuda} == {"gemv_bf16", "gemv_lossless12", "gemv_lossless12_mma"}
    assert all(r["status"] == "skipped" and "CUDA" in r["reason"] for r in cuda)


def test_best_configs_are_valid_specs_and_the_markdown_has_the_tables(smoke_run):
    import specpilot.codegen.formats  # noqa: F401  (registers linear_lossless12)
    from specpilot.codegen.kernel_spec import KernelSpec

    doc, markdown, stdout = smoke_run
    best = doc["best_configs"]
    assert {(b["case"], b["M"]) for b in best if b["kernel"] == "linear"} == {
        ("qkv", 1), ("qkv", 4), ("down", 1), ("down", 4)}
    for b in best:
        spec = KernelSpec.from_dict(b["spec"])
        same = [r for r in doc["results"] if r["status"] == "ok" and r["kernel"] == b["kernel"]
                and r["case"] == b["case"] and r["M"] == b["M"]]
        assert b["us"] == min(r["us"] for r in same) and spec.family in b["kernel"]
    for heading in ("### Linear layers", "### Other kernel families", "### Best configuration"):
        assert heading in markdown
    assert "| qkv 48×32 | 1 |" in markdown and markdown.strip() in stdout


def _measure_module():
    sys.path.insert(0, str(BENCH))
    try:
        from kernel_bench import measure
    finally:
        sys.path.remove(str(BENCH))
    return measure


def test_correctness_check_rejects_wrong_or_unwritten_outputs():
    measure = _measure_module()
    ref = torch.randn(4, 64, dtype=torch.float64)
    good = ref.to(torch.bfloat16)
    assert measure.compare(good, ref)["ok"]
    off = good.clone()
    off[1, 3] += 50.0  # one wrong element
    result = measure.compare(off, ref)
    assert not result["ok"] and result["max_abs_err"] >= 49
    unwritten = good.clone()
    unwritten[2, 5] = float("nan")
    result = measure.compare(unwritten, ref)
    assert not result["ok"] and result["finite"] is False
    assert not measure.compare(good[:, :32], ref)["ok"]
    exact = measure.compare_exact([torch.tensor([1, 2, 3])], [torch.tensor([1, 2, 4])])
    assert not exact["ok"] and exact["mismatches"] == 1


def test_rotation_covers_three_l2s():
    measure = _measure_module()
    l2 = 60 * 2 ** 20
    assert measure.rotation_sets(32 * 2 ** 20, l2) == 6   # 4096 x 4096 bf16: 6 x 32 MiB >= 180 MiB
    assert measure.rotation_sets(235 * 2 ** 20, l2) == 4  # never fewer than 4
    assert measure.rotation_sets(1024, l2) == 16          # tiny operands: capped


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens where CUDA cannot run")
def test_cuda_probe_trusts_no_kernel_its_child_could_not_run():
    from specpilot.codegen.kernel_spec import kernel_spec

    sys.path.insert(0, str(BENCH))
    try:
        from kernel_bench.probe import probe_specs
    finally:
        sys.path.remove(str(BENCH))
    specs = [kernel_spec("gemv_bf16"), kernel_spec("gemv_lossless12", MATH="mma")]
    verdicts = probe_specs(specs, log=lambda message: None)
    assert set(verdicts) == {str(s) for s in specs}
    assert all(not v["ok"] and "probe set-up" in v["error"] for v in verdicts.values())
