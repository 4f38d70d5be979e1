"""The compile, cost and report subcommands end to end, and `ir diff` on round folders."""
import json
import os

import pytest

from specpilot.cli import main
from specpilot.cost import AssumedAcceptance, CostModel, gpu_spec, load_acceptance
from specpilot.deploy import build_deployment
from specpilot.ir import diff, format_diff, load_program, stock_program
from test_search_support import agreeing_pair, one_thread, prompts_file  # noqa: F401


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return agreeing_pair(tmp_path_factory.mktemp("pair"))


def test_cost_without_a_gpu_matches_the_cost_model(pair, capsys):
    assert main(["cost", "--target", pair[0], "--drafter", pair[1], "--gpu", "h200",
                 "--context", "256", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    program = stock_program(build_deployment(*pair, gpu="h200", dtype="bfloat16"))
    expected = CostModel(gpu_spec("h200")).report(program, AssumedAcceptance(0.7), None, 256)
    assert shown["tokens_per_s"] == pytest.approx(expected.tokens_per_s, rel=1e-12)
    assert shown["gpu"]["memory_bandwidth"] == 4.8e12
    assert "assumed" in shown["acceptance"]
    assert main(["cost", "--target", pair[0], "--drafter", pair[1], "--gpu", "a100"]) == 0
    text = capsys.readouterr().out
    assert "A100" in text and "| weight movement" in text and "(dominant)" in text


def test_cost_rejects_an_unknown_gpu(pair, capsys):
    assert main(["cost", "--target", pair[0], "--drafter", pair[1], "--gpu", "voodoo"]) == 2
    assert "unknown GPU 'voodoo'" in capsys.readouterr().err


def test_compile_report_diff_and_cost_of_the_result(pair, tmp_path, capsys):
    out = str(tmp_path / "runs" / "cli")
    argv = ["compile", "--target", pair[0], "--drafter", pair[1], "--gpu", "cpu",
            "--workload", prompts_file(tmp_path), "--prompts", "3", "--max-new-tokens", "12",
            "--rounds", "1", "--candidates", "2", "--repeats", "1",
            "--memory", str(tmp_path / "memory.sqlite"), "--out", out]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "best Program: round 1" in captured.out
    summary = json.load(open(os.path.join(out, "report.json")))
    evaluated = [o for o in json.load(open(os.path.join(out, "round-1", "candidates.json")))
                 if o["forcing"] is not None or o["stage"] == "forcing"]
    assert summary["evaluations"] == len(evaluated)
    assert (f"best reached after {summary['evaluations_to_best']} candidate evaluations, of "
            f"{len(evaluated)}") in captured.out
    assert "[round 1]" in captured.err                   # the progress display
    assert os.path.exists(os.path.join(out, "report.md"))
    assert main(["report", out]) == 0
    assert capsys.readouterr().out.strip() == os.path.join(out, "report.md")
    assert main(["ir", "diff", os.path.join(out, "round-0"), os.path.join(out, "round-1")]) == 0
    expected = format_diff(diff(load_program(os.path.join(out, "round-0")),
                                load_program(os.path.join(out, "round-1"))))
    assert capsys.readouterr().out.strip() == expected
    # the cost model reads the compiled Program and the measured rank profile back
    assert main(["cost", "--program", out, "--gpu", "h100", "--acceptance",
                 os.path.join(out, "acceptance.json"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    best = load_program(out)
    # (on this CPU the search may well find that greedy AR, without the drafter, is fastest)
    assert shown["topology"] == best.draft.describe()
    profile = load_acceptance(os.path.join(out, "acceptance.json"))
    assert shown["mean_accepted"] == pytest.approx(
        profile.mean_accepted(best.draft.topology) if best.draft.speculates else 0.0)


def test_compile_needs_both_checkpoints_or_neither(pair, tmp_path, capsys):
    assert main(["compile", "--target", pair[0], "--out", str(tmp_path / "x")]) == 2
    assert "--target and --drafter" in capsys.readouterr().err


@pytest.mark.slow
def test_compile_default_trains_the_zoo_pair_and_compiles_it(tmp_path, capsys):
    out = str(tmp_path / "runs" / "default")
    assert main(["compile", "--preset", "micro", "--prompts", "2", "--max-new-tokens", "16",
                 "--rounds", "1", "--candidates", "2", "--repeats", "1",
                 "--memory", str(tmp_path / "memory.sqlite"), "--out", out]) == 0
    record = json.load(open(os.path.join(out, "round-0", "report.json")))
    assert record["forcing"]["passed"]
    assert load_program(os.path.join(out, "best")).models.target.checkpoint.endswith("target")
