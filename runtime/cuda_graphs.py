"""CUDA-graph capture of one fixed-shape forward (`GraphedStep`), and the CUDA checks.

A decode step of B requests x T tokens always has the same shapes, so its whole forward (hundreds
of kernel launches) can be captured once as a CUDA graph and replayed with a single launch: the
inputs live in static buffers that are overwritten before each replay, the output is a static
tensor that the next replay overwrites. A graph bakes in the addresses of everything it touches,
the KV cache included, so a `GraphedStep` is bound to one cache.

`GraphedStep` serves the step-cost measurements (specpilot/bench/step_costs.py). Decoding with
graphs, plain greedy AR included (chains of 0), is runtime/graphed_chain.py, which captures
whole rounds with their inputs, acceptance and stopping on the device.

`capture=False` runs the same static buffers eagerly on any device; it exists so the logic can
be tested without a GPU, and so a capture problem can be told apart from a logic bug.
"""
from __future__ import annotations

import gc
from typing import Optional

import torch

from specpilot.ir.errors import SpecPilotError

from .errors import CapacityError

WARMUP_RUNS = 3  # eager runs on a side stream before capture (cuBLAS handles, allocator pools)


def capture_graph(body, device, pool=None, stream=None):
    """Run `body` WARMUP_RUNS times eagerly on a side stream (so that cuBLAS handles, allocator
    pools and compiled kernels exist before capture), then capture one run of it into a CUDA
    graph. Returns (the graph, what the captured run returned: tensors its replays rewrite).
    Every graphed piece of the runtime is captured this way. `stream`, if given, is the side
    stream: a graph that will replay alongside others is captured on a stream of its own, so
    that its GEMMs' cuBLAS workspace (one per stream, see below) is not one they use too."""
    current = torch.cuda.current_stream(device)
    side = stream if stream is not None else torch.cuda.Stream(device=device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            body()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # Unreachable objects may hold graphs (a decoder built for another batch size, in a
    # reference cycle). Should the garbage collector free one while this capture runs, the
    # graph's destruction is an API call that a capture forbids, and the capture fails
    # ("operation failed due to a previous error during capture"; seen at batch 64 after
    # decoders for batch 1-16). torch.cuda.graph no longer collects first (it is slow), so the
    # collector is kept off until the capture has ended; what it would have freed waits.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        # Captured on the stream the warm-up ran on: cuBLAS keeps a workspace per stream, and
        # the one made for the side stream above is the one the captured GEMMs then use.
        with torch.cuda.graph(graph, pool=pool, stream=side):
            out = body()
    finally:
        if was_enabled:
            gc.enable()
    return graph, out


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device` without the host waiting for the GPU: on a CUDA device
    it is copied from page-locked memory with a non-blocking copy, stream-ordered (a plain
    copy would wait for every replay already queued, and leave the GPU idle until the host
    queues the next). PyTorch keeps the page-locked block until the copy has run."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class GraphsUnavailable(SpecPilotError):
    """CUDA graphs were asked for where there is no CUDA GPU."""


def require_cuda(device) -> None:
    """Raise GraphsUnavailable unless `device` is a CUDA device and a CUDA GPU is present."""
    if not torch.cuda.is_available() or torch.device(device).type != "cuda":
        raise GraphsUnavailable(
            f"CUDA graphs need a CUDA GPU (the model is on {str(device)!r}"
            f"{'' if torch.cuda.is_available() else ' and no CUDA GPU is available'}): run on a "
            f"GPU, or decode eagerly with generate_ar")


class GraphedStep:
    """`model.forward` over static inputs tokens/positions/slots [B, T], mask [B, T, S] and
    logits_at [B, R] (R = `logits_rows`; None returns logits for all T), bound to `cache`.

    With capture=True (CUDA only) the forward is warmed up on a side stream and captured as a
    CUDA graph; `replay()` relaunches it. Building it runs the forward a few times on the initial
    inputs (slots 0..T-1, causal), which writes K/V there: build it before the prefill.
    The tensor `replay()` returns is overwritten by the next replay.
    """

    def __init__(self, model, cache, width: int, logits_rows: Optional[int] = None,
                 capture: bool = True, pool=None):
        if capture:
            require_cuda(model.device)
        if width < 1 or width > cache.capacity:
            raise CapacityError(f"a step of {width} tokens does not fit a cache of "
                                f"{cache.capacity} slots")
        self.model, self.cache, self.captured = model, cache, capture
        b, s, dev = cache.batch, cache.capacity, model.device
        offs = torch.arange(width, dtype=torch.int64, device=dev)
        self.tokens = torch.zeros((b, width), dtype=torch.int64, device=dev)
        self.positions = offs[None, :].expand(b, width).clone()
        self.slots = self.positions.clone()
        self.mask = torch.arange(s, device=dev)[None, None, :] <= self.slots[:, :, None]
        self.logits_at = (None if logits_rows is None else
                          torch.zeros((b, logits_rows), dtype=torch.int64, device=dev))
        self.graph = None
        if capture:
            self.graph, self.logits = capture_graph(self._forward, dev, pool)
        else:
            self.logits = self._forward()

    @property
    def shape(self):
        return tuple(self.tokens.shape)

    def _forward(self) -> torch.Tensor:
        return self.model.forward(self.tokens, self.positions, self.slots, self.mask, self.cache,
                                  self.logits_at)

    def replay(self) -> torch.Tensor:
        """Run the step on what the static buffers hold now; returns the static logits."""
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        self.logits = self._forward()
        return self.logits

    def __call__(self, tokens, positions, slots, mask, logits_at=None) -> torch.Tensor:
        """Copy new inputs into the static buffers (shapes must match) and replay."""
        pairs = [("tokens", self.tokens, tokens), ("positions", self.positions, positions),
                 ("slots", self.slots, slots), ("mask", self.mask, mask)]
        if self.logits_at is not None:
            pairs.append(("logits_at", self.logits_at, logits_at))
        elif logits_at is not None:
            raise SpecPilotError("this step was captured with logits at every token: "
                                 "build it with logits_rows to pick rows")
        for name, static, new in pairs:
            if new is None or tuple(new.shape) != tuple(static.shape):
                raise SpecPilotError(f"{name} has shape {None if new is None else tuple(new.shape)}"
                                     f" but the step was built for {tuple(static.shape)}")
            static.copy_(new)
        return self.replay()
