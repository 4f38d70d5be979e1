"""Escape rate of the lossless12 format on real checkpoints and on random init.

Usage: python bench/lossless12_escape_rates.py [--checkpoint DIR ...] [--zoo PRESET] [--out FILE]

For each checkpoint, every linear weight (q/k/v/o, gate/up/down, lm_head) is cast to bf16,
packed with one base per row (the packer's default), and its escape rate and bytes per weight
reported; the same shapes drawn from normal(0, 0.02) are the random-init baseline.
"""
import argparse
import json
import os
import sys
import time

import torch

from specpilot.codegen.formats.lossless12 import escape_rate, pack_lossless12, packed_nbytes
from specpilot.runtime.checkpoint import load_state_dict


def _linear_weights(state):
    for name, t in sorted(state.items()):
        if t.ndim == 2 and (name.endswith("proj.weight") or name == "lm_head.weight"):
            yield name, t


def measure(state, label):
    rows, escapes, weights, nbytes = [], 0, 0, 0
    for name, w in _linear_weights(state):
        packed = pack_lossless12(w.to(torch.bfloat16).contiguous())
        rows.append({"tensor": name, "shape": list(w.shape), "escape_rate": escape_rate(packed),
                     "bytes_per_weight": packed_nbytes(packed) / w.numel()})
        escapes += packed.num_escapes
        weights += w.numel()
        nbytes += packed_nbytes(packed)
    return {"label": label, "weights": weights, "escape_rate": escapes / max(weights, 1),
            "bytes_per_weight": nbytes / max(weights, 1),
            "worst": max(rows, key=lambda r: r["escape_rate"]) if rows else None, "tensors": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", action="append", default=[], metavar="DIR")
    ap.add_argument("--zoo", metavar="PRESET", help="also measure the zoo pair of this preset")
    ap.add_argument("--out", default=os.path.join("bench", "results", "lossless12_escapes.json"))
    args = ap.parse_args(argv)
    dirs = list(args.checkpoint)
    if args.zoo:
        from specpilot.zoo import ensure_pair
        dirs += [str(d) for d in ensure_pair(args.zoo, progress=lambda m: print(m, file=sys.stderr))]
    results = []
    gen = torch.Generator().manual_seed(0)
    for d in dirs:
        state = load_state_dict(d)
        trained = measure(state, f"trained: {d}")
        init = measure({n: torch.randn(w.shape, generator=gen) * 0.02 for n, w in _linear_weights(state)},
                       f"normal(0, 0.02) init, same shapes as {os.path.basename(d.rstrip('/'))}")
        results += [trained, init]
        for r in (trained, init):
            print(f"{r['label']}: {r['weights']} weights, escape rate {r['escape_rate']:.2e}, "
                  f"{r['bytes_per_weight']:.4f} bytes/weight, worst {r['worst']['tensor']} "
                  f"{r['worst']['escape_rate']:.2e}")
    doc = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "results": results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
