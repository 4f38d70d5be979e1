"""CUDA-graph capture of fixed-shape decode steps, and the graphed greedy AR decoder.

A decode step of B requests x T tokens always has the same shapes, so its whole forward (hundreds
of kernel launches) can be captured once as a CUDA graph and replayed with a single launch: the
inputs live in static buffers that are overwritten before each replay, the output is a static
tensor that the next replay overwrites. A graph bakes in the addresses of everything it touches,
the KV cache included, so a `GraphedStep` is bound to one cache.

`GraphedAR` is greedy AR decoding with the prefill run eagerly and every decode step replayed
from one graph: the next step's inputs (token, position, slot, visibility mask) are built on the
device from the previous step's argmax, so the only host round trip is reading the argmax tokens
back, pipelined one step behind (the GPU already runs step j+1 while the host checks step j for
EOS). Outputs equal `generate_ar`'s token for token.

`capture=False` runs the same static-buffer loop eagerly on any device; it exists so the loop's
logic can be tested without a GPU, and so a capture problem can be told apart from a loop bug.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from specpilot.ir.errors import SpecPilotError

from .ar import ARResult
from .errors import CapacityError
from .steps import append_step, check_capacity, top2_margin

WARMUP_RUNS = 3  # eager runs on a side stream before capture (cuBLAS handles, allocator pools)


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
            self.graph = torch.cuda.CUDAGraph()
            current = torch.cuda.current_stream(dev)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self._forward()
            current.wait_stream(side)
            with torch.cuda.graph(self.graph, pool=pool):
                self.logits = self._forward()
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


class _HostRows:
    """Rows of a [steps, B] device buffer copied to the host one step behind the GPU: on CUDA
    each copy is non-blocking into pinned memory with an event, waited on only when read."""

    def __init__(self, steps: int, batch: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.host = torch.empty((steps, batch), dtype=torch.int64, pin_memory=self.cuda)
        self.events: List[Optional[torch.cuda.Event]] = [None] * steps

    def push(self, j: int, row: torch.Tensor) -> None:
        self.host[j].copy_(row, non_blocking=self.cuda)
        if self.cuda:
            self.events[j] = torch.cuda.Event()
            self.events[j].record()

    def read(self, j: int) -> List[int]:
        if self.events[j] is not None:
            self.events[j].synchronize()
        return self.host[j].tolist()


class GraphedAR:
    """Greedy AR for up to `batch` requests whose prompt + new tokens fit `capacity`, with the
    decode step captured once (capture=True, CUDA) and reused by every `generate` call."""

    def __init__(self, model, batch: int, capacity: int, capture: bool = True):
        if capture:
            require_cuda(model.device)
        self.model, self.batch = model, batch
        self.cache = model.new_cache(batch, capacity)
        self.step = GraphedStep(model, self.cache, width=1, capture=capture)
        self.slot_ids = torch.arange(capacity, device=model.device)[None, None, :]

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_ids: Sequence[int] = (), force_reference=None,
                 record_margins: bool = False) -> ARResult:
        """Greedy decode like `generate_ar` (same tokens; margins only with record_margins).

        With `force_reference` (an ARResult) every step is fed the reference token instead of
        its own choice, and `tokens` holds what the decoder proposed at each reference position
        (eos_ids and max_new_tokens are then taken from the reference). `target_forwards`
        counts the forwards actually run, which may include one step past the last EOS.
        """
        n = len(prompts)
        if n > self.batch:
            raise SpecPilotError(f"{n} prompts for a decoder built for batch {self.batch}: "
                                 f"build it for a larger batch or split the prompts")
        reference = None
        if force_reference is not None:
            reference = [list(t) for t in force_reference.tokens]
            if len(reference) != n or any(not t for t in reference):
                raise SpecPilotError("the reference must hold a non-empty token list per prompt")
            max_new_tokens, eos_ids = max(len(t) for t in reference), ()
        needed = check_capacity(self.model, prompts, max_new_tokens, slack=1)
        if needed > self.capacity:
            raise CapacityError(f"prompts of up to {needed - max_new_tokens - 1} tokens plus "
                                f"{max_new_tokens} new tokens need {needed} cache slots; this "
                                f"decoder has {self.capacity}: build it with a larger capacity")
        # Rows beyond the prompts decode a copy of the first prompt; their output is dropped.
        rows = [list(p) for p in prompts] + [list(prompts[0])] * (self.batch - n)
        dev = self.model.device
        lengths = torch.tensor([len(p) for p in rows], dtype=torch.int64, device=dev)
        logits = append_step(self.model, self.cache, torch.zeros_like(lengths), rows)
        generated = torch.empty((max_new_tokens, self.batch), dtype=torch.int64, device=dev)
        margins = torch.empty((max_new_tokens, self.batch), dtype=torch.float32, device=dev)
        feed = generated if reference is None else _reference_rows(reference, self.batch, dev)
        host = _HostRows(max_new_tokens, self.batch, dev)
        ends = _RowEnds(n, set(eos_ids), max_new_tokens)
        forwards, steps = 1, 1
        self._emit(logits, 0, generated, margins, record_margins, host)
        st = self.step
        for j in range(1, max_new_tokens):
            # Step j-1 may still be running: decide on j-2, at the cost of at most one extra step.
            if reference is None and ends.done_after(j - 2, host):
                break
            st.tokens[:, 0].copy_(feed[j - 1])
            st.positions[:, 0].copy_(lengths)
            st.slots[:, 0].copy_(lengths)
            torch.le(self.slot_ids, lengths[:, None, None], out=st.mask)
            logits = st.replay()[:, 0]
            lengths += 1
            forwards += 1
            steps = j + 1
            self._emit(logits, j, generated, margins, record_margins, host)
        tokens = [[] for _ in range(n)]
        for j in range(steps):
            ends.collect(j, host.read(j), tokens)
        margin_rows = []
        if record_margins:
            table = margins[:steps, :n].T.tolist()
            margin_rows = [table[r][:len(tokens[r])] for r in range(n)]
        if reference is not None:
            tokens = [t[:len(ref)] for t, ref in zip(tokens, reference)]
        return ARResult(tokens, margin_rows, forwards)

    @staticmethod
    def _emit(logits, j, generated, margins, record_margins, host) -> None:
        torch.argmax(logits, dim=-1, out=generated[j])
        if record_margins:
            margins[j].copy_(top2_margin(logits))
        host.push(j, generated[j])


class _RowEnds:
    """Per-request stopping (own EOS or max_new_tokens), decided from host rows of argmaxes."""

    def __init__(self, n: int, eos: set, max_new_tokens: int):
        self.n, self.eos, self.max_new = n, eos, max_new_tokens
        self.done = [False] * n
        self.seen = -1            # last step whose tokens were checked

    def done_after(self, j: int, host: _HostRows) -> bool:
        """Whether every request has stopped by step j (reads host rows up to j)."""
        while self.seen < j:
            self.seen += 1
            row = host.read(self.seen)
            for r in range(self.n):
                if not self.done[r] and (row[r] in self.eos or self.seen + 1 >= self.max_new):
                    self.done[r] = True
        return all(self.done)

    def collect(self, j: int, row: List[int], tokens: List[List[int]]) -> None:
        for r in range(self.n):
            out = tokens[r]
            if out and (out[-1] in self.eos or len(out) >= self.max_new):
                continue
            out.append(row[r])


def _reference_rows(reference: List[List[int]], batch: int, device) -> torch.Tensor:
    """[max_len, batch] reference tokens, zero-padded past each request (those inputs only feed
    rows whose output is already complete)."""
    longest = max(len(t) for t in reference)
    table = torch.zeros((longest, batch), dtype=torch.int64)
    for r, toks in enumerate(reference):
        table[:len(toks), r] = torch.tensor(toks, dtype=torch.int64)
    return table.to(device)


def graphed_generate_ar(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                        eos_ids: Sequence[int] = (), capture: bool = True) -> ARResult:
    """Greedy AR with CUDA-graphed decode steps: the same tokens as `generate_ar`.

    Captures a graph for this batch and call; to amortise the capture over many calls, build a
    `GraphedAR` once and call its `generate`. Raises GraphsUnavailable (a SpecPilotError) on a
    machine without a CUDA GPU."""
    if capture:
        require_cuda(model.device)
    capacity = check_capacity(model, prompts, max_new_tokens, slack=1)
    decoder = GraphedAR(model, len(prompts), capacity, capture=capture)
    return decoder.generate(prompts, max_new_tokens, eos_ids, record_margins=True)
