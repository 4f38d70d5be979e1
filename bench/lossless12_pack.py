"""Measure the lossless12 packer: speed, and escape rate / bytes per weight by base granularity.

    python bench/lossless12_pack.py                  # 4096 x 14336 (a Llama-3-8B MLP matrix)
    python bench/lossless12_pack.py --rows 1024 --cols 4096 --no-table

Prints (1) C++ pack / unpack times (median of --repeats runs after one warm-up) next to the numpy
reference and the torch `decode_reference`, and (2) a table of escape rate and packed bytes per
weight for several weight distributions and base granularities (per tensor, per row, groups of G
columns), plus the same for a variant format with only 14 exponent codes (one code spent on
"escape"), which docs/lossless12.md compares against.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch

from specpilot import _C
from specpilot.codegen.formats.lossless12 import (decode_reference, escape_rate, pack_lossless12,
                                                  packed_nbytes, unpack_lossless12)
from specpilot.codegen.formats.lossless12_numpy import pack_numpy


ABLATION_ROWS = 1024  # the numpy ablation holds a [groups, 256] histogram; keep it small


def weight_distributions(n: int, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float32 weight matrices [n, k] of the kinds a checkpoint holds (or stresses the format)."""
    def student_t3():
        t = rng.standard_t(3.0, (n, k)).astype(np.float32)
        t *= np.float32(0.02 / math.sqrt(3.0))  # std 0.02 like the normal init, heavier tails
        return t

    return {
        "normal(0, 0.02)": lambda: (rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)),
        "normal(0, 1/sqrt(K))": lambda: (rng.standard_normal((n, k), dtype=np.float32)
                                         * np.float32(1 / math.sqrt(k))),
        "student-t(3), std 0.02": student_t3,
        "student-t(1.5) * 0.02": lambda: rng.standard_t(1.5, (n, k)).astype(np.float32) * np.float32(0.02),
        "normal, row scales lognormal(0,1)": lambda: (
            rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)
            * rng.lognormal(0.0, 1.0, (n, 1)).astype(np.float32)),
        "normal, 1% of columns x256": lambda: (
            rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)
            * np.where(rng.random(k) < 0.01, 256.0, 1.0).astype(np.float32)[None, :]),
    }


def escapes_with_window(bits: np.ndarray, group_size: int, window: int) -> int:
    """Escape count of the same base rule with a `window`-wide exponent range (for the ablation)."""
    n, k = bits.shape
    exponent = ((bits >> 7) & 0xFF).astype(np.int64)
    per_row = 1 if group_size == 0 else -(-k // group_size)
    gid = (np.zeros((n, k), np.int64) if group_size == 0
           else np.arange(n)[:, None] * per_row + (np.arange(k) // group_size)[None, :])
    groups = 1 if group_size == 0 else n * per_row
    hist = np.bincount((gid * 256 + exponent).ravel(), minlength=groups * 256).reshape(groups, 256)
    hist[:, 0] = 0
    cum = np.concatenate([np.zeros((groups, 1), np.int64), np.cumsum(hist, 1)], 1)
    b = np.arange(1, 257 - window)
    return int(hist.sum() - (cum[:, b + window] - cum[:, b]).max(1).sum())


def timed(fn, repeats: int) -> float:
    fn()  # warm-up: first-touch page faults of fresh output buffers are not the packer's cost
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_speed(n: int, k: int, repeats: int, rng: np.random.Generator) -> None:
    w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)).bfloat16()
    bits = w.view(torch.int16).numpy().view(np.uint16)
    print(f"speed, {n} x {k} bf16 normal(0, 0.02), median of {repeats}:")
    for group_size in (None, "row", 128, 64):
        t = pack_lossless12(w, group_size)
        assert torch.equal(unpack_lossless12(t).view(torch.int16), w.view(torch.int16))
        g = t.group_size or 0  # the C++ convention: 0 = per tensor, "row" stored as K
        pack_s = timed(lambda: _C.lossless12_pack(bits, g), repeats)
        api_s = timed(lambda: pack_lossless12(w, group_size), repeats)
        unpack_s = timed(lambda: unpack_lossless12(t), repeats)
        ref_s = timed(lambda: decode_reference(t), 1)
        # The numpy reference needs a [groups, 256] histogram: time it per tensor only.
        numpy_s = timed(lambda: pack_numpy(bits, g), 1) if g == 0 else float("nan")
        label = {None: "per tensor", "row": "per row"}.get(group_size, f"G={group_size}")
        print(f"  {label:10s} C++ pack {pack_s:6.3f} s  pack_lossless12 {api_s:6.3f} s  "
              f"C++ unpack {unpack_s:6.3f} s  | torch decode_reference {ref_s:6.2f} s  "
              f"numpy pack {numpy_s:6.2f} s")


def bench_table(n: int, k: int, rng: np.random.Generator) -> None:
    configs = [("tensor", None), ("row", k)] + [(f"G={g}", g) for g in (1024, 256, 128, 64, 32)]
    print(f"\nescape rate / bytes per weight, {n} x {k} (window of 15 exponent codes):")
    print(f"  {'distribution':36s}" + "".join(f"{name:>20s}" for name, _ in configs))
    ablation = []
    for name, make in weight_distributions(n, k, rng).items():
        w = torch.from_numpy(make()).bfloat16()
        cells = []
        for _, group_size in configs:
            g = group_size if group_size is None or group_size % 2 == 0 else group_size + 1
            t = pack_lossless12(w, g)
            cells.append(f"{escape_rate(t):9.2e} {packed_nbytes(t) / w.numel():.4f}")
        print(f"  {name:36s}" + "".join(f"{c:>20s}" for c in cells))
        bits = w[: min(n, ABLATION_ROWS)].view(torch.int16).numpy().view(np.uint16)
        ablation.append((name, [escapes_with_window(bits, g, width) / bits.size
                                for g in (0, 128) for width in (15, 14)]))
    print(f"\nablation, escape rate with 15 vs 14 exponent codes ({min(n, ABLATION_ROWS)} x {k}):")
    print(f"  {'distribution':36s}{'tensor/15':>12s}{'tensor/14':>12s}{'G=128/15':>12s}{'G=128/14':>12s}")
    for name, rates in ablation:
        print(f"  {name:36s}" + "".join(f"{r:12.2e}" for r in rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=14336)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-table", action="store_true", help="only measure speed")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"torch threads {torch.get_num_threads()}, C++ packer threads = hardware concurrency")
    bench_speed(args.rows, args.cols, args.repeats, rng)
    if not args.no_table:
        bench_table(args.rows, args.cols, rng)


if __name__ == "__main__":
    main()
