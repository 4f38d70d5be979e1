"""Wall-clock guard of one training stage: fit the schedule to a time limit, stop past it.

A preset sizes its steps for an assumed throughput; a slower device must not blow the time
budget. After a short probe (from step PROBE_START to the end of warm-up, where the learning rate
is at its peak and a shorter cosine joins without a jump) the measured step time projects the
stage's duration; if that is past the limit, the schedule is cut to the steps that fit, so the
learning rate still decays to its floor. If the stage nonetheless runs past the limit, it stops
after the current step. Without a limit nothing is measured and nothing changes.
"""
import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

import torch

from specpilot.zoo.presets import StageSchedule

PROBE_START = 3       # the first steps include one-off costs (kernel selection, allocator growth)
PROBE_MIN_STEPS = 8   # fewest steps timed before the schedule is refitted
FIT_MARGIN = 0.97     # share of the remaining time the refitted schedule plans for


@dataclass
class StageResult:
    """What one training stage did."""

    final_loss: float                   # mean training loss over the last logged window
    planned_steps: int                  # the preset's steps
    steps: int                          # optimiser steps taken
    tokens: int                         # training tokens seen
    seconds: float
    rescheduled_to: Optional[int] = None          # steps of the refitted schedule, if refitted
    stopped_early_at_step: Optional[int] = None   # set when the limit stopped the stage

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StageClock:
    """Times one stage against `max_seconds` (None: no limit); see the module docstring."""

    def __init__(self, max_seconds: Optional[float], device: torch.device, sched: StageSchedule):
        self.max_seconds, self.device = max_seconds, torch.device(device)
        self.probe_end = max(sched.warmup, PROBE_START + PROBE_MIN_STEPS)
        self.start = time.perf_counter()
        self._probe_t0 = None
        self.rescheduled_to = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def after_step(self, done: int, sched: StageSchedule, label: str, progress):
        """Called after `done` steps; returns (schedule to continue with, stop now?)."""
        if self.max_seconds is None:
            return sched, False
        if done == PROBE_START:
            _sync(self.device)
            self._probe_t0 = time.perf_counter()
        elif done == self.probe_end and self._probe_t0 is not None and done < sched.steps:
            _sync(self.device)
            per_step = (time.perf_counter() - self._probe_t0) / (done - PROBE_START)
            elapsed = self.elapsed()
            projected = elapsed + per_step * (sched.steps - done)
            if projected > self.max_seconds:
                fit = done + int(FIT_MARGIN * max(0.0, self.max_seconds - elapsed) / per_step)
                fit = max(done + 1, min(sched.steps, fit))
                progress(f"[{label}] {sched.steps} steps would take ~{projected:.0f}s at "
                         f"{per_step:.3f}s/step, past the {self.max_seconds:.0f}s limit: "
                         f"schedule refitted to {fit} steps")
                self.rescheduled_to = fit
                sched = dataclasses.replace(sched, steps=fit)
        if done < sched.steps and self.elapsed() > self.max_seconds:
            progress(f"[{label}] stopped early at step {done}/{sched.steps}: the "
                     f"{self.max_seconds:.0f}s limit of this stage was reached")
            return sched, True
        return sched, False
