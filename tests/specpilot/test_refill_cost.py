"""bench/refill_cost.py end to end at a tiny scale, uncaptured on the CPU: its eager one-row
prefill writes that row of both caches as a prefill into a fresh one-row cache does (and no
other row), and its refill decode gives every request the padded loop's tokens."""
import json

import torch

from bench_script import load_bench_script
from hf_factory import random_prompts
from specpilot.bench.shapes import random_pair
from specpilot.runtime.steps import append_step


def test_the_eager_row_prefill_writes_one_row_as_a_fresh_prefill_does():
    script = load_bench_script("refill_cost")
    target, drafter, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 1 / 32)
    caches = [(m, m.new_cache(3, 32)) for m in (target, drafter)]
    g = torch.Generator().manual_seed(5)
    for _, cache in caches:
        for t in cache.k + cache.v:
            t.copy_(torch.randn(t.shape, generator=g))
    before = [[t.clone() for t in c.k + c.v] for _, c in caches]
    prompt = random_prompts((9,), seed=6)[0]
    script.eager_row_prefill(caches, 2, prompt)
    for (model, cache), old in zip(caches, before):
        fresh = model.new_cache(1, 32)
        append_step(model, fresh, torch.zeros(1, dtype=torch.int64), [list(prompt)])
        for now, then, want in zip(cache.k + cache.v, old, fresh.k + fresh.v):
            torch.testing.assert_close(now[2, :9], want[0, :9])
            assert torch.equal(now[:2], then[:2])


def test_the_script_runs_and_refill_gives_the_padded_tokens(tmp_path):
    script = load_bench_script("refill_cost")
    out = tmp_path / "rc.json"
    assert script.main(["--scale", "0.03125", "--batch-sizes", "2", "--requests", "3",
                        "--prompt-lengths", "4,9", "--new-tokens", "2,5", "--repeats", "1",
                        "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["batch"] for r in doc["prefill"]] == [2]
    rows = {r["system"]: r for r in doc["decode"]}
    refill = rows["plain AR, refill"]
    assert refill["refills"] == 1 and refill["requests_equal_to_padded"] == 3
