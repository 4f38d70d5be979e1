"""The benchmark's bookkeeping: one JSON row per (kernel, case), written as soon as it exists.

A row is measured in two steps: a correctness run on a poisoned output compared with the
reference, then the timing. A failure of either is recorded in the row (status "failed" with the
error, or "incorrect" with the error measure) and the run goes on; an incorrect kernel is still
timed, but every report marks it.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence

from .measure import Budget, TimingSettings, time_thunks


def write_json_atomic(path: str, doc: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


class Builder:
    """Builds kernel specs: CUDA ones on a thread pool (nvcc runs in parallel, while the main
    thread times Triton kernels), Triton ones in the calling thread. A CUDA module is handed out
    only after a child process ran it without a fault (probe.py): a faulting kernel would
    otherwise break the CUDA context of the whole run."""

    def __init__(self, cache, workers: int, cuda_ok: bool, cuda_reason: str = "", log=print):
        self.cache = cache
        self.cuda_ok = cuda_ok
        self.cuda_reason = cuda_reason
        self.log = log
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers)) if cuda_ok else None
        self.futures: Dict[Any, Future] = {}
        self.probed: Dict[str, dict] = {}

    def prefetch(self, spec) -> None:
        from specpilot.codegen.build import build_kernel
        if spec.backend == "cuda" and self.cuda_ok and spec not in self.futures:
            self.futures[spec] = self.pool.submit(build_kernel, spec, self.cache)

    def probe(self, specs) -> None:
        """Wait for these CUDA specs' builds and run the built ones once in a child process."""
        from .probe import probe_specs
        todo = []
        for spec in specs:
            if spec.backend != "cuda" or not self.cuda_ok or str(spec) in self.probed or spec in todo:
                continue
            self.prefetch(spec)
            if self.futures[spec].exception() is None:  # waits; a failed build is reported by get()
                todo.append(spec)
        if todo:
            self.log(f"probing {len(todo)} CUDA kernel(s) in a child process")
            self.probed.update(probe_specs(todo, log=self.log))

    def get(self, spec):
        from specpilot.codegen.build import build_kernel
        if spec.backend != "cuda":
            return build_kernel(spec, self.cache)
        if not self.cuda_ok:
            raise Unavailable(self.cuda_reason)
        self.prefetch(spec)
        module = self.futures[spec].result()
        if str(spec) not in self.probed:
            ready = [s for s, f in self.futures.items() if f.done() and str(s) not in self.probed]
            self.probe([spec] + [s for s in ready if s != spec])
        verdict = self.probed.get(str(spec), {})
        if not verdict.get("ok"):
            raise RuntimeError(f"not run: it faulted in the probe process: {verdict.get('error')}")
        return module

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class Unavailable(Exception):
    """A kernel that cannot run here at all (no CUDA device or no nvcc): recorded as skipped."""


class Runner:
    """Measures rows, keeps them, and rewrites the JSON document after every row."""

    def __init__(self, settings: TimingSettings, budget: Budget, doc: dict, json_path: str,
                 builder: Builder, on_flush: Optional[Callable[[dict], None]] = None):
        self.on_flush = on_flush  # e.g. re-render the markdown now and then
        self.settings = settings
        self.budget = budget
        self.doc = doc
        self.rows: List[dict] = doc["results"]
        self.json_path = json_path
        self.builder = builder
        self.copy_gbps: Optional[float] = None

    def flush(self) -> None:
        self.doc["elapsed_s"] = round(self.budget.elapsed(), 2)
        write_json_atomic(self.json_path, self.doc)
        if self.on_flush is not None and len(self.rows) % 10 == 0:
            self.on_flush(self.doc)

    def log(self, message: str) -> None:
        print(f"[{self.budget.elapsed():7.1f}s] {message}", flush=True)

    def skip(self, base: dict, reason: str) -> dict:
        row = {**base, "status": "skipped", "reason": reason}
        self.rows.append(row)
        self.flush()
        self.log(f"{_label(row)}: skipped ({reason})")
        return row

    def measure(self, base: dict, prepare: Callable[[], tuple], bytes_moved: int,
                baseline_us: Optional[float] = None, capture: bool = True) -> dict:
        """Run one row. `prepare()` returns (thunks, check): the per-buffer-set calls and a
        function that runs the kernel once on poisoned outputs and returns the comparison."""
        row = {**base, "bytes": int(bytes_moved)}
        try:
            thunks, check = prepare()
            correctness = check()
            row["correctness"] = correctness
            timing = time_thunks(thunks, self.settings, capture=capture)
            row.update(timing)
            row["rotation_sets"] = len(thunks)
            row["status"] = "ok" if correctness.get("ok") else "incorrect"
            row["gbps"] = bytes_moved / (timing["us"] * 1e-6) / 1e9
            if self.copy_gbps:
                row["pct_copy_bw"] = 100.0 * row["gbps"] / self.copy_gbps
            if baseline_us:
                row["baseline_us"] = baseline_us
                row["speedup_vs_baseline"] = baseline_us / timing["us"]
        except Unavailable as exc:
            row["status"], row["reason"] = "skipped", str(exc)
        except Exception as exc:  # a kernel that fails to build or run is a recorded failure
            row["status"] = "failed"
            row["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
            row["traceback"] = traceback.format_exc(limit=-4)[-2000:]
            _recover_device(self.settings)
        self.rows.append(row)
        self.flush()
        self.log(_describe(row))
        return row


def _recover_device(settings: TimingSettings) -> None:
    if not settings.cuda:
        return
    import torch
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # a sticky error: later CUDA work will fail and say so
        print(f"  device error after failure: {exc}", file=sys.stderr, flush=True)


def _label(row: dict) -> str:
    m = f" M={row['M']}" if row.get("M") is not None else ""
    return f"{row['group']} {row['case']}{m} {row['kernel']}[{row['role']}]"


def _describe(row: dict) -> str:
    head = _label(row)
    if row["status"] in ("failed", "skipped"):
        return f"{head}: {row['status']}: {row.get('error') or row.get('reason')}"
    c = row.get("correctness", {})
    parts = [f"{row['us']:.2f} us", f"{row['gbps']:.0f} GB/s"]
    if "pct_copy_bw" in row:
        parts.append(f"{row['pct_copy_bw']:.0f}% copy")
    if "speedup_vs_baseline" in row:
        parts.append(f"x{row['speedup_vs_baseline']:.2f} vs torch")
    err = c.get("rel_err")
    parts.append(("ok" if c.get("ok") else "INCORRECT") + (f" rel={err:.1e}" if err is not None else ""))
    return f"{head}: " + ", ".join(parts)


def spec_dict(spec) -> Optional[dict]:
    return None if spec is None else spec.as_dict()


def row_base(group: str, case: str, kernel: str, impl: str, role: str, shape: dict,
             M: Optional[int] = None, spec=None) -> dict:
    return {"group": group, "case": case, "kernel": kernel, "impl": impl, "role": role,
            "shape": shape, "M": M, "spec": spec_dict(spec)}


def first_ok_us(rows: Sequence[dict]) -> Optional[float]:
    for row in rows:
        if row and row.get("status") in ("ok", "incorrect") and row.get("us"):
            return row["us"]
    return None
