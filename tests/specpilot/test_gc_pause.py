"""specpilot/bench/gc_pause.py: garbage in a cycle is freed on entry, the collector is off inside
and as it was afterwards, an exception included."""
import gc

import pytest

from specpilot.bench.gc_pause import gc_paused


class _Cycle:
    def __init__(self, log):
        self.me, self.log = self, log

    def __del__(self):
        self.log.append("freed")


def test_entry_collects_and_the_block_runs_without_the_collector():
    freed = []
    _Cycle(freed)
    with gc_paused():
        assert freed == ["freed"] and not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_is_restored_after_an_error_and_left_off_if_it_was():
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("a timed run failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
