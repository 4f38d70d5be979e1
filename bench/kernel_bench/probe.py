"""Run CUDA kernels once each in a child process before the benchmark trusts them.

A CUDA kernel that faults leaves the process's CUDA context unusable, so one bad configuration
would fail every later row of the run. The child loads each built spec from the kernel cache,
launches it on small odd-sized problems (M = 1, 3, 8; N not a multiple of 16) and compares with
the reference; when the context breaks it stops, and the parent starts a new child for the specs
after the one that broke it. The parent keeps only specs that ran without a fault.

    python bench/kernel_bench/probe.py SPECS_JSON OUT_JSON     (the child; SPECS_JSON lists spec dicts)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List

CHILD_TIMEOUT_S = 120


def probe_specs(specs: List, log=print, max_children: int = 4) -> Dict[str, dict]:
    """str(spec) -> {"ok": ran without a CUDA fault, "correct": bool, "error": str | None}."""
    results: Dict[str, dict] = {}
    pending = list(specs)
    for _ in range(max_children):
        if not pending:
            break
        with tempfile.TemporaryDirectory() as tmp:
            spec_path, out_path = os.path.join(tmp, "specs.json"), os.path.join(tmp, "out.json")
            with open(spec_path, "w") as f:
                json.dump([s.as_dict() for s in pending], f)
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), spec_path, out_path],
                                      capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
                tail = (proc.stderr or proc.stdout)[-800:]
            except subprocess.TimeoutExpired:
                tail = f"probe timed out after {CHILD_TIMEOUT_S} s"
            done = json.load(open(out_path)) if os.path.exists(out_path) else {}
        if "__setup__" in done:  # the child could not even prepare its inputs: nothing is trusted
            for spec in pending:
                results[str(spec)] = {"ok": False, "correct": False, "error": f"probe set-up: {done['__setup__']}"}
            pending = []
            break
        progressed = False
        for spec in list(pending):
            key = str(spec)
            if key in done and done[key].get("ok"):
                results[key] = done[key]
                pending.remove(spec)
                progressed = True
            elif key in done:  # this spec broke the child: blame it, retry the rest
                results[key] = done[key]
                pending.remove(spec)
                progressed = True
                break
            else:  # the child died before reporting this spec: blame it
                results[key] = {"ok": False, "correct": False, "error": f"probe child died: {tail}"}
                pending.remove(spec)
                progressed = True
                break
        if not progressed:
            break
    for spec in pending:
        results[str(spec)] = {"ok": False, "correct": False, "error": "not probed (too many faults)"}
    for key, r in results.items():
        if not r.get("ok"):
            log(f"  probe: {key} is not run: {r.get('error')}")
    return results


def _child(spec_path: str, out_path: str) -> None:
    import torch

    from specpilot.codegen.build import build_kernel
    from specpilot.codegen.cache import KernelCache
    from specpilot.codegen.formats.lossless12 import pack_lossless12
    from specpilot.codegen.kernel_spec import KernelSpec
    from specpilot.runtime.reference_ops import linear_ref

    results: Dict[str, dict] = {}
    device = os.environ.get("SPECPILOT_PROBE_DEVICE", "cuda")  # "cpu" exercises this code in tests

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def save():
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)

    try:
        torch.manual_seed(0)
        N, K = 1000, 1040
        w = (torch.randn(N, K) * 0.02).bfloat16()
        w[::7, 3] = 300.0  # escapes in every seventh row
        w_cuda = w.to(device)
        cache = KernelCache()
    except Exception as exc:
        results["__setup__"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        save()
        return
    try:
        packed, pack_error = pack_lossless12(w).to(device), None
    except Exception as exc:  # e.g. the C++ packer is not built: only lossless12 kernels are lost
        packed, pack_error = None, f"lossless12 packing failed: {type(exc).__name__}: {exc}"

    for data in json.load(open(spec_path)):
        spec = KernelSpec.from_dict(data)
        key = str(spec)
        try:
            module = build_kernel(spec, cache)
        except Exception as exc:  # a build failure is not a fault: the bench records it itself
            results[key] = {"ok": True, "correct": False, "error": f"build: {str(exc)[:300]}"}
            save()
            continue
        weight = packed if "lossless12" in spec.family else w_cuda
        if weight is None:
            results[key] = {"ok": False, "correct": False, "error": pack_error}
            save()
            continue
        worst, error = 0.0, None
        try:
            rows = (1, 3, spec.get("M_MAX")) if "M_MAX" in dict(spec.params) else (1, 3, 8)
            for M in rows:
                x = torch.randn(M, K, device=device).bfloat16()
                out = torch.full((M, N), float("nan"), device=device, dtype=torch.bfloat16)
                module.launch(x, weight, out)
                sync()
                ref = linear_ref(x, w_cuda).double()
                rel = ((out.double() - ref).norm() / ref.norm()).item()
                worst = max(worst, rel if rel == rel else float("inf"))
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        try:  # a fault is sticky: any later CUDA call fails too
            sync()
            torch.zeros(1, device=device).item()
            alive = True
        except Exception as exc:
            alive, error = False, error or f"{type(exc).__name__}: {str(exc)[:300]}"
        results[key] = {"ok": alive, "correct": error is None and worst <= 1e-2,
                        "rel_err": worst if worst != float("inf") else None, "error": error}
        save()
        if not alive:
            sys.exit(3)
    save()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _child(sys.argv[1], sys.argv[2])
