"""bench/fused_drafter_race.py end to end at a tiny size: the drafter's steps timed both ways, the
fixed chains and the adaptive decoder with either drafter raced against plain AR, one entry per
batch size; in float32 the fused drafter drafts what the model drafts, so the fused and the model
decoders run the same rounds.

The script's random-weight presets give the drafter head_dim 16 only from --scale 0.25 (4 layers
of 96, a 2048-token vocabulary), where one fused step takes seconds in Triton's interpreter; so
the models come from a tiny checkpoint instead (`decode_models` replaced): a target of 2 layers
with head_dim 32 and a noisy copy of it as the drafter, which agrees with the target often, so
the chains accept drafts and their rounds say something."""
import json

import pytest

from bench_script import count_fused_forwards, load_bench_script
from hf_factory import fusable_pair, random_prompts
from torch_threads import single_thread_fixture

one_thread = single_thread_fixture()

PROMPT_LEN, NEW, K, CALLS = 3, 4, 2, 1
BATCHES = (2,)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return fusable_pair(tmp_path_factory.mktemp("race"), seed=4, noise_seed=11)


def test_the_race_times_both_drafters_and_they_run_the_same_rounds(models, tmp_path,
                                                                   monkeypatch):
    target, drafter = models
    script = load_bench_script("fused_drafter_race")
    asked = []

    def tiny_models(args, count):
        asked.append((args.prompt_len, count))
        prompts = random_prompts([args.prompt_len] * count, seed=21)
        return target, drafter, prompts, [], False          # no eos, uncaptured

    monkeypatch.setattr(script, "decode_models", tiny_models)
    fused_calls = count_fused_forwards(monkeypatch, script)
    out = tmp_path / "r.json"
    assert script.main(["--prompt-len", str(PROMPT_LEN), "--new-tokens", str(NEW), "--k", str(K),
                        "--calls", str(CALLS), "--batch-sizes", ",".join(map(str, BATCHES)),
                        "--out", str(out)]) == 0
    assert asked == [(PROMPT_LEN, max(BATCHES))]                 # the largest batch's prompts
    doc = json.loads(out.read_text())
    assert fused_calls                          # the "fused" rows ran the fused forward
    assert all(model is drafter for model, _ in fused_calls)
    assert doc["settings"]["k"] == K and doc["settings"]["new_tokens"] == NEW
    assert "environment" in doc
    assert [b["batch"] for b in doc["batches"]] == list(BATCHES)

    fixed_names = (["plain AR"] + [f"chain({n}), model drafter" for n in range(1, K + 1)]
                   + [f"chain({n}), fused drafter" for n in range(1, K + 1)])
    adaptive_names = ["plain AR", "adaptive, model drafter", "adaptive, fused drafter"]
    accepted_somewhere = False
    for b in doc["batches"]:
        assert set(b["drafter_steps"]) == {"model", "fused"}
        for steps in b["drafter_steps"].values():
            assert set(steps) == {"step_ms", "catch_up_ms"}

        fixed = {r["system"]: r for r in b["fixed"]}
        assert [r["system"] for r in b["fixed"]] == fixed_names
        for row in fixed.values():
            assert len(row["call_ms"]) == CALLS and row["call_ms_median"] > 0
            assert isinstance(row["rounds"], int) and row["rounds"] > 0
            assert row["ms_per_round"] > 0
        # plain AR, uncaptured: a step per token after the prefill's, and the one the host
        # queued before it read "done" (as bench/round_cost_truth.py counts it)
        assert fixed["plain AR"]["rounds"] == NEW
        for n in range(1, K + 1):
            mine, theirs = fixed[f"chain({n}), fused drafter"], fixed[f"chain({n}), model drafter"]
            assert mine["rounds"] == theirs["rounds"], n
            assert mine["mean_accepted"] == theirs["mean_accepted"], n
            # a chain commits at least one token a round: never more rounds than plain AR
            assert theirs["rounds"] <= fixed["plain AR"]["rounds"]
            accepted_somewhere |= theirs["rounds"] < fixed["plain AR"]["rounds"]

        adaptive = {r["system"]: r for r in b["adaptive"]}
        assert [r["system"] for r in b["adaptive"]] == adaptive_names
        for name in adaptive_names:
            row = adaptive[name]
            assert len(row["call_ms"]) == CALLS and row["call_ms_median"] > 0
            assert len(row["warm_up_stats"]) == script.WARM_CALLS
        assert "calls_started_off" not in adaptive["plain AR"]
        for name in adaptive_names[1:]:
            assert len(adaptive[name]["calls_started_off"]) == CALLS
            costs = adaptive[name]["round_costs"]
            assert len(costs) == K + 1 and costs[0] == 1.0 and all(c > 0 for c in costs)
        mine, theirs = adaptive["adaptive, fused drafter"], adaptive["adaptive, model drafter"]
        # the same drafts, so the same lengths chosen and the same rounds run in every call
        assert mine["warm_up_stats"] == theirs["warm_up_stats"]
        assert mine["calls_started_off"] == theirs["calls_started_off"]
    # the drafter agreed with the target somewhere, so equal rounds are not a matter of course
    assert accepted_somewhere
