"""bench/round_cost_truth.py off a GPU at a small scale: costs priced four ways; the adaptive
decoder, its eager-update twin, other smoothings and the fixed chains raced against plain AR; and
the state the active timing starts from (the decoder's `reset_all_active`)."""
import json

import pytest
import torch

from bench_script import load_bench_script
from torch_threads import single_thread_fixture
from specpilot.bench.replay import AcceptanceProfile
from specpilot.ir.topology import Chain

one_thread = single_thread_fixture()
pytestmark = pytest.mark.usefixtures("cpu_only")     # off a GPU on any host

PROMPT_LEN, NEW = 6, 20
SMALL = ["--scale", "0.0625", "--prompt-len", str(PROMPT_LEN), "--new-tokens", str(NEW),
         "--k", "3"]


def test_the_script_prices_rounds_four_ways_and_times_each_pricing(tmp_path):
    out = tmp_path / "truth.json"
    script = load_bench_script("round_cost_truth")
    assert script.main(SMALL + ["--batch-sizes", "2", "--calls", "2", "--smoothings", "0.2",
                                "--out", str(out)]) == 0
    (b,) = json.loads(out.read_text())["batches"]
    assert b["batch"] == 2 and b["context"] == PROMPT_LEN + NEW // 2     # the default
    assert set(b["costs"]) == {"true", "captured", "inactive", "active"}
    for costs in b["costs"].values():
        assert len(costs) == 4 and costs[0] == 1.0 and all(c > 0 for c in costs)
    # the true costs are rounds phases per round over plain AR's per step
    ms = b["ms_per_round"]
    assert b["costs"]["true"] == pytest.approx([ms[str(n)] / ms["0"] for n in range(4)])
    # plain AR, uncaptured: a step per token after the prefill's, and the one the host queued
    # before it read "done"
    assert b["rounds"]["0"] == (NEW - 1) + 1
    # uncaptured, the decoder prices rounds by its model 1 + L / 4
    assert b["costs"]["captured"] == pytest.approx([1.0, 1.25, 1.5, 1.75])
    # the fixed chain(3)'s acceptance is saved as a profile the replays read
    profile = AcceptanceProfile.load(str(tmp_path / b["chain_profile"]))
    assert b["chain_profile"] == "truth.b2.chain3.acceptance.json"
    assert profile.topology == Chain(3) and len(profile.accepted_lengths) == 2
    assert profile.new_tokens == [NEW, NEW]
    assert all(0 <= n <= 3 for row in profile.accepted_lengths for n in row)
    # rounds of a padded batch: its longest request's, each committing accepted + 1 tokens
    assert max(len(row) for row in profile.accepted_lengths) <= b["rounds"]["3"]
    # each commits its tokens after the prefill's, overshooting by at most a chain's 3 drafts
    assert all(NEW - 1 <= sum(n + 1 for n in row) <= NEW - 1 + 3
               for row in profile.accepted_lengths)
    rows = {r["system"]: r for r in b["rows"]}
    assert list(rows) == ["plain AR", "adaptive", "adaptive, eager length update",
                          "adaptive, smoothing 0.2", "chain(1)", "chain(2)", "chain(3)"]
    for row in rows.values():
        assert len(row["call_ms"]) == 2
        assert row["x_plain_ar"] == pytest.approx(
            rows["plain AR"]["call_ms_median"] / row["call_ms_median"])
    assert "calls_started_off" not in rows["plain AR"] and "memory" not in rows["plain AR"]
    adaptive = [name for name in rows if name.startswith("adaptive")]
    # off a GPU nothing is captured, so every update runs eagerly; each at its own smoothing
    assert {name: rows[name]["length_update"] for name in adaptive} == {
        "adaptive": {"compiled": False, "smoothing": 0.5},
        "adaptive, eager length update": {"compiled": False, "smoothing": 0.5},
        "adaptive, smoothing 0.2": {"compiled": False, "smoothing": 0.2}}
    assert all(len(rows[name]["calls_started_off"]) == 2 for name in adaptive)
    assert all("calls_started_off" not in rows[f"chain({n})"] for n in (1, 2, 3))
    # a fixed chain's warm-ups ran rounds of its own length only
    for n in (1, 2, 3):
        assert all(set(w) == {f"rounds_chain_{n}"} for w in rows[f"chain({n})"]["warm_up_stats"])
    # plain AR's warm-ups ran NEW plain steps each; an adaptive decoder's first ones speculated,
    # and its memory holds what they showed: requests with counted drafts
    assert rows["plain AR"]["warm_up_stats"] == [{"rounds_chain_0": NEW}] * script.WARM_CALLS
    for name in adaptive:
        row = rows[name]
        assert len(row["warm_up_stats"]) == script.WARM_CALLS
        assert any(k != "rounds_chain_0" for k in row["warm_up_stats"][0])
        counts = row["memory"]["counts"]
        assert counts and all(a + r > 0 for a, r in counts)


def test_the_active_timing_starts_every_row_at_the_context():
    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.bench.shapes import random_pair

    target, drafter, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    dec = GraphedChainDecoder(target, drafter, 3, 64, 2, capture=False, adaptive=True)
    dec.reset_all_active(17)
    assert dec.length.tolist() == [17] * 3 and dec.active.tolist() == [True] * 3
    assert dec.count.tolist() == [1] * 3 and dec.limit.tolist() == [dec.width] * 3
    assert torch.equal(dec.accepted, torch.full_like(dec.accepted, -1))     # a fresh log


def test_an_active_timing_context_that_does_not_fit_is_refused():
    from specpilot.runtime.errors import CapacityError
    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.bench.shapes import random_pair

    target, drafter, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    dec = GraphedChainDecoder(target, drafter, 2, 40, 3, capture=False, adaptive=True)
    for context in (0, 40 - 2 * 4 + 1):
        with pytest.raises(CapacityError, match="timing context"):
            dec.reset_all_active(context)
    dec.reset_all_active(40 - 2 * 4)            # two rounds of 3 drafts just fit


def test_a_context_that_does_not_fit_is_refused_before_any_decoding(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_bench_script("round_cost_truth").main(
            SMALL + ["--batch-sizes", "2", "--context", "1000", "--out", str(tmp_path / "o.json")])
    assert "--context, batch 2: a timing context of 1000 does not fit" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []           # not even a profile


@pytest.mark.parametrize("bad,why", [("0", "in (0, 1]"), ("1.5", "in (0, 1]"),
                                     ("x", "not comma-separated"), ("0.2,0.2", "each once"),
                                     ("0.5", "the rule's own")])
def test_a_bad_smoothing_list_is_refused_with_its_reason(bad, why, tmp_path, capsys):
    script = load_bench_script("round_cost_truth")
    with pytest.raises(SystemExit):
        script.main(SMALL + ["--smoothings", bad, "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert "argument --smoothings" in err and why in err
