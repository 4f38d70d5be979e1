"""Linear layers of Llama-3.1-8B at decode/verify row counts: cuBLAS against our kernels.

Per (shape, M): torch F.linear (cuBLAS) on the bf16 weight, Triton `linear`, CUDA `gemv_bf16`
(M <= 8), Triton `linear_lossless12` and CUDA `gemv_lossless12` (M <= 8, both MATH variants) on the
same weight packed as lossless12. `default_specs` gives what lowering would choose (or the
family defaults when lowering is not importable); `sweep_specs` a handful of alternatives per
family, whose best per (shape, M) is reported as a tuning result.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

import specpilot.codegen.formats  # noqa: F401  (registers the linear_lossless12 family)
from specpilot.codegen.errors import KernelSpecError
from specpilot.codegen.families import next_power_of_two
from specpilot.codegen.kernel_spec import KernelSpec, kernel_spec

from .measure import compare, poison_, rotation_sets
from .runner import Runner, first_ok_us, row_base

LLAMA_8B_LINEARS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                    "down": (4096, 14336)}
SMOKE_LINEARS = {"qkv": (48, 32), "down": (32, 64)}
ROWS = (1, 4, 8, 16, 32, 64)
SMOKE_ROWS = (1, 4)
GEMV_MAX_ROWS = 8
PLANES = ("signmant", "expcode", "base", "escape_row_ptr", "escape_col", "escape_bits")


def _matmul_tiles(M: int, N: int, K: int, block_n_max: int, dot_block_k_min: int = 16) -> dict:
    try:
        from specpilot.codegen.lower import matmul_tiles
        return matmul_tiles(M, N, K, block_n_max, dot_block_k_min)
    except Exception:  # lowering not importable: the families' own defaults
        return {}


def _linear_tiles(M: int, N: int, K: int) -> dict:
    """The bf16 `linear` tiles lowering picks: the measured table where it covers M, else the
    computed defaults."""
    try:
        from specpilot.codegen.lower import measured_tiles
        tiles = measured_tiles(M, N, K)
    except Exception:  # lowering not importable
        tiles = None
    return tiles if tiles is not None else _matmul_tiles(M, N, K, 64)


def default_specs(M: int, N: int, K: int) -> Dict[str, KernelSpec]:
    """kernel name -> the spec lowering would pick for this linear (M_MAX is 8 for the CUDA
    GEMVs: they are instantiated per row count, so M_MAX only bounds the launch)."""
    specs = {
        "linear": kernel_spec("linear", **_linear_tiles(M, N, K)),
        "linear_lossless12": kernel_spec("linear_lossless12", BASE="row",
                                         **_matmul_tiles(M, N, K, 32, dot_block_k_min=32)),
    }
    if M <= GEMV_MAX_ROWS:
        specs["gemv_bf16"] = kernel_spec("gemv_bf16", M_MAX=GEMV_MAX_ROWS)
        specs["gemv_lossless12"] = kernel_spec("gemv_lossless12", M_MAX=GEMV_MAX_ROWS)
        specs["gemv_lossless12_mma"] = kernel_spec("gemv_lossless12", M_MAX=GEMV_MAX_ROWS, MATH="mma")
    return specs


def _valid(family: str, configs: List[dict]) -> List[KernelSpec]:
    specs = []
    for cfg in configs:
        try:
            spec = kernel_spec(family, **cfg)
        except KernelSpecError:  # e.g. a multiply-add tile past the register budget
            continue
        if spec not in specs:
            specs.append(spec)
    return specs


def sweep_specs(M: int, quick: bool) -> Dict[str, List[KernelSpec]]:
    """kernel name -> alternative specs to time for M rows (a few per family)."""
    bm = next_power_of_two(M)
    if M < 16:
        linear = [dict(USE_DOT=False, BLOCK_M=bm, BLOCK_N=n, BLOCK_K=k, num_warps=w, SPLIT_K=s)
                  for n, k, w, s in ((16, 256, 4, 1), (8, 512, 4, 1), (32, 128, 4, 1), (16, 256, 8, 1),
                                     (16, 128, 4, 2), (8, 256, 4, 4))]
        linear += [dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128),
                   dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2)]
        l12 = [dict(USE_DOT=False, BLOCK_M=bm, BLOCK_N=n, BLOCK_K=k, num_warps=w)
               for n, k, w in ((8, 512, 4), (8, 512, 8), (16, 256, 4), (8, 1024, 8), (32, 128, 4))]
        l12 += [dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=256),
                dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=256)]
    else:
        linear, l12 = [], []
        for m in (16, 32, 64):
            if m > M:
                continue
            linear += [dict(BLOCK_M=m, BLOCK_N=64, BLOCK_K=128), dict(BLOCK_M=m, BLOCK_N=128, BLOCK_K=64, num_warps=8),
                       dict(BLOCK_M=m, BLOCK_N=32, BLOCK_K=256, num_stages=4),
                       dict(BLOCK_M=m, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2)]
            l12 += [dict(USE_DOT=True, BLOCK_M=m, BLOCK_N=32, BLOCK_K=256),
                    dict(USE_DOT=True, BLOCK_M=m, BLOCK_N=64, BLOCK_K=128),
                    dict(USE_DOT=True, BLOCK_M=m, BLOCK_N=64, BLOCK_K=128, num_warps=8)]
    out = {"linear": _valid("linear", linear),
           "linear_lossless12": _valid("linear_lossless12", [dict(BASE="row", **c) for c in l12])}
    if M <= GEMV_MAX_ROWS:
        out["gemv_bf16"] = _valid("gemv_bf16", [
            dict(M_MAX=GEMV_MAX_ROWS, UNROLL=u, COLS_PER_WARP=c, WARPS_PER_BLOCK=w)
            for u, c, w in ((2, 2, 4), (4, 2, 4), (2, 4, 4), (2, 4, 8), (8, 1, 4), (4, 1, 8))])
        out["gemv_lossless12"] = _valid("gemv_lossless12", [
            dict(M_MAX=GEMV_MAX_ROWS, UNROLL=u, ROWS_PER_WARP=r, WARPS_PER_BLOCK=w)
            for u, r, w in ((4, 1, 4), (2, 2, 4), (4, 2, 4), (2, 4, 4), (1, 4, 8))])
        out["gemv_lossless12_mma"] = _valid("gemv_lossless12", [
            dict(M_MAX=GEMV_MAX_ROWS, MATH="mma", UNROLL=u, WARPS_PER_BLOCK=w)
            for u, w in ((4, 4), (2, 8), (4, 8), (1, 8), (2, 16))])
    if quick:
        out = {k: v[:3] for k, v in out.items()}
    return out


def all_cuda_specs(rows, quick: bool) -> List[KernelSpec]:
    """Every CUDA spec the run may need, defaults first (to start their builds early)."""
    specs: List[KernelSpec] = []
    for M in rows:
        specs += [s for s in default_specs(M, 64, 64).values() if s.backend == "cuda"]
    for M in rows:
        for group in sweep_specs(M, quick).values():
            specs += [s for s in group if s.backend == "cuda"]
    unique: List[KernelSpec] = []
    for s in specs:
        if s not in unique:
            unique.append(s)
    return unique


class LinearData:
    """One weight shape: bf16 weights and their lossless12 packing, each in several copies at
    different addresses, activations and outputs per row count, and float64 references."""

    def __init__(self, name: str, N: int, K: int, device: str, l2_bytes: int, rotate: bool):
        from specpilot.codegen.formats.lossless12 import pack_lossless12, packed_nbytes

        self.name, self.N, self.K, self.device = name, N, K, device
        w0 = (torch.randn(N, K, device=device) * 0.02).to(torch.bfloat16)
        sets = rotation_sets(N * K * 2, l2_bytes) if rotate else 1
        self.weights = [w0] + [w0.clone() for _ in range(sets - 1)]
        self.packed = None
        self.pack_error: Optional[str] = None
        try:
            packed0 = pack_lossless12(w0).to(device)
            self.packed_nbytes = packed_nbytes(packed0)
            copies = rotation_sets(self.packed_nbytes, l2_bytes) if rotate else 1
            self.packed = [packed0] + [dataclasses.replace(packed0, **{p: getattr(packed0, p).clone()
                                                                      for p in PLANES})
                                       for _ in range(copies - 1)]
        except Exception as exc:  # e.g. the C++ packer is not built: lossless12 rows are skipped
            self.pack_error = f"{type(exc).__name__}: {exc}"
        self._rows: Dict[int, Tuple[list, list, torch.Tensor]] = {}

    def rows(self, M: int) -> Tuple[list, list, torch.Tensor]:
        """(x per buffer set, out per buffer set, float64 reference of set 0)."""
        if M not in self._rows:
            n = max(len(self.weights), len(self.packed or ()))
            xs = [torch.randn(M, self.K, device=self.device).to(torch.bfloat16) for _ in range(n)]
            outs = [torch.empty(M, self.N, device=self.device, dtype=torch.bfloat16) for _ in range(n)]
            ref = xs[0].double() @ self.weights[0].double().T
            self._rows[M] = (xs, outs, ref)
        return self._rows[M]


def _shape(data: LinearData) -> dict:
    return {"N": data.N, "K": data.K}


def measure_cublas(runner: Runner, data: LinearData, M: int) -> dict:
    xs, _, ref = data.rows(M)
    base = row_base("linear", data.name, "cublas", "torch", "baseline", _shape(data), M)

    def prepare():
        ws = data.weights
        thunks = [lambda i=i: F.linear(xs[i], ws[i]) for i in range(len(ws))]
        return thunks, lambda: compare(F.linear(xs[0], ws[0]), ref)

    return runner.measure(base, prepare, (data.N * data.K + M * data.K + M * data.N) * 2)


def measure_kernel(runner: Runner, data: LinearData, M: int, kernel: str, spec: KernelSpec,
                   role: str, baseline_us: Optional[float]) -> dict:
    """Time our kernel `spec` on this shape (bf16 or lossless12 weights by family)."""
    xs, outs, ref = data.rows(M)
    lossless = spec.family in ("linear_lossless12", "gemv_lossless12")
    impl = "cuda" if spec.backend == "cuda" else "triton"
    base = row_base("linear", data.name, kernel, impl, role, _shape(data), M, spec)
    if lossless and data.packed is None:
        return runner.skip(base, f"lossless12 packing failed: {data.pack_error}")
    weights = data.packed if lossless else data.weights
    weight_bytes = data.packed_nbytes if lossless else data.N * data.K * 2

    def prepare():
        module = runner.builder.get(spec)
        thunks = [lambda i=i: module.launch(xs[i], weights[i], outs[i]) for i in range(len(weights))]

        def check():
            poison_(outs[0])
            module.launch(xs[0], weights[0], outs[0])
            return compare(outs[0], ref)
        return thunks, check

    return runner.measure(base, prepare, weight_bytes + (M * data.K + M * data.N) * 2, baseline_us)


def run_defaults(runner: Runner, data: LinearData, M: int) -> None:
    baseline = measure_cublas(runner, data, M)
    cublas_us = first_ok_us([baseline])
    for kernel, spec in default_specs(M, data.N, data.K).items():
        measure_kernel(runner, data, M, kernel, spec, "default", cublas_us)


def run_sweep(runner: Runner, data: LinearData, M: int, quick: bool, reserve_s: float) -> int:
    """Time the sweep configs not already measured; returns how many were left for the budget."""
    done = {(r["kernel"], str(r["spec"])) for r in runner.rows
            if r["group"] == "linear" and r["case"] == data.name and r["M"] == M}
    cublas_us = first_ok_us([r for r in runner.rows if r["group"] == "linear" and r["case"] == data.name
                             and r["M"] == M and r["kernel"] == "cublas"])
    skipped = 0
    for kernel, specs in sweep_specs(M, quick).items():
        for spec in specs:
            if (kernel, str(spec.as_dict())) in done:
                continue
            if spec.backend == "cuda" and not runner.builder.cuda_ok:
                continue  # the defaults already recorded why CUDA kernels cannot run here
            if runner.budget.spent(reserve_s):
                skipped += 1
                continue
            measure_kernel(runner, data, M, kernel, spec, "sweep", cublas_us)
    return skipped
