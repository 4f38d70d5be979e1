"""Timed runs without the garbage collector: it collects once before them and stays off during
them. An earlier measurement's decoders, released in reference cycles, hold CUDA graphs and
memory pools whose destruction synchronises the device; freed by a collection inside a timed
run, they would be timed as that run's work (specpilot/bench/measure.py,
bench/refill_timeline.py)."""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Collect, then keep the collector off until the block ends (as it was before, after)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
