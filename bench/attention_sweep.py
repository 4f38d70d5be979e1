"""The generated attention kernel's tiles at a drafter's decode shapes: which cache-slot block
(BLOCK_S), warp count and split count (SPLITS: programs sharing one walk, merged by the last)
serve a step of 1 or 2 new tokens per request fastest, walking the whole cache or only up to the
last visible slot (`kv_len`).

A drafter's step at batch 4-64 runs one program per (request, kv head): too few to fill the GPU,
so each program's walk over the cache is the attention's time. Per variant: device microseconds
per launch (bench/kernel_bench's `time_thunks`: a CUDA graph of REPLAYED_LAUNCHES
back-to-back launches, median of CUDA-event times), and its largest difference from
runtime/reference_ops.py's `attention_ref` in float32.

  python3 bench/attention_sweep.py --out bench/results/attention-sweep.json
  python3 bench/attention_sweep.py --shape zoo-gpu-small-drafter --batch-sizes 16,64 --out F

Off a GPU it runs one launch per variant in Triton's interpreter at --scale (a script check).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))      # bench/kernel_bench

from kernel_bench.measure import TimingSettings, time_thunks  # noqa: E402

from specpilot.bench.environment import environment  # noqa: E402
from specpilot.bench.shapes import get_preset  # noqa: E402
from specpilot.cli_common import positive_counts, positive_int  # noqa: E402
from specpilot.codegen.cache import build_triton_module  # noqa: E402
from specpilot.codegen.kernel_spec import kernel_spec  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fused_forward import DTYPE_NAMES  # noqa: E402
from specpilot.runtime.reference_ops import attention_ref  # noqa: E402
from specpilot.search.run_folder import write_json_atomic  # noqa: E402

REPLAYED_LAUNCHES = 20


def inputs(batch: int, t: int, capacity: int, context: int, heads: int, kv_heads: int,
           head_dim: int, dtype, device, seed: int):
    """q [B, T, H, D], the caches [B, S, Hkv, D], a causal mask [B, T, S] after `context`
    positions (rows' contexts differ by up to a quarter) and kv_len [B] (last visible + 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((batch, t, heads, head_dim), generator=gen)
    k = torch.randn((batch, capacity, kv_heads, head_dim), generator=gen)
    v = torch.randn((batch, capacity, kv_heads, head_dim), generator=gen)
    lengths = context - torch.randint(0, max(1, context // 4), (batch,), generator=gen)
    pos = lengths[:, None] + torch.arange(t)[None, :]
    mask = torch.arange(capacity)[None, None, :] <= pos[:, :, None]
    kv_len = pos[:, -1] + 1
    to = lambda x: x.to(device=device, dtype=dtype)     # noqa: E731
    return to(q), to(k), to(v), mask.to(device), kv_len.to(device)


def one_shape(args, preset, batch: int, t: int, device, graphs: bool) -> list:
    cfg = preset.config(args.scale)
    dtype = torch.bfloat16 if graphs else torch.float32
    capacity = args.context + args.slack
    q, k, v, mask, kv_len = inputs(batch, t, capacity, args.context, cfg.num_heads,
                                   cfg.num_kv_heads, cfg.head_dim, dtype, device, seed=batch + t)
    ref = attention_ref(q.double(), k.double(), v.double(), mask)
    rows = []
    for block_s, warps, splits, bounded in itertools.product(args.blocks, args.warps,
                                                             args.splits, (False, True)):
        variant = {"block_s": block_s, "num_warps": warps, "splits": splits, "kv_len": bounded}
        try:
            spec = kernel_spec("attention", DTYPE=DTYPE_NAMES[dtype], HEAD_DIM=cfg.head_dim,
                               BLOCK_S=block_s, num_warps=warps, SPLITS=splits)
        except SpecPilotError as exc:
            rows.append({**variant, "refused": str(exc)})
            continue
        kernel = build_triton_module(spec)
        out = torch.empty_like(q)
        workspace = (kernel.split_workspace(batch, t, cfg.num_heads, cfg.num_kv_heads, device)
                     if splits > 1 else None)

        def launch():
            kernel.launch(q, k, v, mask, out, kv_len=kv_len if bounded else None,
                          workspace=workspace)

        launch()
        error = (out.double() - ref).abs().max().item()
        us = (time_thunks([launch], TimingSettings(device.type, args.repeats,
                                                   REPLAYED_LAUNCHES))["us"]
              if graphs else None)
        rows.append({**variant, "us_per_launch": us, "max_abs_error": error})
    return rows


def add_cache_and_run_arguments(ap, context: int, slack: int) -> None:
    """The options an attention sweep shares: the cache (--context, --slack), --repeats,
    --scale and --out."""
    ap.add_argument("--context", type=positive_int, default=context)
    ap.add_argument("--slack", type=positive_int, default=slack,
                    help="cache slots past the context (a decoder's capacity holds its run)")
    ap.add_argument("--repeats", type=positive_int, default=30)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="zoo-gpu-small-drafter", help="a shape preset")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16, 64])
    ap.add_argument("--tokens", type=positive_counts, default=[1, 2],
                    help="new tokens per request (a step, a catch-up)")
    ap.add_argument("--blocks", type=positive_counts, default=[32, 64, 128, 256])
    ap.add_argument("--warps", type=positive_counts, default=[2, 4, 8])
    ap.add_argument("--splits", type=positive_counts, default=[1],
                    help="programs sharing one walk (SPLITS), e.g. 1,2,4,8")
    add_cache_and_run_arguments(ap, context=320, slack=136)
    args = ap.parse_args(argv)
    graphs = torch.cuda.is_available()
    device = torch.device("cuda" if graphs else "cpu")
    try:
        preset = get_preset(args.shape)
    except SpecPilotError as exc:
        ap.error(str(exc))
    results = []
    for batch, t in itertools.product(args.batch_sizes, args.tokens):
        rows = one_shape(args, preset, batch, t, device, graphs)
        results.append({"batch": batch, "tokens": t, "variants": rows})
        timed = [r for r in rows if r.get("us_per_launch") is not None]
        if timed:
            best = min(timed, key=lambda r: r["us_per_launch"])
            print(f"batch {batch} T {t}: best BLOCK_S {best['block_s']} warps "
                  f"{best['num_warps']} splits {best['splits']} kv_len {best['kv_len']}: "
                  f"{best['us_per_launch']:.2f} us", flush=True)
            for splits in args.splits:          # each split count's best, bounded
                mine = [r for r in timed if r["splits"] == splits and r["kv_len"]]
                if mine:
                    top = min(mine, key=lambda r: r["us_per_launch"])
                    print(f"  splits {splits}: {top['us_per_launch']:.2f} us (BLOCK_S "
                          f"{top['block_s']}, {top['num_warps']} warps)", flush=True)
        write_json_atomic(Path(args.out), {"environment": environment(device.type),
                                           "settings": vars(args), "shapes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
