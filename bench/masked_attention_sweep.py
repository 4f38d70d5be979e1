"""Attention with an explicit mask at a verification's shapes: how each way of computing it
scales with the tokens a request verifies (1 for a plain step, 5 for chain(4), 21 and 65 for
trees of 20 and 64 nodes).

A tree round's attention runs with a mask (the tree's ancestors), through
`runtime/fast_ops.grouped_sdpa`, which folds each kv head's query heads into the query rows:
65 tokens of a target with four query heads a kv head are 260 query rows. This script times,
per shape:

  grouped          grouped_sdpa as the runtime calls it (PyTorch picks the backend)
  grouped_<name>   the same with one SDPA backend forced (cudnn, efficient, math)
  expanded_<name>  kv heads repeated to the query heads in the call, the mask broadcast
  gqa              SDPA's own grouped-query attention (enable_gqa)
  grouped_additive, grouped_additive_padded   cuDNN with the grouped layout's mask made
                   beforehand as 0 / -inf, its rows S slots apart or padded to a multiple of 8:
                   whether an odd row stride (an odd slot count) is what slows cuDNN. Time an
                   odd cache (--slack 201: 457 slots) against an even one (--slack 200).
  generated        the generated Triton attention kernel (the fused drafter's), bounded by
                   each request's last visible slot

Each: device microseconds per call (bench/kernel_bench's `time_thunks`: a CUDA graph of
REPLAYED_LAUNCHES calls, median of CUDA-event times), and its largest difference from
runtime/reference_ops.py's `attention_ref` in float64. A variant that cannot run a shape is
recorded with its error.

  python3 bench/masked_attention_sweep.py --out bench/results/masked-attention-sweep.json

Off a GPU every variant runs once in float32 (a check of the script, nothing timed).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))      # bench/: its modules

from attention_sweep import add_cache_and_run_arguments, inputs  # noqa: E402
from kernel_bench.measure import TimingSettings, time_thunks  # noqa: E402

from specpilot.bench.environment import environment  # noqa: E402
from specpilot.bench.shapes import get_preset  # noqa: E402
from specpilot.cli_common import positive_counts  # noqa: E402
from specpilot.codegen.cache import build_triton_module  # noqa: E402
from specpilot.codegen.kernel_spec import kernel_spec  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fast_ops import grouped_sdpa  # noqa: E402
from specpilot.runtime.fused_forward import DTYPE_NAMES  # noqa: E402
from specpilot.runtime.reference_ops import attention_ref  # noqa: E402
from specpilot.search.run_folder import write_json_atomic  # noqa: E402

REPLAYED_LAUNCHES = 20
BACKENDS = ("cudnn", "efficient", "math")


def _backend(name: str):
    from torch.nn.attention import SDPBackend
    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[name]


def tree_inputs(batch: int, t: int, capacity: int, context: int, heads: int, kv_heads: int,
                head_dim: int, dtype, device, seed: int):
    """attention_sweep.py's inputs (q, the caches, kv_len; contexts differ by up to a quarter)
    with a tree's mask [B, T, S] for the T new slots: each request sees its committed prefix,
    a random tree's ancestors (node i's parent drawn below i) and itself."""
    q, k, v, mask, kv_len = inputs(batch, t, capacity, context, heads, kv_heads, head_dim,
                                   dtype, device, seed)
    gen = torch.Generator().manual_seed(seed)
    ancestors = torch.eye(t, dtype=torch.bool)
    for i in range(1, t):
        parent = int(torch.randint(0, i, (1,), generator=gen))
        ancestors[i] |= ancestors[parent]
    for b, start in enumerate((kv_len - t).tolist()):
        mask[b, :, start:start + t] = ancestors.to(mask.device)
    return q, k, v, mask, kv_len


def expanded_sdpa(q, k_cache, v_cache, mask, scale):
    """q [B, T, H, D] with every kv head repeated to its query heads (the repeat inside the
    call, as a runtime without grouped attention pays it); the mask [B, T, S] broadcast over
    the heads (no copy of it per head)."""
    group = q.shape[2] // k_cache.shape[2]
    k = k_cache.transpose(1, 2).repeat_interleave(group, dim=1)
    v = v_cache.transpose(1, 2).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None],
                                         scale=scale)
    return out.transpose(1, 2)


def gqa_sdpa(q, k_cache, v_cache, mask, scale):
    """SDPA's own grouped-query attention (`enable_gqa`): no repeat, no folded rows."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k_cache.transpose(1, 2),
                                         v_cache.transpose(1, 2), attn_mask=mask[:, None],
                                         scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def additive_rows(mask, group: int, dtype, pad_to: int = 1):
    """The grouped layout's mask [B, 1, G*T, S] as 0 / -inf in `dtype`, made once (outside
    the timed call), in a buffer whose rows are padded to a multiple of `pad_to` slots: a
    view of S columns, `pad_to` apart. (A bool mask is turned into a new dense additive one
    inside SDPA, so only an additive mask lets the row stride reach the kernel.)"""
    b, t, s = mask.shape
    width = -(-s // pad_to) * pad_to
    out = torch.full((b, 1, group * t, width), float("-inf"), dtype=dtype, device=mask.device)
    rows = mask[:, None, None].expand(b, 1, group, t, s).reshape(b, 1, group * t, s)
    out[..., :s].masked_fill_(rows, 0.0)
    return out[..., :s]


def grouped_additive_sdpa(q, k_cache, v_cache, rows_mask, scale):
    """grouped_sdpa's layout with a ready additive mask (`additive_rows`)."""
    b, t, h, d = q.shape
    hkv = k_cache.shape[2]
    g = h // hkv
    rows = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    out = F.scaled_dot_product_attention(rows, k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                         attn_mask=rows_mask, scale=scale)
    return out.reshape(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h, d)


def variants(q, k, v, mask, kv_len, scale, dtype):
    """name → a thunk computing [B, T, H, D]."""
    from torch.nn.attention import sdpa_kernel

    b, t, h, d = q.shape
    group = h // k.shape[2]

    def forced(backend, fn, *args):
        def run():
            if backend is None:
                return fn(*args)
            with sdpa_kernel(_backend(backend)):
                return fn(*args)
        return run

    def grouped(q, k, v, mask, scale):
        return grouped_sdpa(q, k, v, mask, scale).reshape(b, t, h, d)

    out = {"grouped": forced(None, grouped, q, k, v, mask, scale)}
    for name in BACKENDS:
        out[f"grouped_{name}"] = forced(name, grouped, q, k, v, mask, scale)
        out[f"expanded_{name}"] = forced(name, expanded_sdpa, q, k, v, mask, scale)
    out["gqa"] = forced(None, gqa_sdpa, q, k, v, mask, scale)
    # The row stride alone: the same additive mask, rows S apart or padded to 8 slots, both
    # through cuDNN (off a GPU, through what runs there: a check of the masks).
    for label, pad_to in (("grouped_additive", 1), ("grouped_additive_padded", 8)):
        rows_mask = additive_rows(mask, group, dtype, pad_to)
        out[label] = forced("cudnn" if q.is_cuda else None, grouped_additive_sdpa, q, k, v,
                            rows_mask, scale)
    result, built = torch.empty_like(q), []

    def generated():
        # Built at the first (untimed) call, inside the caller's try: a head_dim the kernel
        # does not take is a refused variant, not the end of the sweep.
        if not built:
            built.append(build_triton_module(kernel_spec(
                "attention", DTYPE=DTYPE_NAMES[dtype], HEAD_DIM=d, BLOCK_S=64, num_warps=4)))
        built[0].launch(q, k, v, mask, result, scale, kv_len=kv_len)
        return result
    out["generated"] = generated
    return out


def one_shape(args, preset, batch: int, t: int, device, graphs: bool) -> list:
    cfg = preset.config(args.scale)
    dtype = torch.bfloat16 if graphs else torch.float32
    q, k, v, mask, kv_len = tree_inputs(batch, t, args.context + args.slack, args.context,
                                        cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype,
                                        device, seed=batch * 1000 + t)
    scale = cfg.head_dim ** -0.5
    ref = attention_ref(q.double(), k.double(), v.double(), mask, scale=scale)
    rows = []
    for name, thunk in variants(q, k, v, mask, kv_len, scale, dtype).items():
        try:
            error = (thunk().double() - ref).abs().max().item()
            us = (time_thunks([thunk], TimingSettings(device.type, args.repeats,
                                                      REPLAYED_LAUNCHES))["us"]
                  if graphs else None)
        except Exception as exc:    # noqa: BLE001 - a backend that does not take this shape
            # or mask (SDPA raises RuntimeError, a kernel's launch other kinds): recorded, and
            # the sweep goes on to the next variant, unless the GPU itself failed (a sticky
            # error would fail every later variant and leave a misleading file).
            if graphs:
                torch.cuda.synchronize()
            first = (str(exc).splitlines() or [""])[0]
            rows.append({"variant": name, "refused": f"{type(exc).__name__}: {first}"[:300]})
            continue
        rows.append({"variant": name, "us_per_call": us, "max_abs_error": error})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="zoo-gpu-small,zoo-gpu-small-drafter",
                    help="shape presets, comma-separated (each model's attention alone)")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[1, 4, 16, 64])
    ap.add_argument("--tokens", type=positive_counts, default=[1, 5, 21, 65],
                    help="tokens a request verifies (a step, chain(4), trees of 20, 64 nodes)")
    add_cache_and_run_arguments(ap, context=256, slack=200)
    args = ap.parse_args(argv)
    graphs = torch.cuda.is_available()
    device = torch.device("cuda" if graphs else "cpu")
    presets = []
    for name in args.presets.split(","):
        try:
            presets.append((name, get_preset(name)))
        except SpecPilotError as exc:   # an unknown name, with the known ones
            ap.error(str(exc))
    if max(args.tokens) > args.slack:
        ap.error(f"--slack {args.slack} must hold the largest --tokens {max(args.tokens)}")
    results = []
    for (name, preset), batch, t in itertools.product(presets, args.batch_sizes, args.tokens):
        rows = one_shape(args, preset, batch, t, device, graphs)
        results.append({"shape": name, "batch": batch, "tokens": t, "variants": rows})
        timed = {r["variant"]: r["us_per_call"] for r in rows if r.get("us_per_call")}
        if timed:
            best = min(timed, key=timed.get)
            print(f"{name} batch {batch} T {t}: grouped {timed.get('grouped', float('nan')):.1f}"
                  f" us, best {best} {timed[best]:.1f} us", flush=True)
        write_json_atomic(Path(args.out), {"environment": environment(device.type),
                                           "settings": vars(args), "shapes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
