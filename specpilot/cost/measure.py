"""Measure the present device: copy bandwidth, matmul rate and launch overhead.

Each figure is the best of a few timed repetitions after a warm-up (the best, not the median:
the roofline wants what the device can do, and interference only ever slows a run down). Sizes
are chosen so that a CPU measurement takes about a second and a GPU one well under.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from .gpu_specs import GpuSpec, gpu_spec


def _best_seconds(fn: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure_device(device: Optional[str] = None, repeats: int = 5) -> GpuSpec:
    """A GpuSpec of `device` ("cuda", "cuda:1", "cpu"; default: cuda if available) with measured
    memory bandwidth (a large tensor copy, read + write bytes), matmul rate in bfloat16 and float32,
    and launch overhead (a tiny op launched many times; on a GPU also replayed from one CUDA
    graph, the per-kernel cost inside a graphed step). On a GPU the SM count and memory size
    come from the driver; on a CPU they are 0 and the installed-memory figure is not measured."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    copy_bytes = (1 << 30) if cuda else (64 << 20)
    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    bandwidth = 2 * copy_bytes / _best_seconds(lambda: dst.copy_(src), sync, repeats)
    del src, dst

    def matmul_rate(dtype, n):
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        return 2 * n ** 3 / _best_seconds(lambda: torch.mm(a, b), sync, repeats)

    n = 8192 if cuda else 512
    bf16 = matmul_rate(torch.bfloat16, n)
    fp32 = matmul_rate(torch.float32, n)

    x = torch.ones(8, device=dev)
    launches = 200

    def tiny_ops():
        for _ in range(launches):
            x.add_(1.0)

    launch = _best_seconds(tiny_ops, sync, repeats) / launches
    graphed = _graphed_launch_seconds(tiny_ops, launches, dev, sync, repeats) if cuda else None
    if cuda:
        props = torch.cuda.get_device_properties(dev)
        name, sms, memory = props.name, props.multi_processor_count, float(props.total_memory)
    else:
        name, sms, memory = "cpu", 0, gpu_spec("cpu").memory_bytes
    return GpuSpec(name=name, memory_bandwidth=bandwidth, matmul_flops=bf16, vector_flops=fp32,
                   sm_count=sms, launch_overhead_s=launch, memory_bytes=memory, source="measured",
                   graphed_launch_s=graphed)


def _graphed_launch_seconds(tiny_ops: Callable[[], None], launches: int, dev, sync,
                            repeats: int) -> float:
    """Seconds per tiny kernel when `launches` of them replay from one CUDA graph: what a
    kernel costs inside a graphed decode step, where the host's dispatch is gone but the GPU's
    per-kernel gap stays."""
    import torch

    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):      # warm up off the capture, as CUDA graphs want
        tiny_ops()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiny_ops()
    seconds = _best_seconds(graph.replay, sync, repeats) / launches
    del graph
    return seconds
