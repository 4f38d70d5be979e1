"""What the bench's warm-up runs (specpilot/bench/measure.py): a graphed system warms up on the
whole workload, so that its first timed run meets nothing new (a refill system refills only
past its first batch); the slow eager and HF baselines on one batch."""
import gc
import random

import pytest

from specpilot.bench.measure import measure
from specpilot.bench.systems import RunOutput, System
from specpilot.runtime.ar import ARResult


class _Recording(System):
    """Echoes each prompt's first token as its output and records every run's prompts."""
    name = "recording"

    def __init__(self, graphed):
        super().__init__()
        self.graphed, self.runs = graphed, []

    def run(self, prompts, batch_size, max_new_tokens):
        self.runs.append(list(prompts))
        return RunOutput([[p[0]] for p in prompts], len(prompts))

    def check(self, prompts, batch_size, reference, output):
        return {}


@pytest.mark.parametrize("graphed", [True, False])
def test_graphed_systems_warm_up_on_the_whole_workload(graphed):
    rng = random.Random(5)
    prompts = [[rng.randrange(100)] for _ in range(10)]
    reference = ARResult([[p[0]] for p in prompts], [[1.0] for _ in prompts], len(prompts))
    system = _Recording(graphed)
    row, _ = measure(system, prompts, reference, 4, 8, warmup=1, repeats=2, device="cpu")
    workload = prompts + prompts[:2]                      # filled up to whole batches of 4
    assert row["status"] == "measured" and row["exact_match"]["all_exact"]
    assert system.runs[0] == (workload if graphed else workload[:4])
    assert system.runs[1:] == [workload, workload]


class _Cycle:
    """Garbage in a reference cycle (only the collector frees it), recording when it is freed."""
    def __init__(self, log, system):
        self.me, self.log, self.system = self, log, system

    def __del__(self):
        self.log.append(len(self.system.runs))


class _GcWatching(_Recording):
    def __init__(self):
        super().__init__(graphed=True)
        self.enabled = []

    def run(self, prompts, batch_size, max_new_tokens):
        self.enabled.append(gc.isenabled())
        return super().run(prompts, batch_size, max_new_tokens)


def test_garbage_is_collected_before_the_timed_runs_and_not_during_them():
    # A released decoder in a reference cycle holds CUDA graphs whose destruction synchronises
    # the device: it must not be freed inside a timed run of the next system.
    rng = random.Random(6)
    prompts = [[rng.randrange(100)] for _ in range(4)]
    reference = ARResult([[p[0]] for p in prompts], [[1.0] for _ in prompts], len(prompts))
    system, freed = _GcWatching(), []
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1_000_000)                 # no automatic collection in this test
    try:
        _Cycle(freed, system)                   # unreachable at once, in a cycle
        assert gc.isenabled()
        row, _ = measure(system, prompts, reference, 4, 8, warmup=1, repeats=3, device="cpu")
    finally:
        gc.set_threshold(*thresholds)
    assert row["status"] == "measured"
    assert freed == [1]                         # after the warm-up run, before the timed ones
    assert system.enabled == [True, False, False, False]     # warm-up, then three timed runs
    assert gc.isenabled()                                   # and back on afterwards


class _Counting(_Recording):
    """Reports its run's index among its runs as its decoder counts."""
    def run(self, prompts, batch_size, max_new_tokens):
        out = super().run(prompts, batch_size, max_new_tokens)
        out.stats = {"run": len(self.runs), "rounds_chain_4": 7 * len(self.runs)}
        return out


def test_a_row_keeps_the_first_timed_runs_decoder_counts():
    rng = random.Random(7)
    prompts = [[rng.randrange(100)] for _ in range(4)]
    reference = ARResult([[p[0]] for p in prompts], [[1.0] for _ in prompts], len(prompts))
    row, _ = measure(_Counting(graphed=True), prompts, reference, 4, 8, warmup=1, repeats=2,
                     device="cpu")
    assert row["run_stats"] == {"run": 2, "rounds_chain_4": 14}   # not the warm-up's (run 1)
    bare, _ = measure(_Recording(graphed=True), prompts, reference, 4, 8, warmup=1, repeats=1,
                      device="cpu")
    assert "run_stats" not in bare                               # a system that keeps none
