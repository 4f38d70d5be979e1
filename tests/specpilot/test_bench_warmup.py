"""What the bench's warm-up runs (specpilot/bench/measure.py): a graphed system warms up on the
whole workload, so that its first timed run meets nothing new (a refill system refills only
past its first batch); the slow eager and HF baselines on one batch."""
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
