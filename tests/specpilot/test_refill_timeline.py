"""bench/refill_timeline.py end to end off a GPU (eager, float32, random 1/16-scale models, the
drafter as its model runs it): the replays and admissions it counts are the decoder's own
(one admission per request past the batch; replays by length sum to the replays), its parts
add up to no more than the call, and bad arguments are refused."""
import json
import os

import pytest
import torch

from bench_script import load_bench_script

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the script off a GPU")


def timeline_cells(tmp_path, prompts: int, new_tokens: int, calls: int, *more: str) -> list:
    """The cells of one run of the script on 1/16-scale models at batch 2, chain(2) or
    adaptive lengths up to 2, the drafter as its model runs it."""
    out = tmp_path / "timeline.json"
    assert load_bench_script("refill_timeline").main(
        ["--scale", "0.0625", "--batch-sizes", "2", "--prompts", str(prompts),
         "--max-new-tokens", str(new_tokens), "--k", "2", "--calls", str(calls),
         "--drafter-kernels", "model", *more, "--out", str(out)]) == 0
    return json.loads(out.read_text())["cells"]


def test_a_refill_calls_timeline_counts_its_replays_and_admissions(tmp_path):
    cells = timeline_cells(tmp_path, 5, 6, 2, "--rounds-per-replay", "1,3")
    assert [(c["decoder"], c["rounds_per_replay"]) for c in cells] == [
        ("chain(2)", 1), ("adaptive", 1), ("chain(2)", 3), ("adaptive", 3)]
    assert {c["prefill_placement"] for c in cells} == {"ahead"}     # the default
    # three rounds a replay take fewer replays than one (the decoder got the setting)
    assert cells[2]["calls"][0]["replays"] < cells[0]["calls"][0]["replays"]
    for cell in cells:
        assert len(cell["calls"]) == 2
        for call in cell["calls"]:
            assert call["refills"] == 5 - 2                 # every request past the batch
            assert sum(call["replays_by_length"].values()) == call["replays"] > 0
            # random prompts run to their limit: 6 tokens each
            assert call["new_tokens"] == 5 * 6
            parts = sum(call[k] for k in ("before_ms", "replay_ms", "admit_ms", "after_ms"))
            assert 0 < parts <= call["wall_ms"] * 1.01
            assert call["replay_ms"] > 0 and call["admit_ms"] > 0
            # the host's part of each admission, timed apart; ahead (four held), every
            # newcomer is prefilled before its admission, timed apart too
            assert 0 < call["host_admit_median_ms"] <= call["host_admit_ms"]
            assert call["prefetches"] == 5 - 2 and call["host_prefetch_ms"] > 0
            assert 0 <= call["crowded_gaps"] <= call["refills"] // 2
        assert set(cell["calls"][0]["replays_by_length"]) <= {"0", "1", "2"}


