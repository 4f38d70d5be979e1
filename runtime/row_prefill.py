"""One newcomer's prefill into one row of a running batch's caches.

Continuous refill (runtime/graphed_refill.py) prefills each newcomer on its own, between two
replays of the batch's round graphs. Run eagerly, that prefill was the refill's cost: on an
H200, with 64 HumanEval prompts on 4 and 16 slots of a 161M/12.6M pair, each refill added about
26 ms, so plain AR with refill ran at 0.48-0.70x the padded loop although it needed 20-35 %
fewer target forwards; the eager prefill alone took 17.6-23.5 ms on those shapes, the graph
1.7-2.0 ms (BENCHMARKS.md, fourth and twelfth sets). Here both models prefill the prompt at
batch 1 into scratch caches, padded to a bucket width and attending over the bucket's slots only
(runtime/graphed_prefill.py, a graph per bucket), and the bucket's slots are then copied into
the chosen row.

With graphs on a GPU the prefill runs on a stream of its own, beside the rounds: a decode round
of a small model leaves most of the GPU idle (it is bound by its kernels' latency, not by their
work), so the newcomer's prefill fills that room instead of following the round. Only the copy
into the row, which must come after the round (the round still writes that row), is on the
batch's stream. Two sets of scratch caches alternate, so a second newcomer's prefill need not
wait for the first one's copy. A model that keeps workspaces serving one call at a time (the
fused drafter's split attention) prefills through a twin with its own, since the rounds run it
at the same time.

By default (`ahead`) the queue's next newcomers are prefilled before any row is free for them
(up to `ahead_depth` of them, SPECPILOT_REFILL_AHEAD), each copied on the prefill's stream from
its scratch set into a staging cache of its own, so that the sets stay free for the next one; an
admission is then only the copy from staging into the row. SPECPILOT_REFILL_PREFILL=beside
prefills a newcomer at its admission instead: the host queues it once it has read a finished
row back, while the replay after that row runs, and the next replay waits for it. On an H200
(batch 16, 164 HumanEval prompts, BENCHMARKS.md, thirtieth set) ahead, four held, took a
call's admissions from 49.7 to 18.2 ms on the GPU's timeline and the call 2.5 % less time with
chain(4), 1.6 % less with adaptive lengths. SPECPILOT_REFILL_PREFILL=after queues the prefill
on the batch's stream after the round (one scratch set), to measure what running beside gains.
"""
from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from typing import Deque, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .env_counts import env_choice, env_count, given_count
from .graphed_prefill import StaticPrefill
from .kv_cache import KVCache

SCRATCH_SETS = 2     # on the prefill's own stream; one on the batch's (after the round)
PLACEMENT_ENV = "SPECPILOT_REFILL_PREFILL"
PLACEMENTS = ("ahead", "beside", "after")
AHEAD_ENV = "SPECPILOT_REFILL_AHEAD"
# Newcomers held prefilled ahead of their admission (placement `ahead`): more than one, since
# several rows may finish between two read-backs (BENCHMARKS.md: at batch 16, 33 of run 63's
# 478 gaps had more than one admission; four held, 142 of its 148 newcomers were prefilled
# ahead, one held 102; thirtieth set). A staging cache each: at the zoo pair's
# shapes (K/V of 12 layers of 4 kv heads and 4 of 2, head_dim 64, bf16) and a 1272-slot cache
# some 18 MB.
AHEAD_DEPTH = 4
MAX_AHEAD_DEPTH = 16


def prefill_placement(placement: Optional[str] = None) -> str:
    """When and where a newcomer's prefill runs: `ahead` of its admission, beside the rounds
    before it (its own stream, where captured; the default); at its admission, `beside` the
    queued round; or `after` the round on the batch's stream. `placement` as given, else the
    environment variable SPECPILOT_REFILL_PREFILL's. Ahead became the default once the
    admission no longer waited on the host and newcomers were held more than one deep: it was
    no faster when an admission's host work outlasted a replay (BENCHMARKS.md, twenty-fourth
    set), and faster after (thirtieth set)."""
    return env_choice(PLACEMENT_ENV, "ahead", PLACEMENTS, placement, "prefill placement")


