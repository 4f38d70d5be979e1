"""bench/tree_model_check.py: its calibration fitted on the chain rows recovers the factors the
rounds were made with, each tree row's verdict is its measured time over that prediction (both
recomputed here from `step_nodes` on a Program built by hand), and runs it cannot price are
refused with a message."""
import json
from dataclasses import replace

import pytest

from bench_script import load_bench_script
from specpilot.bench.shapes import preset_deployment
from specpilot.bench.tree_pricing import with_topology
from specpilot.cost.gpu_specs import gpu_spec
from specpilot.cost.roofline import step_nodes, summed_seconds
from specpilot.ir import CaptureGraphs, Chain, Tree, apply
from specpilot.ir.stock import stock_program

SHAPES, CONTEXT = "zoo-gpu-small:zoo-gpu-small-drafter", 100
ALPHA, BETA = 2.5, 3.5


def _seconds(topology, batch):
    """(roofline, overhead) ms of a captured round of `topology`, from a Program built here."""
    program = with_topology(apply(stock_program(preset_deployment(SHAPES, "h200")),
                                  CaptureGraphs(on=True)), topology)
    program = replace(program, batch=replace(program.batch, max_batch_size=batch))
    gpu = gpu_spec("h200")
    return tuple(1e3 * s for s in summed_seconds(step_nodes(program, gpu, batch, CONTEXT, 0.0),
                                                 gpu))


def _doc(rows, gpu="NVIDIA H200", device="cuda", **settings):
    return {"environment": {"gpu": gpu, "device": device},
            "settings": {"shapes": SHAPES, "context": CONTEXT, "scale": 1.0, "pair": None,
                         **settings},
            "rows": [{"batch": b, "topology": str(t), "nodes": t.num_nodes, "depth": t.depth,
                      "variant": variant, "round_ms": ms, "cache_slots": 200 + b + t.num_nodes}
                     for b, t, variant, ms in rows]}


def test_the_chains_fit_recovers_the_factors_and_trees_are_judged_against_it(tmp_path):
    rows = []
    for b in (1, 64):                         # chains made exactly by ALPHA and BETA
        for k in (2, 4):
            roof, over = _seconds(Chain(k), b)
            rows.append((b, Chain(k), "now", ALPHA * roof + BETA * over))
    tree = Tree((3, 2))
    roof, over = _seconds(tree, 4)
    rows += [(4, tree, "now", 1.4 * (ALPHA * roof + BETA * over)),
             (4, tree, "before", 99.0)]       # "before" rows are not the runtime priced
    rounds, out = tmp_path / "rounds.json", tmp_path / "check.json"
    rounds.write_text(json.dumps(_doc(rows)))
    assert load_bench_script("tree_model_check").main(
        ["--rounds", str(rounds), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["alpha"] == pytest.approx(ALPHA, rel=1e-6)
    assert result["beta"] == pytest.approx(BETA, rel=1e-6)
    assert len(result["rows"]) == 5
    (judged,) = [r for r in result["rows"] if not r["chain"]]
    assert judged["measured_over_predicted"] == pytest.approx(1.4, rel=1e-6)
    assert all(r["measured_over_predicted"] == pytest.approx(1.0, rel=1e-6)
               for r in result["rows"] if r["chain"])
    # each row keeps the cache it was measured on
    assert sorted(r["cache_slots"] for r in result["rows"]) == sorted(
        200 + b + t.num_nodes for b, t, variant, _ in rows if variant == "now")
    # the odd counts are named: chain(2) and chain(4) at batch 1 (203, 205 slots) and the
    # tree at batch 4 (213); at batch 64 the chains' are even (266, 268)
    assert result["caveats"] == ["odd slot counts: chain(2) (203), chain(4) (205), "
                                 "tree([3, 2]) (213)"]


def test_rows_without_a_cache_count_are_flagged():
    script = load_bench_script("tree_model_check")
    rows = [{"topology": "chain(4)", "cache_slots": 336}, {"topology": "tree([2])"},
            {"topology": "tree([4])", "cache_slots": None}]
    assert script.cache_caveats(rows) == [
        "no cache slot count for 2 topologies: a run before the count was kept (until commit "
        "257fa8f its caches grew with the span)"]
    assert script.cache_caveats(rows[:1]) == []


@pytest.mark.parametrize("doc, message", [
    (_doc([(1, Chain(4), "now", 2.0)], pair="/tmp/pair"), "trained pair"),
    (_doc([(1, Chain(4), "now", 2.0), (1, Tree((2,)), "now", 2.5)]), "two batch sizes"),
    (_doc([(1, Chain(4), "now", 2.0)], gpu="Acme Z9"), "unknown GPU"),
    (_doc([(1, Chain(4), "now", 2.0)], gpu="cpu", device="cpu"), "not measured on a GPU"),
    # more batch, less time: no positive factors fit
    (_doc([(1, Chain(4), "now", 9.0), (64, Chain(4), "now", 1.0), (16, Chain(2), "now", 3.0)]),
     "cannot cost less"),
])
def test_runs_it_cannot_price_are_refused(tmp_path, capsys, doc, message):
    rounds = tmp_path / "rounds.json"
    rounds.write_text(json.dumps(doc))
    with pytest.raises(SystemExit):
        load_bench_script("tree_model_check").main(
            ["--rounds", str(rounds), "--out", str(tmp_path / "out.json")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
