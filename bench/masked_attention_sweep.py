"""Attention with an explicit mask at a verification's shapes: how each way of computing it
scales with the tokens a request verifies (1 for a plain step, 5 for chain(4), 21 and 65 for
trees of 20 and 64 nodes).

A tree round's attention runs with a mask (the tree's ancestors), through
`runtime/fast_ops.grouped_sdpa`, which folds each kv head's query heads into the query rows:
65 tokens of a target with four query heads a kv head are 260 query rows. Measured on the
H200 (bench/tree_round_cost.py's kernel lists), cuDNN's SDPA took 35 µs a call in a
tree([4, 3, 2, 1]) round against 9 µs in chain(4)'s. This script times, per shape:

  grouped          grouped_sdpa as the runtime calls it (PyTorch picks the backend)
  grouped_<name>   the same with one SDPA backend forced (cudnn, efficient, math)
  grouped_padded_mask  grouped with the mask's rows padded to 8 slots (an odd cache's mask
                   rows are otherwise an odd number of bytes apart)
  expanded_<name>  kv heads repeated to the query heads, the mask broadcast over heads
  generated        the generated Triton attention kernel (the fused drafter's), bounded by
                   each request's last visible slot

Each: device microseconds per call (bench/kernel_bench's `time_thunks`: a CUDA graph of
REPLAYED_LAUNCHES calls, median of CUDA-event times), and its largest difference from
runtime/reference_ops.py's `attention_ref` in float64. A backend that refuses a shape is
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))      # bench/kernel_bench

from kernel_bench.measure import TimingSettings, time_thunks  # noqa: E402

from specpilot.bench.environment import environment  # noqa: E402
from specpilot.bench.shapes import get_preset  # noqa: E402
from specpilot.cli_common import positive_counts, positive_int  # noqa: E402
from specpilot.codegen.cache import build_triton_module  # noqa: E402
from specpilot.codegen.kernel_spec import kernel_spec  # noqa: E402
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
    """q [B, T, H, D], the caches [B, S, Hkv, D], kv_len [B], and a tree's mask [B, T, S]: each
    request sees its committed prefix (contexts differ by up to a quarter) and, among its T new
    slots, a random tree's ancestors (node i's parent drawn below i) and itself."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((batch, t, heads, head_dim), generator=gen)
    k = torch.randn((batch, capacity, kv_heads, head_dim), generator=gen)
    v = torch.randn((batch, capacity, kv_heads, head_dim), generator=gen)
    lengths = context - torch.randint(0, max(1, context // 4), (batch,), generator=gen)
    ancestors = torch.eye(t, dtype=torch.bool)
    for i in range(1, t):
        parent = int(torch.randint(0, i, (1,), generator=gen))
        ancestors[i] |= ancestors[parent]
    slots = torch.arange(capacity)
    mask = slots[None, None, :] < lengths[:, None, None]
    mask = mask.expand(batch, t, capacity).clone()
    for b in range(batch):
        mask[b, :, lengths[b]:lengths[b] + t] = ancestors
    kv_len = lengths + t
    to = lambda x: x.to(device=device, dtype=dtype)     # noqa: E731
    return to(q), to(k), to(v), mask.to(device), kv_len.to(device)


def expanded_sdpa(q, k_cache, v_cache, mask, scale):
    """q [B, T, H, D] with every kv head repeated to its query heads; the mask [B, 1, T, S]
    broadcast over the heads (no copy of it per head)."""
    group = q.shape[2] // k_cache.shape[2]
    k = k_cache.transpose(1, 2).repeat_interleave(group, dim=1)
    v = v_cache.transpose(1, 2).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None],
                                         scale=scale)
    return out.transpose(1, 2)


def padded_grouped_sdpa(q, k_cache, v_cache, mask, scale):
    """grouped_sdpa with the expanded mask's rows padded to a multiple of 8 slots (the view
    keeps S columns): whether the mask's row stride, odd with an odd cache, is what makes
    cuDNN's kernel slower there."""
    b, t, h, d = q.shape
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    rows = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    padded = F.pad(mask, (0, -s % 8))
    visible = padded[:, None, None].expand(b, 1, g, t, padded.shape[-1]).reshape(
        b, 1, g * t, padded.shape[-1])[..., :s]
    out = F.scaled_dot_product_attention(rows, k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                         attn_mask=visible, scale=scale)
    return out.reshape(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h, d)


def variants(q, k, v, mask, kv_len, scale, dtype):
    """name → a thunk computing [B, T, H, D] (or a reason it cannot run at this shape)."""
    from torch.nn.attention import sdpa_kernel

    b, t, h, d = q.shape

    def grouped(backend=None):
        def run():
            if backend is None:
                return grouped_sdpa(q, k, v, mask, scale).reshape(b, t, h, d)
            with sdpa_kernel(_backend(backend)):
                return grouped_sdpa(q, k, v, mask, scale).reshape(b, t, h, d)
        return run

    def expanded(backend):
        def run():
            with sdpa_kernel(_backend(backend)):
                return expanded_sdpa(q, k, v, mask, scale)
        return run

    out = {"grouped": grouped(),
           "grouped_padded_mask": lambda: padded_grouped_sdpa(q, k, v, mask, scale)}
    for name in BACKENDS:
        out[f"grouped_{name}"] = grouped(name)
        out[f"expanded_{name}"] = expanded(name)
    spec = kernel_spec("attention", DTYPE=DTYPE_NAMES[dtype], HEAD_DIM=d, BLOCK_S=64,
                       num_warps=4)
    kernel = build_triton_module(spec)
    result = torch.empty_like(q)

    def generated():
        kernel.launch(q, k, v, mask, result, kv_len=kv_len)
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
        except RuntimeError as exc:      # a backend that does not take this shape or mask
            rows.append({"variant": name, "refused": str(exc).splitlines()[0][:300]})
            continue
        rows.append({"variant": name, "us_per_call": us, "max_abs_error": error})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="zoo-gpu-small,zoo-gpu-small-drafter",
                    help="shape presets, comma-separated")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[1, 4, 16, 64])
    ap.add_argument("--tokens", type=positive_counts, default=[1, 5, 21, 65],
                    help="tokens a request verifies (a step, chain(4), trees of 20, 64 nodes)")
    ap.add_argument("--context", type=positive_int, default=256)
    ap.add_argument("--slack", type=positive_int, default=200,
                    help="cache slots past the context (a decoder's capacity holds its run)")
    ap.add_argument("--repeats", type=positive_int, default=30)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    graphs = torch.cuda.is_available()
    device = torch.device("cuda" if graphs else "cpu")
    presets = []
    for name in args.shapes.split(","):
        try:
            presets.append((name, get_preset(name)))
        except Exception as exc:        # SpecPilotError: an unknown name, with the known ones
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
