"""Where a fused drafter kernel's time goes, by leaving one stage out.

The drafter's fused kernels are bound by latency, and no counter says which stage of a kernel
the time is in. This script times each kernel as it is and with one stage replaced by a
cheap stand-in (a copy of the templates with that stage edited out, built through codegen's
`template_dir`), at the drafter's decode shapes with random bf16 operands; the difference is
what the stage costs in the kernel's chain. The ablated kernels compute wrong values: only their
time is read.

  qkv        norm_qkv_rope: without the norm's statistics pass; without RoPE; RoPE without its
             cos/sin (the angles used as they are); positions and slots not loaded (the row's
             index stands in)
  attention  without reading the mask (visibility is the slot bound alone); whole cache (no
             bound)
  mlp        norm_gate_up_silu without the statistics pass
  head       the LM head (fused_linear with the norm) without the statistics pass

Each time is the median over replays of a CUDA graph of 20 launches, per launch (as
bench/fused_tile_sweep.py times them).

    python3 bench/stage_ablation.py --out bench/results/stage-ablation.json

GPU only.
"""
from __future__ import annotations

import argparse
import importlib.resources
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional

import torch

from specpilot.bench.environment import environment
from specpilot.codegen.cache import KernelCache, build_triton_module
from specpilot.bench.fused_kernel_cases import kernel_cases, preset_with_specs, time_launches
from specpilot.cli_common import positive_int
from specpilot.search.run_folder import write_json_atomic

STATS = "inv = _inv_rms(x_rows, m_mask, K, eps, BLOCK_M, BLOCK_K)"
NO_STATS = "inv = tl.full((BLOCK_M,), 1.0, tl.float32)"

# (kernel, ablation) -> (template file, [(text, replacement), ...]); None: as it is.
ABLATIONS: Dict[tuple, Optional[tuple]] = {
    ("qkv", "as is"): None,
    ("qkv", "no norm statistics"): ("norm_qkv_rope.py.j2", [(STATS, NO_STATS)]),
    ("qkv", "no RoPE"): ("norm_qkv_rope.py.j2", [("    if head < HQ + HKV:\n        # x * cos",
                                                  "    if head < 0:\n        # x * cos")]),
    ("qkv", "RoPE without cos/sin"): ("norm_qkv_rope.py.j2", [("tl.cos(freq)", "freq"),
                                                              ("tl.sin(freq)", "freq")]),
    ("qkv", "no position/slot loads"): ("norm_qkv_rope.py.j2", [
        ("pos = tl.load(pos_ptr + b * stride_pb + t, mask=m_mask, other=0)", "pos = offs_m"),
        ("slot = tl.load(slot_ptr + b * stride_sb + t, mask=m_mask, other=0).to(tl.int64)",
         "slot = t.to(tl.int64)")]),
    ("attention", "as is"): None,
    ("attention", "no mask reads"): ("attention.py.j2", [
        ("visible = tl.load(m_base + slots[None, :], mask=row_mask[:, None] & s_mask[None, :], "
         "other=0) != 0", "visible = row_mask[:, None] & s_mask[None, :]")]),
    ("attention", "whole cache"): ("attention.py.j2", [
        ("s_end = tl.minimum(tl.load(kv_len_ptr + b).to(tl.int32), S)", "s_end = S")]),
    ("mlp", "as is"): None,
    ("mlp", "no norm statistics"): ("norm_gate_up_silu.py.j2", [(STATS, NO_STATS)]),
    ("head", "as is"): None,
    ("head", "no norm statistics"): ("fused_linear.py.j2", [(STATS, NO_STATS)]),
}


def ablated_templates(root: Path, name: str, edits) -> Path:
    """A copy of the packaged templates under root/name with `edits` applied to one file."""
    folder = root / name.replace(" ", "_").replace("/", "_")
    source = importlib.resources.files("specpilot.templates")
    with importlib.resources.as_file(source) as src:
        shutil.copytree(src, folder)
    file, replacements = edits
    path = folder / "triton" / file
    text = path.read_text()
    for old, new in replacements:
        if old not in text:
            raise SystemExit(f"{file}: the text to ablate is gone: {old!r}")
        text = text.replace(old, new)
    path.write_text(text)
    return folder


def attention_case(cfg, batch: int, context: int, device):
    """The drafter's attention at one token a request, `context` slots visible of 2x."""
    bf = dict(dtype=torch.bfloat16, device=device)
    hq, hkv, d, capacity = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 2 * context
    q = torch.randn(batch, 1, hq, d, **bf)
    k, v = (torch.randn(batch, capacity, hkv, d, **bf) for _ in range(2))
    mask = torch.zeros(batch, 1, capacity, dtype=torch.bool, device=device)
    mask[:, :, :context] = True
    kv_len = torch.full((batch,), context, dtype=torch.int64, device=device)
    out = torch.empty_like(q)
    return (q, k, v, mask, out), dict(kv_len=kv_len)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="zoo-gpu-small-drafter")
    ap.add_argument("--rows", type=positive_int, default=16, help="requests, one token each")
    ap.add_argument("--context", type=positive_int, default=192,
                    help="visible cache slots (attention)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the ablation captures CUDA graphs: it needs a GPU")
    device = torch.device("cuda")
    torch.manual_seed(0)
    model, specs = preset_with_specs(args.preset, "cuda")
    cfg = model.config
    cases = kernel_cases(cfg, args.rows, device)
    cases["attention"] = attention_case(cfg, args.rows, args.context, device) + (None,)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (kernel, ablation), edits in ABLATIONS.items():
            template_dir = None if edits is None else ablated_templates(
                Path(tmp), f"{kernel}-{ablation}", edits)
            module = build_triton_module(specs[kernel], KernelCache(Path(tmp) / "cache"),
                                         template_dir=template_dir)
            launch_args, kwargs, _ = cases[kernel]
            us = time_launches(lambda: module.launch(*launch_args, **kwargs), device)
            rows.append({"kernel": kernel, "ablation": ablation, "us": us,
                         "spec": str(specs[kernel])})
            print(f"{kernel:9s} {ablation:26s} {us:6.2f} us", flush=True)
    write_json_atomic(Path(args.out), {"environment": environment("cuda"),
                                       "settings": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
