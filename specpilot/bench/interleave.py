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
for single rounds. (Side by side, run 70's per-depth rows cost the fixed chain's a forward, run
71's still 2.7 % more; a place in the order cost at most about 1 %: thirty-third set.) Each run
records when it began, to lay it beside a log of the GPU's clocks (bench/clock_drift.py).

Peak memory is reported as if the system had run alone: the memory resident before any system
of the group was set up (the models), plus the most the system itself held: after its set-up
and warm-up, with its timed runs' transient on top (the others' resident memory taken out).
"""
from __future__ import annotations

import gc
import time
from typing import Dict, List, Optional, Sequence, Tuple

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.graphed_program import kept_decoders

from .gc_pause import gc_paused
from .measure import (GpuMemory, checked, new_tokens_of, skipped_row, timed_row, timed_run,
                      warm_up)
from .systems import RunOutput, System
from .workload import fill_batches, filled_reference


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
    group = _Group(systems, prompts, reference, batch_size, max_new_tokens, device,
                   progress or (lambda message: None))
    # Each Program system keeps one decoder cached, and its check may capture one more.
    with kept_decoders(2 * len(systems) + 1):
        try:
            group.set_up(warmup)
            with gc_paused():
                for turn in range(repeats):
                    group.time_pass(turn, repeats)
            group.check()
        finally:
            for system in systems:
                system.teardown()
    return [group.out[s.name] for s in systems]


def interleaved_rows(bench: dict) -> Dict[int, List[dict]]:
    """The measured, interleaved rows of a bench document by batch size (ValueError if none):
    what bench/order_effect.py and bench/clock_drift.py read."""
    out: Dict[int, List[dict]] = {}
    for r in bench["rows"]:
        if r.get("status") == "measured" and r.get("timing", {}).get("mode") == "interleaved":
            out.setdefault(r["batch_size"], []).append(r)
    if not out:
        raise ValueError("no interleaved rows: run `specpilot bench --interleave`")
    return out


class _Group:
    """One batch size's systems measured side by side: what each has left, by phase."""

    def __init__(self, systems, prompts, reference, batch_size: int, max_new_tokens: int,
                 device: str, say):
        self.systems, self.batch, self.max_new = systems, batch_size, max_new_tokens
        self.device = device
        self.workload = fill_batches(prompts, batch_size)
        self.ref = filled_reference(reference, batch_size)
        self.say = say
        self.memory = GpuMemory(device)
        self.out: Dict[str, Tuple[dict, Optional[RunOutput]]] = {}
        self.live: List[System] = []            # set up, and not failed since
        self.names: List[str] = []              # the group its passes started with
        self.held: Dict[str, Tuple[int, int]] = {}  # (resident bytes, set-up and warm-up peak)
        self.seconds: Dict[str, List[float]] = {}
        self.places: Dict[str, List[int]] = {}
        # When each timed run began (seconds since the epoch): to lay the runs beside a log of
        # the GPU's clocks and temperature (bench/gpu_run.sh CLOCK_LOG, bench/clock_drift.py).
        self.started: Dict[str, List[float]] = {}
        self.transient: Dict[str, int] = {}
        self.first: Dict[str, RunOutput] = {}
        # What an earlier group released in reference cycles is freed first: not the models'.
        gc.collect()
        self.models = self.memory.now()

    def fail(self, system: System, exc: Exception) -> None:
        self.out[system.name] = skipped_row(system, self.batch, str(exc), status="failed"), None
        if system in self.live:
            self.live.remove(system)

    def set_up(self, warmup: int) -> None:
        """Each available system set up and warmed in turn, its memory noted; kept alive."""
        for system in self.systems:
            reason = system.unavailable(self.batch)
            if reason:
                self.out[system.name] = skipped_row(system, self.batch, reason), None
                continue
            before = self.memory.now()
            try:
                system.setup(self.batch, self.workload, self.max_new)
                self.memory.reset_peak()
                warm_up(system, self.workload, self.batch, self.max_new, warmup)
            except SpecPilotError as exc:
                self.fail(system, exc)
                continue
            self.held[system.name] = (self.memory.now() - before, self.memory.peak() - before)
            self.live.append(system)
        self.names = [s.name for s in self.live]
        for name in self.names:
            self.seconds[name], self.places[name], self.started[name] = [], [], []
            self.transient[name] = 0

    def time_pass(self, turn: int, repeats: int) -> None:
        """Pass `turn`: every live system's workload timed once, in the order rotated `turn`."""
        order = rotated(self.live, turn)
        self.say(f"  pass {turn + 1}/{repeats}: {', '.join(s.name for s in order)}")
        for place, system in enumerate(order):
            start_bytes = self.memory.now()
            self.memory.reset_peak()
            began = time.time()
            try:
                took, run = timed_run(system, self.workload, self.batch, self.max_new,
                                      self.device)
            except SpecPilotError as exc:
                self.fail(system, exc)
                continue
            name = system.name
            self.seconds[name].append(took)
            self.places[name].append(place)
            self.started[name].append(began)
            self.transient[name] = max(self.transient[name], self.memory.peak() - start_bytes)
            self.first.setdefault(name, run)
            self.say(f"  {name} batch {self.batch} pass {turn + 1}/{repeats}: "
                     f"{new_tokens_of(run) / took:.1f} tokens/s")

    def check(self) -> None:
        """Each live system forced (its check) and its row made."""
        for system in list(self.live):
            name = system.name
            try:
                checks = checked(system, self.workload, self.batch, self.ref, self.first[name])
            except SpecPilotError as exc:
                self.fail(system, exc)
                continue
            resident, warm_peak = self.held[name]
            peak = (self.models + max(warm_peak, resident + self.transient[name])
                    if self.memory.cuda else None)
            row = timed_row(system, self.batch, len(self.workload), self.seconds[name],
                            self.first[name], peak, checks)
            row["timing"] = {"mode": "interleaved", "systems": self.names,
                             "places": self.places[name], "started": self.started[name]}
            self.out[name] = row, self.first[name]
