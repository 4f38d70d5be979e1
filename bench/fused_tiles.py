"""What a forward in the fused layer kernels costs by row tile and with programmatic dependent
launch, against the model's own per-op forward, for the target and the drafter of a shape pair.

runtime/fused_forward.py runs calls of up to 16 tokens in 16-row tiles and longer ones (a
verification's k + 1 tokens a request, a drafter's catch-up) in wide tiles, and on Hopper
launches its kernels with PDL. Each row block re-reads the layer's weights, so a call of 80
tokens in 16-row tiles reads them five times. Here, per model and call (batch x tokens a
request), the device time of one captured forward:

  per_op                 the model's own forward (cuBLAS, cuDNN's attention)
  fused_<rows>[_pdl]     the fused kernels, `rows` tokens a program (16 for calls of up to 16
                         tokens), with or without PDL

and each variant's largest difference from the per-op logits (bf16: roundings differ).

  python3 bench/fused_tiles.py --out bench/results/fused-tiles.json
  python3 bench/fused_tiles.py --calls 16x1,16x5 --wide-rows 32,64 --out FILE

Random weights at the context given (default 192 positions, mid-run for HumanEval prompts and
256 new tokens). Off a GPU it runs uncaptured in float32 with Triton's interpreter (--scale
shrinks the models), to check the script.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.bench.environment import environment  # noqa: E402
from specpilot.bench.shapes import random_pair  # noqa: E402
from specpilot.bench.step_costs import time_median, timed_runs  # noqa: E402
from specpilot.cli_common import positive_counts  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.cuda_graphs import capture_graph  # noqa: E402
from specpilot.runtime.fused_forward import (MAX_FUSED_TOKENS, FusedForward,  # noqa: E402
                                             pdl_available)
from specpilot.search.run_folder import write_json_atomic  # noqa: E402

WARMUP, REPEATS = 5, 50


def parse_calls(text: str) -> List[Tuple[int, int]]:
    """"4x1,16x5" -> [(4, 1), (16, 5)]: batch x tokens a request."""
    calls = []
    for part in text.split(","):
        try:
            b, t = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a call is BATCHxTOKENS (e.g. 16x5), got {part!r}")
        if b < 1 or t < 1:
            raise argparse.ArgumentTypeError(f"batch and tokens must be positive, got {part!r}")
        calls.append((b, t))
    return calls


def call_inputs(model, batch: int, width: int, context: int, seed: int):
    """(tokens, positions, mask, cache) of a call of `width` tokens a request after `context`
    positions, the cache's earlier slots random (the attention reads them)."""
    dev = model.device
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (batch, width), generator=g).to(dev)
    pos = (context + torch.arange(width))[None, :].expand(batch, width).contiguous().to(dev)
    capacity = context + width
    mask = (torch.arange(capacity, device=dev)[None, None, :] <= pos[:, :, None]).contiguous()
    cache = model.new_cache(batch, capacity)
    for t in cache.k + cache.v:
        t.normal_(0.0, 1.0)
    return tokens, pos, mask, cache


def variants(model, kernel_cache, wide_rows: List[int], m: int, pdl_options: List[bool]):
    """{name: forward} of the fused variants that differ for a call of m tokens."""
    rows_options = [16] if m <= 16 else wide_rows
    out = {}
    for rows in rows_options:
        for pdl in pdl_options:
            fused = FusedForward(model, kernel_cache, wide_rows=rows, pdl=pdl)
            out[f"fused_{rows}" + ("_pdl" if pdl else "")] = fused.forward
    return out


def one_call(model, role: str, batch: int, width: int, args, kernel_cache, graphs: bool) -> dict:
    m = batch * width
    tokens, pos, mask, cache = call_inputs(model, batch, width, args.context, seed=batch * 31 + width)
    forwards = {"per_op": model.forward}
    if m <= MAX_FUSED_TOKENS:
        pdl_options = [False, True] if pdl_available(model.device) else [False]
        forwards.update(variants(model, kernel_cache, args.wide_rows, m, pdl_options))
    row = {"model": role, "batch": batch, "tokens_per_request": width, "rows": m, "ms": {},
           "max_abs_diff_vs_per_op": {}}
    reference = None
    for name, forward in forwards.items():
        fn = lambda f=forward: f(tokens, pos, pos, mask, cache)   # noqa: E731
        if graphs:
            graph, logits = capture_graph(fn, model.device)
            run = graph.replay
        else:
            logits, run = fn(), fn
        row["ms"][name] = time_median(run, model.device,
                                      *timed_runs(graphs, WARMUP, REPEATS)) * 1e3
        out = logits.float().clone()
        if reference is None:
            reference = out
        row["max_abs_diff_vs_per_op"][name] = float((out - reference).abs().max())
    return row


def report(row: dict) -> str:
    base = row["ms"]["per_op"]
    parts = [f"{name} {ms:.3f} ({base / ms:.2f}x)" for name, ms in row["ms"].items()]
    return f"{row['model']} {row['batch']}x{row['tokens_per_request']}: " + ", ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter",
                    help="TARGET:DRAFTER shape presets (random weights)")
    ap.add_argument("--models", default="target,drafter",
                    help="which of the pair to time: target, drafter or both")
    ap.add_argument("--calls", type=parse_calls, default=parse_calls("4x1,16x1,64x1,4x5,16x5"),
                    help="BATCHxTOKENS calls, comma-separated")
    ap.add_argument("--wide-rows", type=positive_counts, default=[32, 64],
                    help="row tiles to try for calls past 16 tokens (16, 32, 64)")
    ap.add_argument("--context", type=int, default=192, help="cache positions before the call")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the models (script checks)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    roles = [r.strip() for r in args.models.split(",") if r.strip()]
    if not roles or any(r not in ("target", "drafter") for r in roles):
        ap.error(f"--models takes target and/or drafter, got {args.models!r}")
    if any(r not in (16, 32, 64) for r in args.wide_rows):
        ap.error(f"--wide-rows takes 16, 32 and/or 64, got {args.wide_rows}")
    if args.context < 0:
        ap.error("--context must be >= 0")
    try:
        target, drafter, graphs = random_pair(args.shapes, args.scale)
    except SpecPilotError as exc:
        ap.error(str(exc))
    from specpilot.codegen.cache import KernelCache
    kernel_cache = KernelCache()
    models: Dict[str, object] = {"target": target, "drafter": drafter}
    rows, started = [], time.perf_counter()
    for role in roles:
        for batch, width in args.calls:
            rows.append(one_call(models[role], role, batch, width, args, kernel_cache, graphs))
            print(report(rows[-1]), f"({time.perf_counter() - started:.0f} s)", flush=True)
            write_json_atomic(Path(args.out), {"environment": environment(target.device.type),
                                               "settings": vars(args), "calls": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