def ahead_depth(depth: Optional[int] = None) -> int:
    """How many newcomers the placement `ahead` holds prefilled: `depth` as given, else the
    environment variable SPECPILOT_REFILL_AHEAD's, else AHEAD_DEPTH; 1..MAX_AHEAD_DEPTH."""
    if depth is None:
        return env_count(AHEAD_ENV, AHEAD_DEPTH, "newcomers", MAX_AHEAD_DEPTH)
    return given_count(depth, "ahead depth", "newcomers", MAX_AHEAD_DEPTH)


def own_workspaces(model):
    """`model`, or where it keeps workspaces that serve one call at a time, a twin with its
    own (`FusedForward.with_own_workspaces`)."""
    twin = getattr(model, "with_own_workspaces", None)
    return twin() if twin is not None else model


class _Ahead(NamedTuple):
    """A newcomer prefilled ahead of its admission: its prompt, the staging slot holding its
    K/V and logits, and its bucket width."""
    prompt: Tuple[int, ...]
    slot: int
    width: int


class RowPrefill:
    """Prefill of one prompt into a chosen row of each (model, cache) of `models`; `run`
    returns the first model's float32 logits at the prompt's last token, [1, V]. `placement`:
    `prefill_placement`'s (None: the environment's); `depth`: `ahead_depth`'s, read only where
    the placement is `ahead` (None: the environment's)."""

    def __init__(self, models: Sequence[Tuple[object, KVCache]], capacity: int, capture: bool,
                 placement: Optional[str] = None, depth: Optional[int] = None):
        self.device = models[0][0].device
        # Beside the batch's stream only where the prefill is a graph: its graphs are captured
        # on this stream (cuda_graphs.capture_graph says why). High priority: the pool of
        # high-priority streams is apart from the one every other capture draws from.
        placement = prefill_placement(placement)
        self.ahead = placement == "ahead"
        self.depth = ahead_depth(depth) if self.ahead else 0
        self.stream = (torch.cuda.Stream(device=self.device, priority=-1)
                       if capture and self.device.type == "cuda" and placement != "after"
                       else None)
        # On its own stream a newcomer's prefill may start while the one before it is still
        # being copied out of the other set.
        sets = SCRATCH_SETS if self.stream is not None else 1
        if self.stream is not None:
            # ... and runs while the rounds run the same models: a model with workspaces (the
            # fused drafter's split attention) prefills with workspaces of its own.
            models = [(own_workspaces(model), cache) for model, cache in models]
        # The batch's caches, and one-row caches of every model per scratch set and per
        # staging slot (a newcomer held ahead, with its logits at its last token)
        self.batch_caches: List[KVCache] = [cache for _, cache in models]
        self.scratch: List[List[KVCache]] = [[model.new_cache(1, capacity) for model, _ in models]
                                             for _ in range(sets)]
        self._prefills = [StaticPrefill(list(zip([model for model, _ in models], caches)),
                                        1, capacity, capture, bounded=True, stream=self.stream)
                          for caches in self.scratch]
        self.staging: List[List[KVCache]] = [[model.new_cache(1, capacity) for model, _ in models]
                                             for _ in range(self.depth)]
        self._staged_logits = torch.empty((self.depth, models[0][0].config.vocab_size),
                                          dtype=torch.float32, device=self.device)
        if self.stream is not None:
            self._prefilled = [torch.cuda.Event() for _ in range(sets)]
            self._read = [torch.cuda.Event() for _ in range(sets)]    # the set's scratch is free
            self._staged = [torch.cuda.Event() for _ in range(self.depth)]  # the slot is filled
            self._taken = [torch.cuda.Event() for _ in range(self.depth)]   # ... and copied out
        self._next = 0
        self._held: Deque[_Ahead] = deque()
        # Free staging slots, the one freed last taken last: its copy into a row may still be
        # queued behind the round, and a fill of it would wait for that copy.
        self._free: Deque[int] = deque(range(self.depth))

    def prepare(self, lengths: Sequence[int]) -> None:
        """Build (capture) the buckets of these prompt lengths now, e.g. before timing."""
        for prefill in self._prefills:
            prefill.prepare(lengths)

    @staticmethod
    def _copy(into: List[KVCache], row: int, source: List[KVCache], width: int) -> None:
        """The first `width` slots of each model's one-row cache in `source` into `row` of its
        cache in `into` (slots past the prompt hold padding, as a batch prefill leaves them):
        `KVCache.copy_row_from`, one copy for K and one for V a model where the caches keep
        their layers stacked."""
        for cache, one_row in zip(into, source):
            cache.copy_row_from(row, one_row, 0, width)

    def _take_set(self) -> int:
        """The next scratch set in turn."""
        s = self._next
        self._next = (s + 1) % len(self._prefills)
        return s

    def _prefill(self, s: int, prompt: Sequence[int]) -> Tuple[torch.Tensor, int]:
        """Prefill `prompt` into scratch set `s` (on the prefill's stream, once the set's last
        copy is done); (the set's logits buffer, the bucket width)."""
        prefill = self._prefills[s]
        if self.stream is None:
            return prefill.run([list(prompt)]), prefill.width_for(len(prompt))
        self.stream.wait_event(self._read[s])      # the set's last copy and logits are read
        with torch.cuda.stream(self.stream):
            logits = prefill.run([list(prompt)])
            self._prefilled[s].record()
        return logits, prefill.width_for(len(prompt))

    def forget(self) -> None:
        """Drop the newcomers prefilled ahead (a call's end or start: the next call's queue is
        another). Their staging slots are free again: a slot's next fill waits, on the prefill's
        stream, for its last copy into a row."""
        self._held.clear()
        self._free = deque(range(self.depth))

    def prefetch(self, upcoming: Sequence[Sequence[int]]) -> int:
        """Where the placement is `ahead`, hold the first `depth` of `upcoming` (the queue's
        next newcomers, in the order they will be admitted) prefilled, each in a staging slot:
        their `run` then only copies. Those held already are the first of them; a queue that
        no longer starts with them drops them. Returns how many it prefilled now."""
        if not self.ahead:
            return 0
        want = [tuple(p) for p in upcoming[:self.depth]]
        if [a.prompt for a in self._held] != want[:len(self._held)]:
            self.forget()
        fresh = want[len(self._held):]
        for prompt in fresh:
            self._stage(prompt)
        return len(fresh)

    def _stage(self, prompt: Tuple[int, ...]) -> None:
        """Prefill `prompt` into a scratch set and copy it into a free staging slot (both on
        the prefill's stream, where it has one): the set is free again for the next prefill."""
        slot = self._free.popleft()
        s = self._take_set()
        logits, width = self._prefill(s, prompt)
        if self.stream is not None:
            self.stream.wait_event(self._taken[slot])
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            self._copy(self.staging[slot], 0, self.scratch[s], width)
            self._staged_logits[slot].copy_(logits[0])
            if self.stream is not None:
                self._staged[slot].record()
                self._read[s].record()
        self._held.append(_Ahead(prompt, slot, width))

    def run(self, row: int, prompt: Sequence[int]) -> torch.Tensor:
        """Prefill `prompt` into `row` of every cache; the logits at its last token (a tensor
        of its own). On the batch's stream, the row is written after everything queued there
        before this call, and the logits are ready for what is queued after it. The next
        newcomer held ahead (`prefetch`), where it is this prompt, is only copied."""
        held = self._held
        if held and held[0].prompt == tuple(prompt):
            ahead = held.popleft()
            if self.stream is not None:
                torch.cuda.current_stream(self.device).wait_event(self._staged[ahead.slot])
            self._copy(self.batch_caches, row, self.staging[ahead.slot], ahead.width)
            logits = self._staged_logits[ahead.slot:ahead.slot + 1].clone()
            if self.stream is not None:
                self._taken[ahead.slot].record()
            self._free.append(ahead.slot)
            return logits
        if held:
            self.forget()          # admitted out of the queue's order: hold them no more
        s = self._take_set()
        logits, width = self._prefill(s, prompt)
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self._prefilled[s])
        self._copy(self.batch_caches, row, self.scratch[s], width)
        logits = logits.clone()
        if self.stream is not None:
            self._read[s].record()
        return logits
