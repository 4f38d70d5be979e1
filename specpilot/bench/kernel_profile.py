"""What kernels one eager call launches on a CUDA GPU (torch.profiler): how many, their summed
device time, and the costliest by name. Used by bench/profile_decode.py (kernels per forward)
and bench/round_breakdown.py (per piece of a round)."""
from __future__ import annotations

from typing import Callable, Dict, List

import torch

TOP_KERNELS = 8


def kernel_profile(fn: Callable[[], object], device: torch.device) -> dict:
    """The CUDA kernels (and copies) of one eager call of `fn`: count, summed device time in
    microseconds, and the TOP_KERNELS costliest names with their counts. Empty off a GPU.
    Warm `fn` up first: a first call's compiles and allocations would be profiled too."""
    if torch.device(device).type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    by_name: Dict[str, List[float]] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(e, "device_time", None)       # torch >= 2.4 (cuda_time before)
        us = e.cuda_time if us is None else us
        by_name.setdefault(e.name, []).append(float(us))
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    return {"kernels": sum(len(v) for v in by_name.values()),
            "kernel_us": sum(sum(v) for v in by_name.values()),
            "top": [{"name": name[:120], "count": len(v), "us": sum(v)} for name, v in top]}
