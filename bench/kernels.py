"""Time every generated kernel family against torch / cuBLAS at Llama-3.1-8B sizes.

    python bench/kernels.py --out DIR [--budget-s 200] [--quick]     (on a CUDA GPU)
    python bench/kernels.py --smoke --out DIR                        (CPU, Triton interpreter)

Linears qkv 6144x4096, o 4096x4096, gate_up 28672x4096 and down 4096x14336 at M = 1, 4, 8, 16, 32,
64: torch F.linear (cuBLAS), Triton `linear`, CUDA `gemv_bf16` (M <= 8), Triton
`linear_lossless12` and CUDA `gemv_lossless12` (fma and mma, M <= 8) on the same weights packed
as lossless12; then rmsnorm, rope, attention, gate_up_silu, greedy_accept and kv_compact against
their torch references; then a small sweep of configurations per linear, whose best per (layer, M)
is reported. Every kernel is first checked against a float64 (or exact) reference on a poisoned
output; an incorrect one is still timed but marked. Work runs in that order until --budget-s is
spent (what is left is recorded as skipped). Results: DIR/kernels.json (rewritten after every
row) and DIR/kernels.md (a table for BENCHMARKS.md, also printed at the end).

--smoke runs tiny shapes on the CPU with the Triton interpreter, one repetition, CUDA kernels
recorded as skipped: it checks that the whole script and its output format work.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

SCHEMA = "specpilot.bench.kernels/1"
SWEEP_ROWS_ORDER = (1, 8, 4, 16, 64, 32)
DEFAULT_L2_BYTES = 50 * 2 ** 20


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("bench", "results"), help="output folder")
    parser.add_argument("--budget-s", type=float, default=200.0,
                        help="wall-clock budget in seconds; later work is skipped once it is spent")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sweep configs")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU smoke run: tiny shapes, Triton interpreter, one repetition")
    parser.add_argument("--no-sweep", action="store_true", help="time only the default configurations")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch

    from kernel_bench.measure import Budget, TimingSettings, copy_bandwidth
    from kernel_bench.runner import Runner

    budget = Budget(args.budget_s)
    if args.smoke:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        print("no CUDA device: run with --smoke for the CPU check of the script", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "kernels.json")
    md_path = os.path.join(args.out, "kernels.md")

    if args.smoke:
        settings = TimingSettings(device, reps=1, min_calls=1, warmup=False)
    else:
        settings = TimingSettings(device, reps=10 if args.quick else 20, min_calls=16 if args.quick else 24)
    doc = {"schema": SCHEMA, "environment": _environment(device), "complete": False,
           "settings": {"budget_s": args.budget_s, "quick": args.quick, "smoke": args.smoke,
                        "reps": settings.reps, "min_calls_per_rep": settings.min_calls,
                        "seed": args.seed, "sweep": not args.no_sweep},
           "copy_bandwidth": None, "results": [], "best_configs": [], "skipped_for_budget": 0}
    builder = _builder(device, lambda msg: print(f"[{budget.elapsed():7.1f}s] {msg}", flush=True))
    runner = Runner(settings, budget, doc, json_path, builder,
                    on_flush=lambda d: _write_markdown(d, md_path))
    status = 0
    try:
        _run(args, runner, device, doc, copy_bandwidth)
        doc["complete"] = True
    except Exception as exc:  # a bug outside any one kernel: keep what was measured
        import traceback
        traceback.print_exc()
        doc["fatal_error"] = f"{type(exc).__name__}: {exc}"
        status = 1
    finally:
        builder.close()
        _finish(doc, runner, md_path)
    return status


def _environment(device: str) -> dict:
    import torch

    from specpilot.bench.environment import environment
    from specpilot.codegen.cuda_build import find_nvcc, nvcc_version

    env = environment(device)
    nvcc = find_nvcc()
    try:
        env["nvcc"] = nvcc_version(nvcc) if nvcc else None
    except Exception as exc:
        env["nvcc"] = f"unavailable: {exc}"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                   l2_bytes=getattr(props, "L2_cache_size", None), capability=f"{props.major}.{props.minor}")
    return env


def _builder(device: str, log):
    from specpilot.codegen.cache import KernelCache
    from specpilot.codegen.cuda_build import find_nvcc

    from kernel_bench.runner import Builder

    reason = ""
    if device != "cuda":
        reason = "no CUDA device (CUDA kernels need a GPU)"
    elif find_nvcc() is None:
        reason = "nvcc not found: the CUDA kernels cannot be built"
    return Builder(KernelCache(), workers=min(8, os.cpu_count() or 1), cuda_ok=not reason, cuda_reason=reason,
                   log=log)


def _run(args, runner, device: str, doc: dict, copy_bandwidth) -> None:
    import torch

    from kernel_bench import linears, ops

    smoke = args.smoke
    l2 = DEFAULT_L2_BYTES
    if device == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or l2
    copy = copy_bandwidth(runner.settings, 2 ** 23 if smoke else (2 ** 29 if args.quick else 2 ** 30))
    doc["copy_bandwidth"] = copy
    runner.copy_gbps = copy["gbps"]
    runner.log(f"copy bandwidth {copy['gbps']:.0f} GB/s; L2 {l2 / 2 ** 20:.0f} MiB")

    shapes = linears.SMOKE_LINEARS if smoke else linears.LLAMA_8B_LINEARS
    rows = linears.SMOKE_ROWS if smoke else linears.ROWS
    for spec in linears.all_cuda_specs(rows, args.quick):  # nvcc builds start now, in parallel
        runner.builder.prefetch(spec)
    reserve = 0.0 if smoke else 8.0
    default_cuda = [s for M in rows for s in linears.default_specs(M, 64, 64).values() if s.backend == "cuda"]
    runner.builder.probe(default_cuda)  # one child process runs each default CUDA kernel first

    data = {}
    for name, (N, K) in shapes.items():
        data[name] = linears.LinearData(name, N, K, device, l2, rotate=not smoke)
        for M in rows:
            if runner.budget.spent(reserve):
                runner.skip({"group": "linear", "case": name, "kernel": "*", "impl": "*", "role": "default",
                             "shape": {"N": N, "K": K}, "M": M, "spec": None}, "time budget spent")
                continue
            linears.run_defaults(runner, data[name], M)

    sizes = ops.SMOKE if smoke else ops.LLAMA_8B
    for run_op in ops.OPS:
        group = run_op.__name__.removeprefix("run_")
        if runner.budget.spent(reserve):
            runner.skip({"group": group, "case": "*", "kernel": "*", "impl": "*", "role": "default",
                         "shape": {}, "M": None, "spec": None}, "time budget spent")
            continue
        try:
            run_op(runner, sizes, device, l2, not smoke)
        except Exception as exc:  # set-up of a family's inputs failed: record it, go on
            runner.skip({"group": group, "case": "*", "kernel": "*", "impl": "*", "role": "default",
                         "shape": {}, "M": None, "spec": None}, f"set-up failed: {type(exc).__name__}: {exc}")
        if device == "cuda":
            torch.cuda.empty_cache()

    if args.no_sweep:
        return
    sweep_cuda = [s for M in rows for group in linears.sweep_specs(M, args.quick).values() for s in group
                  if s.backend == "cuda"]
    if runner.builder.cuda_ok and not runner.budget.spent(reserve + 30):
        runner.builder.probe(sweep_cuda)  # one child process for all of them
    order = [m for m in SWEEP_ROWS_ORDER if m in rows]
    for M in order:
        for name in shapes:
            doc["skipped_for_budget"] += linears.run_sweep(runner, data[name], M, args.quick or smoke,
                                                           reserve)


def _write_markdown(doc: dict, md_path: str) -> str:
    """Render and write the markdown (also done every few rows, so a killed run leaves one)."""
    from kernel_bench.report import render_markdown

    markdown = render_markdown(doc)
    tmp = md_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(markdown)
    os.replace(tmp, md_path)
    return markdown


def _finish(doc: dict, runner, md_path: str) -> None:
    from kernel_bench.report import best_configs
    from kernel_bench.runner import write_json_atomic

    doc["budget_exhausted"] = runner.budget.spent()
    doc["best_configs"] = best_configs(doc)
    doc["cuda_probe"] = runner.builder.probed
    counts = {}
    for row in doc["results"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    doc["status_counts"] = counts
    runner.flush()
    markdown = _write_markdown(doc, md_path)
    print("\n" + markdown, flush=True)
    print(f"rows by status: {counts}; wrote {runner.json_path} and {md_path} "
          f"in {runner.budget.elapsed():.0f} s", flush=True)
    write_json_atomic(runner.json_path, doc)


if __name__ == "__main__":
    sys.exit(main())
