"""The fused layer kernels' tiles at a small model's decode shapes, and what the fastest do to a
whole forward.

A drafter step in fused kernels (runtime/fused_forward.py) is bound by latency: each kernel
moves little data, and its time is the chain of memory round trips its programs walk (the norm's
statistics, then each reduction step). This sweep times every kernel of a layer and the LM head
(random bf16 operands at the model's shapes, batch x tokens rows) over reduction steps, column
blocks, warps and pipelining depths, each launch captured 20 times in a CUDA graph (median of
the replays, per launch). Each variant's output is checked against the default tiles' output.

Then the model's forward is timed as a graph (specpilot/bench/step_costs.py's
`measure_forwards`, at context 192) with the default tiles and with each kernel's fastest at
the first row count. (The defaults are codegen/fused_layer.py's, so after that file takes the
sweep's choices, a new sweep starts from them.)

    python3 bench/fused_tile_sweep.py --out bench/results/fused-tile-sweep.json

GPU only (it captures CUDA graphs).
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import List

import torch

from specpilot.bench.environment import environment
from specpilot.bench.fused_kernel_cases import kernel_cases, preset_with_specs, time_launches
from specpilot.bench.step_costs import measure_forwards
from specpilot.cli_common import positive_counts
from specpilot.codegen.cache import KernelCache, build_triton_module
from specpilot.codegen.errors import KernelSpecError
from specpilot.codegen.kernel_spec import KernelSpec
from specpilot.runtime.fused_forward import FusedForward
from specpilot.search.run_folder import write_json_atomic


def variants(name: str, default: KernelSpec, k: int) -> List[KernelSpec]:
    """The tiles tried for kernel `name` (reduction length k): reduction steps from 128 up to
    the first that covers k, with column blocks, warps and pipelining depths."""
    steps = [s for s in (128, 256, 512, 1024) if s < 2 * k]
    columns = {"qkv": [None], "head": [16, 32, 64, 128]}.get(name, [16, 32])
    out = []
    for step, cols, warps, stages in itertools.product(steps, columns, (2, 4, 8), (1, 2)):
        tiles = dict(BLOCK_K=step, num_warps=warps, num_stages=stages)
        if cols is not None:
            tiles["BLOCK_N"] = cols
        try:
            out.append(default.with_params(**tiles))
        except KernelSpecError:     # a tile its family refuses (e.g. a register budget)
            continue
    return out


def sweep_kernel(name, default, cases_by_rows, k, cache, device) -> List[dict]:
    rows_out = []
    reference = {}
    for rows, cases in cases_by_rows.items():
        args, kwargs, out = cases[name]
        build_triton_module(default, cache).launch(*args, **kwargs)
        reference[rows] = out.clone()
    for spec in variants(name, default, k):
        module = build_triton_module(spec, cache)
        row = {"kernel": name, "spec": str(spec), "default": spec == default, "us": {},
               "max_diff": {}, "_spec": spec}
        for rows, cases in cases_by_rows.items():
            args, kwargs, out = cases[name]
            launch = lambda: module.launch(*args, **kwargs)    # noqa: E731
            row["us"][rows] = time_launches(launch, device)
            launch()
            row["max_diff"][rows] = (out.float() - reference[rows].float()).abs().max().item()
        rows_out.append(row)
        print(f"  {name:7s} " + " ".join(f"{r}:{us:6.2f}us" for r, us in row["us"].items())
              + f"  diff {max(row['max_diff'].values()):.3g}  {spec}", flush=True)
    return rows_out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="zoo-gpu-small-drafter", help="model shape preset")
    ap.add_argument("--rows", type=positive_counts, default=[16, 80],
                    help="tokens a launch (the first picks the fastest)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the sweep captures CUDA graphs: it needs a GPU")
    device = torch.device("cuda")
    model, defaults = preset_with_specs(args.preset, "cuda")
    cfg = model.config
    reduction = {"qkv": cfg.hidden_size, "o_proj": cfg.num_heads * cfg.head_dim,
                 "mlp": cfg.hidden_size, "down": cfg.intermediate_size, "head": cfg.hidden_size}
    row_counts = args.rows
    torch.manual_seed(0)
    cases_by_rows = {r: kernel_cases(cfg, r, device) for r in row_counts}
    cache = KernelCache()
    started = time.perf_counter()
    kernels, best = [], {}
    for name, k in reduction.items():
        rows = sweep_kernel(name, defaults[name], cases_by_rows, k, cache, device)
        kernels += rows
        first = row_counts[0]
        fastest = min(rows, key=lambda r: r["us"][first])
        best[name] = fastest["_spec"]
        default_us = next((r["us"][first] for r in rows if r["default"]), None)
        print(f"{name}: fastest {fastest['us'][first]:.2f} us ({fastest['spec']}), default "
              f"{default_us if default_us is None else round(default_us, 2)} us "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    forwards = {}
    for label, specs in (("default tiles", None), ("fastest tiles", best)):
        fused = FusedForward(model, kernel_cache=cache, specs=specs)
        for batch, widths in ((16, (1, 5)), (64, (1,))):
            ms = measure_forwards(fused, batch, widths, 192, True, 5, 40)
            forwards.setdefault(label, {})[batch] = {w: s * 1e3 for w, s in ms.items()}
        print(f"forward, {label}: {forwards[label]}", flush=True)
    write_json_atomic(Path(args.out), {"environment": environment("cuda"), "settings": vars(args),
                                       "defaults": {n: str(s) for n, s in defaults.items()},
                                       "fastest": {n: str(s) for n, s in best.items()},
                                       "kernels": [{k: v for k, v in r.items() if k != "_spec"}
                                                   for r in kernels],
                                       "forward_ms": forwards})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