def test_each_prefill_placement_is_a_cell_of_its_own(tmp_path, monkeypatch):
    """--prefill-placements: one cell per placement, each decoder made with it (its row prefill
    says so), and the environment left as it was."""
    script = load_bench_script("refill_timeline")
    made = []
    plain_init = script.GraphedRefillDecoder.__init__

    def recording_init(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        made.append(self._row_prefill.ahead)

    monkeypatch.setattr(script.GraphedRefillDecoder, "__init__", recording_init)
    monkeypatch.delenv("SPECPILOT_REFILL_PREFILL", raising=False)
    cells = timeline_cells(tmp_path, 4, 4, 1, "--decoders", "chain",
                           "--prefill-placements", "beside,ahead")
    assert [c["prefill_placement"] for c in cells] == ["beside", "ahead"]
    assert made == [False, True]
    assert "SPECPILOT_REFILL_PREFILL" not in os.environ
    for cell in cells:
        assert cell["calls"][0]["refills"] == 4 - 2
    # ahead, the queue's next newcomer is prefilled before its row is free, timed on the host
    assert cells[0]["calls"][0]["prefetches"] == 0
    assert cells[1]["calls"][0]["prefetches"] >= 1 and cells[1]["median"]["host_prefetch_ms"] > 0


def test_each_ahead_depth_is_a_cell_of_its_own_where_the_placement_is_ahead(tmp_path):
    """--ahead-depths: one cell per depth with the placement ahead, each decoder holding that
    many newcomers (one prefilled ahead per newcomer, however many are held); beside is one
    cell, holding none."""
    cells = timeline_cells(tmp_path, 6, 4, 1, "--decoders", "chain",
                           "--prefill-placements", "beside,ahead", "--ahead-depths", "1,3")
    assert [(c["prefill_placement"], c["ahead_depth"]) for c in cells] == [
        ("beside", 0), ("ahead", 1), ("ahead", 3)]
    beside, one, three = (c["calls"][0] for c in cells)
    assert beside["prefetches"] == 0
    # every newcomer prefilled ahead once held three deep (two slots: at most two a gap)
    assert three["prefetches"] == 6 - 2 >= one["prefetches"] >= 1


def test_each_round_end_and_estimate_is_a_cell_of_its_own(tmp_path, monkeypatch):
    """--accept-kernels and the adaptive_depth decoder: one cell per round end, each decoder
    made with it (with generated kernels, an adaptive length's update and its newcomers' start
    are kernels too) and the per-depth estimate where asked."""
    script = load_bench_script("refill_timeline")
    made = []
    plain_init = script.GraphedRefillDecoder.__init__

    def recording_init(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        made.append((self._commit_kernels is not None, self.policy.estimator,
                     self.policy._admit_kernel is not None))

    monkeypatch.setattr(script.GraphedRefillDecoder, "__init__", recording_init)
    cells = timeline_cells(tmp_path, 4, 4, 1, "--decoders", "adaptive_depth",
                           "--accept-kernels", "ops,fused")
    assert [(c["decoder"], c["accept_kernels"]) for c in cells] == [
        ("adaptive_depth", "ops"), ("adaptive_depth", "fused")]
    assert made == [(False, "per_depth", False), (True, "per_depth", True)]
    for cell in cells:
        assert cell["calls"][0]["refills"] == 4 - 2
        assert cell["calls"][0]["new_tokens"] == 4 * 4


def test_each_readback_lag_is_a_cell_of_its_own(tmp_path):
    """--readback-lags: one cell per lag, its decoder reading back that far behind; a finished
    row then waits a replay more for its newcomer, so a call runs more rounds (every request
    runs to its limit here, in the same rounds)."""
    cells = timeline_cells(tmp_path, 5, 6, 1, "--decoders", "chain", "--readback-lags", "1,2")
    assert [c["readback_lag"] for c in cells] == [1, 2]
    one, two = (c["calls"][0] for c in cells)
    assert one["new_tokens"] == two["new_tokens"] == 5 * 6
    assert two["replays"] > one["replays"]


def test_each_top_up_is_a_cell_of_its_own(tmp_path):
    """--topups: one cell per top-up, its decoder made with it; the same tokens and admissions,
    and every newcomer still prefilled ahead."""
    cells = timeline_cells(tmp_path, 5, 6, 1, "--decoders", "chain", "--topups", "admitted,queued")
    assert [c["topup"] for c in cells] == ["admitted", "queued"]
    for cell in cells:
        call = cell["calls"][0]
        assert call["new_tokens"] == 5 * 6 and call["refills"] == call["prefetches"] == 5 - 2


@pytest.mark.parametrize("args,message", [
    (["--prefill-placements", "sideways"], "--prefill-placements: takes ahead, beside, after"),
    (["--decoders", "tree"], "--decoders: takes chain, adaptive, adaptive_depth"),
    (["--decoders", ","], "--decoders: takes"),
    (["--accept-kernels", "ops,cuda"], "--accept-kernels: takes ops, fused"),
    (["--calls", "0"], "invalid positive integer value"),
    (["--drafter-kernels", "cuda"], "invalid choice"),
    (["--readback-lags", "1,5"], "readback lag 5"),
    (["--ahead-depths", "17"], "ahead depth 17"),
    (["--topups", "admitted,later"], "--topups: takes admitted, queued"),
])
def test_bad_arguments_are_refused(tmp_path, capsys, args, message):
    script = load_bench_script("refill_timeline")
    with pytest.raises(SystemExit):
        script.main(args + ["--out", os.fspath(tmp_path / "x.json")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
