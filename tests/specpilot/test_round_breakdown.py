"""bench/round_breakdown.py: its pieces composed are the round they time (the state after
draft, verify and commit equals the state after the decoder's own round, for fixed, adaptive
and refill decoders), and the script runs end to end at a tiny size (uncaptured, float32,
Triton's interpreter for the fused drafter), writing a row per batch size."""
import json

import pytest
import torch

from bench_script import count_fused_forwards, fill_all_active, load_bench_script
from hf_factory import fusable_pair, random_prompts
from torch_threads import single_thread_fixture
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

one_thread = single_thread_fixture()

K, CONTEXT, CAPACITY, BATCH = 2, 6, 40, 2
STATE = ("length", "last", "prev", "count", "active", "out", "accepted", "status",
         "round_index")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return fusable_pair(tmp_path_factory.mktemp("breakdown"), seed=8, noise_seed=12)


def _filled(cls, target, drafter, **options):
    """A decoder whose caches hold a random context and whose rows are all active after it."""
    return fill_all_active(cls(target, drafter, BATCH, CAPACITY, K, capture=False, **options),
                           target, drafter, CONTEXT, seed=5)


@pytest.mark.parametrize("cls, options", [(GraphedChainDecoder, {}),
                                          (GraphedChainDecoder, {"adaptive": True,
                                                                 "round_costs": [1.0, 1.2, 1.4]}),
                                          (GraphedRefillDecoder, {})],
                         ids=["fixed", "adaptive", "refill"])
def test_the_pieces_composed_are_the_round(models, cls, options):
    target, drafter = models
    script = load_bench_script("round_breakdown")
    whole = _filled(cls, target, drafter, **options)
    cut = _filled(cls, target, drafter, **options)
    for _ in range(3):
        whole._round(K)
        pieces = script.round_pieces(cut, K)
        drafts = pieces["draft"]()
        pieces["commit"](drafts, pieces["verify"](drafts))
    for name in STATE + (("row_round",) if cls is GraphedRefillDecoder else ()):
        assert torch.equal(getattr(whole, name), getattr(cut, name)), name
    for a, b in ((whole.tcache, cut.tcache), (whole.dcache, cut.dcache)):
        assert all(torch.equal(x, y) for x, y in zip(a.k + a.v, b.k + b.v))
    # the rounds moved on, a token a round at least: not three rounds of nothing
    assert (whole.count >= 4).all()


def test_the_script_times_every_piece_and_admission(models, tmp_path, monkeypatch):
    target, drafter = models
    script = load_bench_script("round_breakdown")

    def tiny_models(args, count):
        return target, drafter, random_prompts([args.prompt_len] * count, seed=3), [], False

    monkeypatch.setattr(script, "decode_models", tiny_models)
    fused_calls = count_fused_forwards(monkeypatch, script)
    monkeypatch.setattr(script, "REPEATS", 1)      # off a GPU: a smaller cache, fewer rounds
    out = tmp_path / "b.json"
    assert script.main(["--prompt-len", "4", "--new-tokens", "4", "--k", str(K),
                        "--batch-sizes", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    ran = {id(model) for model, _ in fused_calls}
    assert id(drafter) in ran                   # the pieces ran the fused drafter
    assert id(target) in ran                    # and the fused target's rows the fused target
    assert [b["batch"] for b in doc["batches"]] == [2]     # (one batch: the interpreter is slow)
    for b in doc["batches"]:
        ms = b["graph_ms"]
        assert set(ms) == {"plain_round", "round_model_drafter", "round", "draft", "draft_verify",
                           "verify", "commit", "round_adaptive", "round_refill",
                           "plain_round_fused_target", "round_fused_target"}
        assert set(b["forward_ms"]) == {"target", "target_fused", "drafter_model", "drafter_fused"}
        assert set(b["forward_ms"]["target"]) == {"1", str(K + 1)}
        assert set(b["kernels"]) == {"draft", "verify", "commit", "commit_adaptive",
                                     "commit_refill"}
        assert b["admission"]["prompt_tokens"] == 4
        assert {"round_ms", "round_and_admission_ms", "added_ms"} <= set(b["admission"])
        # a newcomer prefilled at its admission and ahead of it: both timed
        assert {"round_and_admission_ahead_ms", "added_ahead_ms"} <= set(b["admission"])


def test_the_target_can_run_on_compiled_layers_with_the_generated_attention(models, tmp_path,
                                                                         monkeypatch):
    """--target-kernels layers-attention times every piece with a copy of the target (weights
    shared) on compiled layers calling the generated attention; as loaded by default."""
    from specpilot.runtime.model import compiles_layers

    target, drafter = models
    script = load_bench_script("round_breakdown")
    monkeypatch.setattr(script, "decode_models",
                        lambda args, count: (target, drafter, [[1, 2, 3]] * count, [], False))
    seen = []

    def one_batch(args, timed_target, *rest):
        seen.append(timed_target)
        return {"batch": 1}
    monkeypatch.setattr(script, "one_batch", one_batch)
    monkeypatch.setattr(script, "report", lambda row: "")
    for kernels in ("as-loaded", "layers-attention"):
        assert script.main(["--batch-sizes", "1", "--target-kernels", kernels,
                            "--out", str(tmp_path / f"{kernels}.json")]) == 0
    loaded, layers = seen
    assert loaded is target and layers is not target
    assert compiles_layers(layers.backend) and layers.backend.attention_kernels == "generated"
    assert layers.lm_head[0] is target.lm_head[0]
    assert json.loads((tmp_path / "layers-attention.json").read_text())["settings"][
        "target_kernels"] == "layers-attention"
    with pytest.raises(SystemExit):
        script.main(["--target-kernels", "fused", "--out", str(tmp_path / "x.json")])
