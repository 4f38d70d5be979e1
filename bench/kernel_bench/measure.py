"""Timing and correctness primitives of the kernel benchmark.

Timing: every kernel is a list of thunks, one per buffer set; the sets are visited in turn so
that a weight read by one call was last touched several calls ago (with sets larger than the L2
in total, each call streams its operands from HBM, as a decoder's layers do). On a GPU the calls
are captured in a CUDA graph and its replays timed with events (launch gaps shrink to what a
captured decoder step pays); a callable that cannot be captured (host syncs) is timed eagerly with
events. On the CPU (smoke runs) a wall clock times single calls.

Correctness: ||out - ref|| / ||ref|| in float64 plus the largest absolute error; a non-finite
value in the output never passes.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch

# bf16 outputs rounded once from a float32 accumulation sit near 2^-9 relative error; 1e-2 leaves
# room for summation order while a wrong index, a dropped escape or a missing tile lands far above.
BF16_REL_TOL = 1e-2


@dataclass(frozen=True)
class TimingSettings:
    device: str
    reps: int             # timed graph replays (or eager rounds); the median is reported
    min_calls: int        # kernel calls per replay, rounded up to a multiple of the buffer sets
    warmup: bool = True   # one untimed round before capture (compilation, autotuning, handles)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _sync(settings: TimingSettings) -> None:
    if settings.cuda:
        torch.cuda.synchronize()


def _spread(per_call_us: List[float]) -> dict:
    return {"us": statistics.median(per_call_us), "us_min": min(per_call_us),
            "us_max": max(per_call_us), "reps": len(per_call_us)}


def time_thunks(thunks: Sequence[Callable[[], object]], settings: TimingSettings,
                capture: bool = True) -> dict:
    """Median microseconds per call of `thunks` (called in turn), plus how it was timed."""
    n = len(thunks)
    if not settings.cuda:
        if settings.warmup:
            for fn in thunks:
                fn()
        per_call = []
        for r in range(max(1, settings.reps)):
            start = time.perf_counter()
            thunks[r % n]()
            per_call.append((time.perf_counter() - start) * 1e6)
        return {**_spread(per_call), "timing": "cpu_wall", "calls_per_rep": 1}

    calls = n * max(1, math.ceil(settings.min_calls / n))
    if settings.warmup:
        for fn in thunks:
            fn()
    torch.cuda.synchronize()
    if capture:
        try:
            return {**_time_graph(thunks, calls, settings.reps), "timing": "cuda_graph",
                    "calls_per_rep": calls}
        except Exception as exc:  # some callables cannot be captured; time them eagerly instead
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            eager = _time_eager(thunks, calls, settings.reps)
            return {**eager, "timing": "cuda_events", "calls_per_rep": calls,
                    "capture_error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {**_time_eager(thunks, calls, settings.reps), "timing": "cuda_events", "calls_per_rep": calls}


def _time_graph(thunks, calls: int, reps: int) -> dict:
    n = len(thunks)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the documented warm-up on a side stream before capture
        for fn in thunks:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the threads that build CUDA kernels meanwhile must not invalidate the capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for i in range(calls):
            thunks[i % n]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return _spread(per_call)


def _time_eager(thunks, calls: int, reps: int) -> dict:
    n = len(thunks)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        start.record()
        for i in range(calls):
            thunks[i % n]()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / calls)
    return _spread(per_call)


def rotation_sets(bytes_per_set: int, l2_bytes: int, minimum: int = 4, maximum: int = 16) -> int:
    """Buffer sets to rotate through so that, together, they are at least three times the L2."""
    if bytes_per_set <= 0:
        return minimum
    return int(max(minimum, min(maximum, math.ceil(3 * l2_bytes / bytes_per_set))))


def compare(out: torch.Tensor, ref: torch.Tensor, rel_tol: float = BF16_REL_TOL) -> dict:
    """Relative Frobenius error of `out` against `ref` in float64, the largest absolute error, and
    whether it passes: finite everywhere and relative error at most `rel_tol`."""
    if tuple(out.shape) != tuple(ref.shape):
        return {"ok": False, "rel_err": None, "max_abs_err": None, "finite": None,
                "tolerance": rel_tol, "reason": f"shape {tuple(out.shape)} != {tuple(ref.shape)}"}
    o = out.detach().double()
    r = ref.detach().to(o.device).double()
    finite = bool(torch.isfinite(o).all().item())
    diff = (o - r).nan_to_num(nan=math.inf)
    ref_norm = torch.linalg.vector_norm(r).item()
    err_norm = torch.linalg.vector_norm(diff).item()
    rel = err_norm / ref_norm if ref_norm > 0 else err_norm
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    ok = finite and math.isfinite(rel) and rel <= rel_tol
    return {"ok": bool(ok), "rel_err": _num(rel), "max_abs_err": _num(max_abs), "finite": finite,
            "tolerance": rel_tol}


def compare_exact(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> dict:
    """Element-for-element equality of every output with its reference (integer results)."""
    mismatched = 0
    total = 0
    for o, r in zip(outs, refs):
        r = r.to(o.device)
        if tuple(o.shape) != tuple(r.shape):
            return {"ok": False, "mismatches": None, "tolerance": "exact",
                    "reason": f"shape {tuple(o.shape)} != {tuple(r.shape)}"}
        mismatched += int((o != r).sum().item())
        total += o.numel()
    return {"ok": mismatched == 0, "mismatches": mismatched, "elements": total, "tolerance": "exact",
            "rel_err": 0.0 if mismatched == 0 else mismatched / max(total, 1),
            "max_abs_err": None}


def _num(value: float) -> Optional[float]:
    """JSON has no inf/NaN: they are reported as None (and never pass)."""
    return float(value) if math.isfinite(value) else None


def copy_bandwidth(settings: TimingSettings, nbytes: int) -> dict:
    """Device-to-device copy of `nbytes`, counted as bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=settings.device).random_(0, 255)
    dst = torch.empty_like(src)
    timing = time_thunks([lambda: dst.copy_(src)], settings, capture=False)
    del src, dst
    if settings.cuda:
        torch.cuda.empty_cache()
    gbps = 2 * nbytes / (timing["us"] * 1e-6) / 1e9
    return {"bytes_copied": nbytes, "us": timing["us"], "gbps": gbps, "timing": timing["timing"]}


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with NaN (floats) or -7 (integers) so unwritten elements show."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else -7)


class Budget:
    """Wall-clock budget of the whole run: work is skipped, and recorded so, once it is spent."""

    def __init__(self, seconds: float):
        self.start = time.monotonic()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def spent(self, reserve: float = 0.0) -> bool:
        return self.left() <= reserve
