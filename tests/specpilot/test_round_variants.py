"""bench/round_variants.py: the decoders it races run one and the same chain round (from the
same filled state, every variant leaves the same tokens, counts and caches), the refill loop's
replay also leaves the row flags in pinned host memory as the host loop reads them, and the
script runs end to end at a tiny size (uncaptured, float32, Triton's interpreter)."""
import json

import pytest
import torch

from bench_script import fill_all_active, load_bench_script
from hf_factory import fusable_pair
from torch_threads import single_thread_fixture
from specpilot.runtime.fused_forward import FusedForward

one_thread = single_thread_fixture()

K, CONTEXT, CAPACITY, BATCH = 2, 6, 40, 2
STATE = ("length", "last", "prev", "count", "active", "out")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return fusable_pair(tmp_path_factory.mktemp("variants"), seed=8, noise_seed=12)


def test_every_variant_runs_the_same_round(models):
    target, drafter = models
    script = load_bench_script("round_variants")
    drafters = {fold: FusedForward(drafter, fold=fold) for fold in (False, True)}
    decoders = {name: fill_all_active(script.build(name, target, drafters, BATCH, CAPACITY, K,
                                                   False), target, drafter, CONTEXT, seed=5)
                for name in ("chain", "adaptive", "refill", "refill_ahead", "chain_fused",
                             "adaptive_fused", "adaptive_fused_compiled", "adaptive_depth_fused",
                             "adaptive_depth_fused_compiled", "refill_fused",
                             "chain_fused_folded", "refill_fused_folded")}
    assert decoders["refill_fused_folded"].drafter is drafters[True]
    # The length's update: a kernel with the fused end unless the variant keeps it compiled.
    assert decoders["adaptive_fused"].policy._update_kernel is not None
    assert decoders["adaptive_fused_compiled"].policy._update_kernel is None
    assert decoders["adaptive_depth_fused"].policy.estimator == "per_depth"
    assert decoders["refill_fused"].drafter is drafters[False]
    loop = script.loop_replay(decoders["refill"], lambda: decoders["refill"]._round(K))
    for _ in range(3):
        for name, dec in decoders.items():
            if name == "refill":
                loop()
            else:
                dec._round(K)
    base = decoders["chain"]
    for name, dec in decoders.items():
        for field in STATE:
            assert torch.equal(getattr(dec, field), getattr(base, field)), (name, field)
        assert all(torch.equal(x, y) for x, y in zip(dec.tcache.k + dec.tcache.v,
                                                     base.tcache.k + base.tcache.v)), name
    assert (base.count >= 4).all()          # three rounds moved every row on
    refill = decoders["refill"]
    assert torch.equal(refill.host_active[0], refill.active)


def _script_on(models, monkeypatch):
    """bench/round_variants.py with these models in place of the ones it would build."""
    target, drafter = models
    script = load_bench_script("round_variants")
    monkeypatch.setattr(script, "decode_models",
                        lambda args, count: (target, drafter, [], [], False))
    return script


def _run(script, out, blocks, *extra):
    assert script.main(["--prompt-len", "4", "--new-tokens", "4", "--k", str(K),
                        "--batch-sizes", "2", "--blocks", str(blocks), "--replays", "1",
                        *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_variants_and_the_drafters_split_walks_can_be_picked(models, tmp_path, monkeypatch):
    script = _script_on(models, monkeypatch)
    seen, fused = [], script.FusedForward

    def recording(model, specs=None, fold=None):   # the fused drafters the script builds
        seen.append(specs)
        return fused(model, specs=specs, fold=fold)

    monkeypatch.setattr(script, "FusedForward", recording)
    doc = _run(script, tmp_path / "v.json", 1,
               "--variants", "refill_fused,refill", "--attention-splits", "2")
    (row,) = doc["batches"]
    assert list(row["round_ms"]) == ["refill", "refill_fused"]
    assert [specs["attention"].get("SPLITS") for specs in seen] == [2, 2]
    assert [specs["attention"].get("FOLD_O") for specs in seen] == [False, True]


def test_the_script_times_every_variant(models, tmp_path, monkeypatch):
    script = _script_on(models, monkeypatch)
    doc = _run(script, tmp_path / "v.json", 2)
    (row,) = doc["batches"]
    assert row["batch"] == 2 and row["k"] == K
    assert set(row["round_ms"]) == set(script.VARIANTS)
    assert all(len(v) == 2 and all(ms > 0 for ms in v) for v in row["blocks_ms"].values())
    assert set(row["kernels"]) == set(script.VARIANTS) - {"refill_loop"}
    with pytest.raises(SystemExit):
        script.main(["--blocks", "0", "--out", str(tmp_path / "x.json")])
    for bad in ("refill_loop", "refill,bogus", ","):
        with pytest.raises(SystemExit):
            script.main(["--variants", bad, "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        script.main(["--pair", str(tmp_path), "--out", str(tmp_path / "x.json")])
