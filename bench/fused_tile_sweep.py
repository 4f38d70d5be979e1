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
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

from specpilot.bench.environment import environment
from specpilot.bench.shapes import build_preset
from specpilot.bench.step_costs import measure_forwards
from specpilot.codegen.cache import KernelCache, build_triton_module
from specpilot.codegen.fused_layer import fused_layer_specs
from specpilot.codegen.kernel_spec import KernelSpec
from specpilot.runtime.cuda_graphs import capture_graph
from specpilot.runtime.fused_forward import FusedForward
from specpilot.search.run_folder import write_json_atomic

LAUNCHES_PER_GRAPH, REPLAYS = 20, 30


def kernel_cases(cfg, rows: int, device) -> Dict[str, Tuple[tuple, dict, torch.Tensor]]:
    """Per kernel name: (launch args, launch kwargs, the output tensor), random bf16 operands at
    `cfg`'s shapes for `rows` tokens (one a request, so rows requests)."""
    bf = dict(dtype=torch.bfloat16, device=device)
    h, i, v, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    hq, hkv, capacity = cfg.num_heads, cfg.num_kv_heads, 256
    rand = lambda *shape: torch.randn(*shape, **bf) / 4                       # noqa: E731
    positions = torch.randint(0, capacity, (rows, 1), device=device)
    qkv_out = torch.empty((rows, 1, hq, d), **bf)
    cases = {
        "qkv": ((rand(rows, h), rand(h) + 1, rand((hq + 2 * hkv) * d, h), positions, positions,
                 torch.rand(d // 2, device=device), qkv_out, rand(rows, capacity, hkv, d),
                 rand(rows, capacity, hkv, d), 1e-5), {}, qkv_out),
    }
    o_out, down_out, mlp_out = (torch.empty((rows, h), **bf), torch.empty((rows, h), **bf),
                                torch.empty((rows, i), **bf))
    head_out = torch.empty((rows, v), dtype=torch.float32, device=device)
    cases["o_proj"] = ((rand(rows, hq * d), rand(h, hq * d), o_out), dict(residual=rand(rows, h)),
                       o_out)
    cases["mlp"] = ((rand(rows, h), rand(h) + 1, rand(i, h), rand(i, h), mlp_out, 1e-5), {},
                    mlp_out)
    cases["down"] = ((rand(rows, i), rand(h, i), down_out), dict(residual=rand(rows, h)),
                     down_out)
    cases["head"] = ((rand(rows, h), rand(v, h), head_out),
                     dict(norm_weight=rand(h) + 1, eps=1e-5), head_out)
    return cases


def variants(name: str, default: KernelSpec, k: int) -> List[KernelSpec]:
    """The tiles tried for kernel `name` (reduction length k): reduction steps from 128 up to
    the first that covers k, with column blocks, warps and pipelining depths."""
    steps = [s for s in (128, 256, 512, 1024) if s < 2 * k]
    columns = {"qkv": [None], "head": [16, 32, 64, 128]}.get(name, [16, 32])
    out = []
    for step, cols, warps, stages in itertools.product(steps, columns, (2, 4, 8), (1, 2)):
        params = dict(default.params)
        params.update(BLOCK_K=step, num_warps=warps, num_stages=stages)
        if cols is not None:
            params["BLOCK_N"] = cols
        try:
            out.append(KernelSpec(default.family, tuple(params.items())))
        except Exception:     # a tile its family refuses (e.g. a register budget)
            continue
    return out


def time_launches(launch: Callable[[], None], device) -> float:
    """Median microseconds of one launch: LAUNCHES_PER_GRAPH launches in one graph."""
    def body():
        for _ in range(LAUNCHES_PER_GRAPH):
            launch()
    graph, _ = capture_graph(body, device)
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / LAUNCHES_PER_GRAPH)
    return statistics.median(times)


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
    ap.add_argument("--rows", default="16,80", help="tokens a launch (first: picks the fastest)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the sweep captures CUDA graphs: it needs a GPU")
    device = torch.device("cuda")
    model = build_preset(args.preset, "cuda", torch.bfloat16, 1.0, seed=2)
    cfg = model.config
    defaults = fused_layer_specs("bf16", cfg.hidden_size, cfg.num_heads, cfg.head_dim,
                                 cfg.intermediate_size, cfg.vocab_size)
    reduction = {"qkv": cfg.hidden_size, "o_proj": cfg.num_heads * cfg.head_dim,
                 "mlp": cfg.hidden_size, "down": cfg.intermediate_size, "head": cfg.hidden_size}
    row_counts = [int(r) for r in args.rows.split(",")]
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
        default_us = next(r["us"][first] for r in rows if r["default"]) if any(
            r["default"] for r in rows) else None
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
