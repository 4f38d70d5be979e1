"""The run report of a real (tiny) compile: its table matches the rounds' measurements, its
plots are PNG files matplotlib reads back, its forcing summary counts every candidate."""
import json
import os

import pytest

from specpilot.report import RunReportError, build_run_report, load_rounds
from specpilot.search.compile import compile_deployment
from test_search_support import agreeing_pair, one_thread, small_settings  # noqa: F401


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    settings = small_settings(tmp, *agreeing_pair(tmp), rounds=2)
    compile_deployment(settings, progress=lambda _: None)
    return settings.out_dir


def test_report_table_matches_the_rounds(run_dir):
    path = build_run_report(run_dir)
    text = open(path, encoding="utf-8").read()
    rounds = load_rounds(__import__("pathlib").Path(run_dir))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    stock = rounds[0]["timing"]["median_tokens_per_s"]
    ar = rounds[0]["ar_timing"]["median_tokens_per_s"]
    compounded = 1.0
    for r in rounds:
        tps = r["timing"]["median_tokens_per_s"]
        row = next(line for line in text.splitlines() if line.startswith(f"| {r['round']} |"))
        assert f"| {tps:,.1f} |" in row
        assert f"| {tps / stock:.2f}x |" in row and f"| {tps / ar:.2f}x |" in row
        compounded *= 1 + (r.get("gain") or 0.0)
        assert f"| {compounded:.2f}x |" in row
    counts = {}
    for r in rounds:
        for o in json.load(open(os.path.join(run_dir, f"round-{r['round']}", "candidates.json"))):
            counts[o["stage"]] = counts.get(o["stage"], 0) + 1
    for stage, n in counts.items():
        assert f"| {stage} | {n} |" in text
    # the best Program's changes against the stock Program, as `specpilot ir diff` shows them
    from specpilot.ir import diff, format_diff, load_program
    best = load_program(run_dir)
    stock_program = load_program(os.path.join(run_dir, "round-0"))
    assert f"```\n{format_diff(diff(stock_program, best))}\n```" in text


def test_report_plots_are_readable_pngs(run_dir):
    import matplotlib.image

    build_run_report(run_dir)
    for name in ("tokens_per_round.png", "cost_breakdown.png"):
        path = os.path.join(run_dir, name)
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100


def test_round_reports_hold_diff_cost_and_candidates(run_dir):
    text = open(os.path.join(run_dir, "round-1", "report.md"), encoding="utf-8").read()
    record = json.load(open(os.path.join(run_dir, "round-1", "report.json")))
    assert "## IR diff" in text and "## Cost model" in text
    assert f"Chosen: **{record['chosen']}**" in text
    for o in record["outcomes"]:
        assert o["label"].replace("|", "\\|") in text
    zero = open(os.path.join(run_dir, "round-0", "report.md"), encoding="utf-8").read()
    assert "Token forcing of the stock Program: passed" in zero


def test_report_of_a_folder_without_rounds(tmp_path):
    with pytest.raises(RunReportError, match="specpilot compile"):
        build_run_report(tmp_path)
