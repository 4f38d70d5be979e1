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

With graphs on a GPU the prefill runs on a stream of its own, beside the round already queued:
a decode round of a small model leaves most of the GPU idle (it is bound by its kernels'
latency, not by their work), so the newcomer's prefill fills that room instead of following the
round. Only the copy into the row, which must come after the round (the round still writes that
row), is on the batch's stream. Two sets of scratch caches alternate, so a second newcomer in
the same gap need not wait for the first one's copy before its prefill starts.
SPECPILOT_REFILL_PREFILL=after queues it on the batch's stream after the round instead (one
scratch set), to measure what running beside the round gains.
"""
from __future__ import annotations

import os
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError

from .graphed_prefill import StaticPrefill
from .kv_cache import KVCache

SCRATCH_SETS = 2     # beside the rounds or ahead of the admission; one after the round
PLACEMENT_ENV = "SPECPILOT_REFILL_PREFILL"
PLACEMENTS = ("ahead", "beside", "after")


def prefill_placement(placement: Optional[str] = None) -> str:
    """When and where a newcomer's prefill runs: at its admission, `beside` the queued round
    (its own stream, where captured; the default); `ahead` of its admission, beside the rounds
    before it; or `after` the round on the batch's stream. `placement` as given, else the
    environment variable SPECPILOT_REFILL_PREFILL's. Ahead was no faster on an H200 (a
    newcomer's admission got cheaper, the gaps between replays longer: BENCHMARKS.md,
    twenty-fourth set), so it is not the default."""
    if placement is not None:
        if placement not in PLACEMENTS:
            raise SpecPilotError(f"prefill placement {placement!r}: expected one of "
                                 f"{', '.join(PLACEMENTS)}")
        return placement
    value = os.environ.get(PLACEMENT_ENV, "beside")
    if value not in PLACEMENTS:
        raise SpecPilotError(f"{PLACEMENT_ENV}={value!r}: expected one of {', '.join(PLACEMENTS)}")
    return value


class _Ahead(NamedTuple):
    """A newcomer prefilled ahead of its admission: its prompt, the scratch set holding it, the
    bucket width and the logits at its last token (the set's own output buffer)."""
    prompt: Tuple[int, ...]
    set: int
    width: int
    logits: torch.Tensor


class RowPrefill:
    """Prefill of one prompt into a chosen row of each (model, cache) of `models`; `run`
    returns the first model's float32 logits at the prompt's last token, [1, V]. `placement`:
    `prefill_placement`'s (None: the environment's)."""

    def __init__(self, models: Sequence[Tuple[object, KVCache]], capacity: int, capture: bool,
                 placement: Optional[str] = None):
        self.device = models[0][0].device
        # Beside the batch's stream only where the prefill is a graph: its graphs are captured
        # on this stream (cuda_graphs.capture_graph says why). High priority: the pool of
        # high-priority streams is apart from the one every other capture draws from.
        placement = prefill_placement(placement)
        self.ahead = placement == "ahead"
        self.stream = (torch.cuda.Stream(device=self.device, priority=-1)
                       if capture and self.device.type == "cuda" and placement != "after"
                       else None)
        # A set held by a newcomer prefilled ahead leaves another for the rest.
        sets = SCRATCH_SETS if self.stream is not None or self.ahead else 1
        # (the batch's cache, this prefill's one-row scratch caches, a set each) per model
        self.caches: List[Tuple[KVCache, List[KVCache]]] = [
            (cache, [model.new_cache(1, capacity) for _ in range(sets)]) for model, cache in models]
        self._prefills = [StaticPrefill([(model, scratch[s]) for (model, _), (_, scratch)
                                         in zip(models, self.caches)],
                                        1, capacity, capture, bounded=True, stream=self.stream)
                          for s in range(sets)]
        if self.stream is not None:
            self._prefilled = [torch.cuda.Event() for _ in range(sets)]
            self._read = [torch.cuda.Event() for _ in range(sets)]    # the set's scratch is free
        self._next = 0
        self._held: Optional[_Ahead] = None

    def prepare(self, lengths: Sequence[int]) -> None:
        """Build (capture) the buckets of these prompt lengths now, e.g. before timing."""
        for prefill in self._prefills:
            prefill.prepare(lengths)

    def _copy(self, s: int, row: int, width: int) -> None:
        """The bucket's slots of scratch set `s` into `row` of the batch's caches (slots past
        the prompt hold padding, as a batch prefill leaves them): `KVCache.copy_row_from`, one
        copy for K and one for V a model where the caches keep their layers stacked."""
        for cache, scratch in self.caches:
            cache.copy_row_from(row, scratch[s], 0, width)

    def _take_set(self) -> int:
        """The next scratch set in turn that no newcomer prefilled ahead holds."""
        held = None if self._held is None else self._held.set
        s = self._next
        if s == held:
            s = (s + 1) % len(self._prefills)
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
        """Drop a newcomer prefilled ahead (a call's end or start: the next call's queue is
        another)."""
        self._held = None

    def prefetch(self, prompt: Sequence[int]) -> None:
        """Prefill `prompt`, the next newcomer, ahead of its admission, where the placement is
        `ahead` and no other is held: its `run` then only copies it into its row."""
        if not self.ahead or self._held is not None:
            return
        s = self._take_set()
        logits, width = self._prefill(s, prompt)
        self._held = _Ahead(tuple(prompt), s, width, logits)

    def run(self, row: int, prompt: Sequence[int]) -> torch.Tensor:
        """Prefill `prompt` into `row` of every cache; the logits at its last token (a tensor
        of its own). On the batch's stream, the row is written after everything queued there
        before this call, and the logits are ready for what is queued after it. A prompt
        prefilled ahead (`prefetch`) is only copied."""
        held = self._held
        if held is not None and held.prompt == tuple(prompt):
            self._held = None
            s, width, logits = held.set, held.width, held.logits
        else:
            s = self._take_set()
            logits, width = self._prefill(s, prompt)
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self._prefilled[s])
        self._copy(s, row, width)
        logits = logits.clone()
        if self.stream is not None:
            self._read[s].record()
        return logits
