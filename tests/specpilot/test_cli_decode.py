"""`specpilot generate` and `specpilot force` end to end on tiny HF checkpoints, with HF
transformers' greedy output as the independent reference."""
import json

import pytest

from hf_factory import hf_greedy, load_hf, make_checkpoint, make_pair
from specpilot.cli import main
from specpilot.deploy import build_deployment
from specpilot.ir import SetTopology, Tree, apply, save_program, stock_program


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("pair"), "llama3", seed=3)


def _words(ids):
    return " ".join(f"w{i}" for i in ids)


def _run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1])


def test_generate_ar_matches_hf_greedy(pair, capsys):
    target, _ = pair
    prompt = [5, 17, 3, 9, 41]
    code, obj = _run_json(capsys, ["generate", "--target", target, "--prompt", _words(prompt),
                                   "--max-new-tokens", "12", "--dtype", "float32", "--json",
                                   "--device", "cpu"])
    assert code == 0
    assert obj["tokens"] == hf_greedy(load_hf(target), prompt, 12)
    assert obj["mean_accepted"] is None and obj["tokens_per_s"] > 0
    assert obj["text"].split() == [f"w{t}" for t in obj["tokens"]]


def test_generate_speculative_matches_hf_greedy(pair, capsys):
    target, drafter = pair
    prompt = [7, 2, 30, 11]
    code, obj = _run_json(capsys, ["generate", "--target", target, "--drafter", drafter,
                                   "--prompt", _words(prompt), "--max-new-tokens", "16",
                                   "--dtype", "float32", "--json", "--device", "cpu"])
    assert code == 0
    assert obj["tokens"] == hf_greedy(load_hf(target), prompt, 16)
    assert 1.0 <= obj["mean_accepted"] <= 5.0


def test_generate_human_output_reports_rate_and_acceptance(pair, capsys):
    target, drafter = pair
    assert main(["generate", "--target", target, "--drafter", drafter, "--prompt", "w1 w2 w3",
                 "--max-new-tokens", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "mean accepted length" in out and "chain(4)" in out


def test_force_stock_and_tree_programs_pass(pair, tmp_path, capsys):
    target, drafter = pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": _words(p)}) for p in
                                 ([1, 2, 3], [40, 41, 42, 43, 44], [9])) + "\n")
    stock = stock_program(build_deployment(target, drafter, dtype="float32"))
    tree = apply(stock, SetTopology(Tree((2, 2))))
    for prog in (stock, tree):
        path = tmp_path / "p.json"
        save_program(prog, str(path))
        code, obj = _run_json(capsys, ["force", "--target", target, "--drafter", drafter,
                                       "--program", str(path), "--prompts", str(prompts),
                                       "--max-new-tokens", "10", "--json", "--device", "cpu"])
        assert code == 0
        assert obj["passed"] and obj["violations"] == []
        assert obj["positions_compared"] == obj["positions_expected"] == 30


@pytest.mark.parametrize("case", ["missing_prompts", "bad_program", "vocab_mismatch", "too_long",
                                  "missing_target"])
def test_bad_input_is_one_clear_line_and_exit_2(pair, tmp_path, capsys, case):
    target, drafter = pair
    argv = ["force", "--target", target, "--drafter", drafter, "--prompts",
            str(tmp_path / "prompts.txt"), "--device", "cpu"]
    (tmp_path / "prompts.txt").write_text("w1 w2\n")
    needle = None
    if case == "missing_prompts":
        argv[argv.index("--prompts") + 1] = str(tmp_path / "nope.txt")
        needle = "does not exist"
    elif case == "bad_program":
        (tmp_path / "bad.json").write_text('{"schema_version": 1, "draft": ')
        argv += ["--program", str(tmp_path / "bad.json")]
        needle = "bad.json"
    elif case == "vocab_mismatch":
        other = make_checkpoint(tmp_path, "llama3", name="bigvocab", seed=5, vocab_size=300)
        argv[argv.index("--drafter") + 1] = other
        needle = "vocab"
    elif case == "too_long":
        (tmp_path / "prompts.txt").write_text(_words(list(range(1, 90)) * 6) + "\n")
        needle = "context"
    elif case == "missing_target":
        argv[argv.index("--target") + 1] = str(tmp_path / "no-such-model")
        needle = "does not exist"
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
    assert err.strip().count("\n") <= 1  # a progress line at most, then the error


def test_force_runs_a_generated_kernels_program_against_the_torch_reference(pair, tmp_path, capsys):
    """The candidate is built with the Program's own (interpreted) kernels, the reference with
    the stock torch backend; they must agree. (The target drafts for itself here: the tiny
    drafter's head_dim of 8 is below what the attention kernel supports.)"""
    from specpilot.ir import SetBackend
    target, _ = pair
    drafter = target
    (tmp_path / "prompts.txt").write_text("w3 w1 w4\n")
    prog = apply(stock_program(build_deployment(target, drafter, dtype="float32")), SetBackend("generated"))
    save_program(prog, str(tmp_path / "g.json"))
    code, obj = _run_json(capsys, ["force", "--target", target, "--drafter", drafter,
                                   "--program", str(tmp_path / "g.json"), "--prompts",
                                   str(tmp_path / "prompts.txt"), "--max-new-tokens", "4",
                                   "--json", "--device", "cpu"])
    assert code == 0 and obj["passed"] and obj["positions_compared"] == 4


def test_force_exits_1_and_lists_the_violation_when_the_report_fails(pair, tmp_path, capsys,
                                                                     monkeypatch):
    """The CLI's exit status follows the forcing report: a violation means exit 1 and the
    violation printed (the rejection itself is tested in tests/runtime/test_forcing.py)."""
    from specpilot.runtime import decoder
    from specpilot.runtime.forcing import Disagreement, ForcingReport
    target, drafter = pair
    (tmp_path / "prompts.txt").write_text("w1 w2 w3\n")
    bad = ForcingReport(positions_compared=4, positions_expected=4, exact=3, tolerance=1e-5,
                        violations=[Disagreement(0, 2, 17, 23, 3.5)])
    monkeypatch.setattr(decoder, "force_program", lambda *a, **k: bad)
    code = main(["force", "--target", target, "--drafter", drafter, "--prompts",
                 str(tmp_path / "prompts.txt"), "--max-new-tokens", "4", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1
    assert "REJECTED" in out and "reference token 17, got 23" in out
