"""Systems timed side by side at one batch size (`specpilot bench --interleave`): each is set up
and warmed in turn and kept alive; then `repeats` passes time every system's whole workload
once, the order rotated by one system each pass; then each is checked and torn down.

Why: measured one after another, two systems' medians can differ by a few percent for reasons
outside them. On an H200 the per-depth adaptive rows, benched after the others, took 1.5-2.5 %
more time a target forward than the fixed chain while running the same rounds, on four of five
pairs (runs 64-69 at batch 16); on the timeline script, which runs its decoders in another
order, the per-depth decoder was level with the chain (run 67; BENCHMARKS.md, thirty-second
set). Whether that is the rows' own cost or their place in the order, only a bench that varies
the order can tell. Rotated passes give every system each place in the order, so drift over
the bench (clocks, memory, the host) falls on all of them alike, as bench/round_variants.py does
for single rounds.

Peak memory is reported as if the system had run alone: the memory resident before any system
of the group was set up (the models), plus the most the system itself held: after its set-up
and warm-up, with its timed runs' transient on top (the others' resident memory taken out).
"""
from __future__ import annotations

import gc
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.graphed_program import kept_decoders

from .correctness import exact_match
from .gc_pause import gc_paused
from .measure import _new_tokens, _sync, skipped_row, timed_row
from .systems import RunOutput, System
from .workload import fill_batches, filled_reference


class _Memory:
    """The GPU's allocated bytes and peak, where there is a GPU (else every reading is 0)."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"
        self.device = device

    def now(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else 0


def rotated(items: Sequence, turn: int) -> list:
    """`items` starting at position turn mod len(items): pass `turn`'s order."""
    if not items:
        return []
    at = turn % len(items)
    return list(items[at:]) + list(items[:at])


def measure_interleaved(systems: Sequence[System], prompts, reference, batch_size: int,
                        max_new_tokens: int, warmup: int, repeats: int, device: str,
                        progress=None) -> List[Tuple[dict, Optional[RunOutput]]]:
    """Measure `systems` side by side at `batch_size` (module docstring); one (row, first timed
    run's output) per system, in the order given. A system that is unavailable, or whose set-up,
    run or check raises a SpecPilotError, gets a skipped or failed row; the others go on."""
    if repeats < 1:
        raise SpecPilotError(f"interleaved timing needs at least one timed pass, got {repeats}")
    say = progress or (lambda message: None)
    workload = fill_batches(prompts, batch_size)
    ref = filled_reference(reference, batch_size)
    memory = _Memory(device)
    out: Dict[str, Tuple[dict, Optional[RunOutput]]] = {}
    live: List[System] = []
    held: Dict[str, Tuple[int, int]] = {}       # name: (resident bytes, set-up and warm-up peak)
    # What an earlier group released in reference cycles is freed first: it is not the models'.
    gc.collect()
    models = memory.now()

    def fail(system: System, exc: Exception) -> None:
        out[system.name] = skipped_row(system, batch_size, str(exc), status="failed"), None
        if system in live:
            live.remove(system)

    # Each Program system keeps one decoder cached, and its check may capture one more.
    with kept_decoders(2 * len(systems) + 1):
        try:
            for system in systems:
                reason = system.unavailable(batch_size)
                if reason:
                    out[system.name] = skipped_row(system, batch_size, reason), None
                    continue
                before = memory.now()
                try:
                    system.setup(batch_size, workload, max_new_tokens)
                    memory.reset_peak()
                    # Graphed systems warm on the whole workload, the others on one batch
                    # (specpilot/bench/measure.py).
                    warm = workload if system.graphed else workload[:batch_size]
                    for _ in range(warmup):
                        system.run(warm, batch_size, max_new_tokens)
                    _sync(device)
                except SpecPilotError as exc:
                    fail(system, exc)
                    continue
                held[system.name] = (memory.now() - before, memory.peak() - before)
                live.append(system)
            names = [s.name for s in live]             # the group its passes started with
            seconds: Dict[str, List[float]] = {s.name: [] for s in live}
            places: Dict[str, List[int]] = {s.name: [] for s in live}
            transient: Dict[str, int] = {s.name: 0 for s in live}
            first: Dict[str, RunOutput] = {}
            with gc_paused():
                for turn in range(repeats):
                    order = rotated(live, turn)
                    say(f"  pass {turn + 1}/{repeats}: {', '.join(s.name for s in order)}")
                    for place, system in enumerate(order):
                        start_bytes = memory.now()
                        memory.reset_peak()
                        try:
                            _sync(device)
                            start = time.perf_counter()
                            run = system.run(workload, batch_size, max_new_tokens)
                            _sync(device)
                        except SpecPilotError as exc:
                            fail(system, exc)
                            continue
                        took = time.perf_counter() - start
                        name = system.name
                        seconds[name].append(took)
                        places[name].append(place)
                        transient[name] = max(transient[name], memory.peak() - start_bytes)
                        first.setdefault(name, run)
                        say(f"  {name} batch {batch_size} pass {turn + 1}/{repeats}: "
                            f"{_new_tokens(run) / took:.1f} tokens/s")
            for system in list(live):
                name = system.name
                try:
                    checks = system.check(workload, batch_size, ref, first[name])
                except SpecPilotError as exc:
                    fail(system, exc)
                    continue
                checks.setdefault("exact_match", exact_match(first[name].tokens, ref.tokens))
                resident, warm_peak = held[name]
                peak = (models + max(warm_peak, resident + transient[name])
                        if memory.cuda else None)
                row = timed_row(system, batch_size, len(workload), seconds[name], first[name],
                                peak, checks)
                row["timing"] = {"mode": "interleaved", "systems": names,
                                 "places": places[name]}
                out[name] = row, first[name]
        finally:
            for system in systems:
                system.teardown()
    return [out[s.name] for s in systems]
