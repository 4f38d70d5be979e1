"""Markdown tables and the best-config summary of a kernel benchmark document."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

LINEAR_COLUMNS = (("linear", "default", "Triton linear (default)"),
                  ("linear", "best", "Triton linear (best)"),
                  ("gemv_bf16", "best", "CUDA gemv_bf16 (best)"),
                  ("linear_lossless12", "best", "Triton lossless12 (best)"),
                  ("gemv_lossless12", "best", "CUDA lossless12 fma (best)"),
                  ("gemv_lossless12_mma", "best", "CUDA lossless12 mma (best)"))


def _timed(row: dict) -> bool:
    return row.get("status") in ("ok", "incorrect") and row.get("us") is not None


def best_rows(rows: List[dict]) -> Dict[Tuple, dict]:
    """(group, case, M, kernel) -> the fastest correct row."""
    best: Dict[Tuple, dict] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("us") is None:
            continue
        key = (row["group"], row["case"], row.get("M"), row["kernel"])
        if key not in best or row["us"] < best[key]["us"]:
            best[key] = row
    return best


def non_default_params(spec: Optional[dict]) -> str:
    if not spec:
        return ""
    try:
        from specpilot.codegen.kernel_spec import get_family
        defaults = {p.name: p.default for p in get_family(spec["family"]).params}
    except Exception:
        defaults = {}
    parts = [f"{k}={v}" for k, v in spec["params"].items() if defaults.get(k, object()) != v]
    return ", ".join(parts) or "defaults"


def best_configs(doc: dict) -> List[dict]:
    """The fastest correct spec of each of our kernels per (layer, M): ready to become a
    lowering default (its spec dict round-trips through KernelSpec.from_dict)."""
    out = []
    for (group, case, M, kernel), row in sorted(best_rows(doc["results"]).items(),
                                                key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0, kv[0][3])):
        if row.get("impl") == "torch" or not row.get("spec"):
            continue
        out.append({"group": group, "case": case, "M": M, "kernel": kernel, "shape": row.get("shape"),
                    "us": row["us"], "speedup_vs_baseline": row.get("speedup_vs_baseline"),
                    "pct_copy_bw": row.get("pct_copy_bw"), "role": row.get("role"), "spec": row["spec"]})
    return out


def _cell(row: Optional[dict], with_ratio: bool = True) -> str:
    if row is None:
        return "–"
    if not _timed(row):
        return row.get("status", "–")
    text = f"{row['us']:.1f}"
    extras = []
    if with_ratio and row.get("speedup_vs_baseline"):
        extras.append(f"×{row['speedup_vs_baseline']:.2f}")
    if row.get("pct_copy_bw") is not None:
        extras.append(f"{row['pct_copy_bw']:.0f}%")
    if extras:
        text += " (" + ", ".join(extras) + ")"
    if row.get("status") == "incorrect":
        text += " ✗"
    return text


def _linear_table(doc: dict, best: Dict[Tuple, dict]) -> List[str]:
    rows = [r for r in doc["results"] if r["group"] == "linear"]
    keys = []
    for r in rows:
        k = (r["case"], r.get("shape", {}).get("N"), r.get("shape", {}).get("K"), r.get("M"))
        if k not in keys:
            keys.append(k)
    lines = ["| layer (N×K) | M | cuBLAS | " + " | ".join(c[2] for c in LINEAR_COLUMNS) + " |",
             "|---|---|---|" + "---|" * len(LINEAR_COLUMNS)]
    for case, N, K, M in keys:
        def find(kernel, role):
            if role == "best":
                return best.get(("linear", case, M, kernel)) or _first(rows, case, M, kernel, None)
            return _first(rows, case, M, kernel, role)
        cells = [_cell(find("cublas", "baseline"), with_ratio=False)]
        cells += [_cell(find(kernel, role)) for kernel, role, _ in LINEAR_COLUMNS]
        lines.append(f"| {case} {N}×{K} | {M} | " + " | ".join(cells) + " |")
    return lines


def _first(rows, case, M, kernel, role) -> Optional[dict]:
    for r in rows:
        if r["case"] == case and r.get("M") == M and r["kernel"] == kernel and (role is None or r["role"] == role):
            return r
    return None


def _ops_table(doc: dict) -> List[str]:
    lines = ["| family | case | M/T | torch (µs) | ours (µs) | ×torch | GB/s | % copy | rel. err | ok |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = [r for r in doc["results"] if r["group"] != "linear"]
    for r in rows:
        if r["impl"] == "torch":
            continue
        baselines = [b for b in rows if b["group"] == r["group"] and b["case"] == r["case"]
                     and b.get("M") == r.get("M") and b["impl"] == "torch"]
        torch_cell = ", ".join(f"{b['kernel']} {b['us']:.1f}" if _timed(b) else f"{b['kernel']} {b['status']}"
                               for b in baselines) or "–"
        c = r.get("correctness") or {}
        err = c.get("rel_err")
        timed = _timed(r)
        lines.append("| " + " | ".join([
            r["group"], r["case"], "" if r.get("M") is None else str(r["M"]), torch_cell,
            f"{r['us']:.1f}" if timed else r["status"],
            f"{r['speedup_vs_baseline']:.2f}" if r.get("speedup_vs_baseline") else "–",
            f"{r['gbps']:.0f}" if timed else "–",
            f"{r['pct_copy_bw']:.0f}" if r.get("pct_copy_bw") is not None else "–",
            "–" if err is None else f"{err:.1e}",
            {"ok": "yes", "incorrect": "**NO**"}.get(r["status"], r["status"])]) + " |")
    return lines


def render_markdown(doc: dict) -> str:
    env = doc.get("environment", {})
    copy = doc.get("copy_bandwidth") or {}
    best = best_rows(doc["results"])
    head = (f"## Kernel microbenchmarks: {env.get('gpu', '?')}\n\n"
            f"torch {env.get('torch')}, triton {env.get('triton')}, nvcc {env.get('nvcc')}, "
            f"{env.get('date')}; `{env.get('command')}`.\n\n")
    if copy.get("gbps"):
        head += f"Device-to-device copy: **{copy['gbps']:.0f} GB/s** (bytes read + written). "
    if env.get("device", "cpu").startswith("cuda"):
        head += ("Each time is the median per call over CUDA-graph replays that rotate through "
                 "enough buffer sets to exceed the L2 three times (weights stream from HBM; the "
                 "small operands of the other families stay L2-resident). ")
    else:
        head += "CPU smoke run (Triton interpreter, one call each): the times mean nothing. "
    head += ("Cells: µs (×baseline = baseline time / ours, above 1 is faster; % of the copy "
             "bandwidth for the bytes each call must move). The CUDA GEMVs are built with M_MAX=8 "
             "and instantiated per row count, so M_MAX does not change their speed. ✗ / **NO**: "
             "output failed the correctness check.\n\n")
    parts = [head, "### Linear layers (Llama-3.1-8B), µs per call\n", *_linear_table(doc, best), "",
             "### Other kernel families\n", *_ops_table(doc), ""]
    configs = best_configs(doc)
    linear_configs = [c for c in configs if c["group"] == "linear"]
    if linear_configs:
        parts += ["### Best configuration per layer and M\n",
                  "| kernel | layer | M | µs | ×cuBLAS | parameters (non-default) |", "|---|---|---|---|---|---|"]
        for c in linear_configs:
            ratio = f"{c['speedup_vs_baseline']:.2f}" if c.get("speedup_vs_baseline") else "–"
            parts.append(f"| {c['kernel']} | {c['case']} | {c['M']} | {c['us']:.1f} | {ratio} | "
                         f"{non_default_params(c['spec'])} |")
        parts.append("")
    problems = [r for r in doc["results"] if r.get("status") in ("failed", "incorrect")]
    if problems:
        parts += ["### Failures and incorrect results\n"]
        for r in problems:
            why = r.get("error") or f"rel. err {(r.get('correctness') or {}).get('rel_err')}"
            parts.append(f"- {r['group']} {r['case']} M={r.get('M')} {r['kernel']} "
                         f"({non_default_params(r.get('spec'))}): {r['status']}: {str(why)[:300]}")
        parts.append("")
    skipped = doc.get("skipped_for_budget", 0)
    if skipped:
        parts.append(f"{skipped} sweep configurations were not timed within the time budget.\n")
    return "\n".join(parts)
