"""`specpilot ir stock|show|diff` through specpilot.cli.main: output, files and exit codes."""
import json

import pytest

from specpilot.cli import main
from specpilot.deploy import build_deployment
from specpilot.ir import (SetDrafter, SetDraftLengthPolicy, SetLengthDrain, SetLengthEstimator,
                          SetMaxBatchSize, SetRefill, SetTopology, Tree, apply, diff, format_diff,
                          load_program, program_id, program_to_json, replay, save_program,
                          stock_program)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny HF Llama checkpoints (weights included) sharing a vocabulary of 96."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, layers in (("target", 2), ("drafter", 1), ("other", 1)):
        cfg = LlamaConfig(vocab_size=96 if name != "other" else 80, hidden_size=16,
                          intermediate_size=24, num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2)
        LlamaForCausalLM(cfg).save_pretrained(root / name)
        out[name] = str(root / name)
    return out


def test_stock_writes_the_stock_program(checkpoints, tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["ir", "stock", "--target", checkpoints["target"], "--drafter",
                 checkpoints["drafter"], "--gpu", "NVIDIA H200", "--out", str(out)])
    assert code == 0
    expected = stock_program(build_deployment(checkpoints["target"], checkpoints["drafter"],
                                              gpu="NVIDIA H200"))
    assert out.read_text(encoding="utf-8") == program_to_json(expected)
    assert capsys.readouterr().out.strip() == f"wrote {out} (program {program_id(expected)})"


def test_stock_float32_into_a_folder(checkpoints, tmp_path):
    code = main(["ir", "stock", "--target", checkpoints["target"], "--drafter",
                 checkpoints["drafter"], "--dtype", "float32", "--out", str(tmp_path)])
    assert code == 0
    p = load_program(tmp_path / "program.json")
    assert p.gpu == "cpu" and p.models.target.dtype == "float32"
    assert set(p.models.target.formats().values()) == {"fp32"}


def test_stock_vocabulary_mismatch_is_exit_2(checkpoints, tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["ir", "stock", "--target", checkpoints["target"], "--drafter",
                 checkpoints["other"], "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "96" in err and "80" in err and "Traceback" not in err
    assert not out.exists()


def test_stock_missing_checkpoint_is_exit_2(tmp_path, capsys, checkpoints):
    code = main(["ir", "stock", "--target", str(tmp_path / "nope"), "--drafter",
                 checkpoints["drafter"], "--out", str(tmp_path / "p.json")])
    assert code == 2 and "does not exist" in capsys.readouterr().err


@pytest.fixture
def two_programs(checkpoints, tmp_path):
    stock = stock_program(build_deployment(checkpoints["target"], checkpoints["drafter"]))
    tree = apply(stock, SetTopology(Tree((4, 2, 2, 1))))
    save_program(stock, tmp_path / "a.json")
    (tmp_path / "round1").mkdir()
    save_program(tree, tmp_path / "round1" / "program.json")
    return stock, tree, tmp_path / "a.json", tmp_path / "round1"


def test_show(two_programs, capsys):
    stock, tree, a, folder = two_programs
    assert main(["ir", "show", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"program {program_id(tree)}"
    text = "\n".join(lines)
    for fragment in ("llama, bfloat16, 2 layers, hidden 16, mlp 24, heads 4/2 kv x 4, vocab 96",
                     "weights 15 bf16", "model drafter, tree([4, 2, 2, 1])",
                     "tree mask, greedy acceptance", "kv compact",
                     "backend torch (fast path ops), graph capture off",
                     "1. SetTopology(topology=tree([4, 2, 2, 1]))"):
        assert fragment in text, fragment
    assert main(["ir", "show", str(a)]) == 0
    assert "(stock)" in capsys.readouterr().out


def test_show_names_the_refill(two_programs, tmp_path, capsys):
    # Greedy AR drains its batches or refills their slots: two decoders, both shown.
    stock = two_programs[0]
    drained = replay(stock, [SetMaxBatchSize(4), SetDrafter("none")])
    refilled = apply(drained, SetRefill("continuous"))
    for program, refill in ((drained, "drain"), (refilled, "continuous")):
        save_program(program, tmp_path / "p.json")
        assert main(["ir", "show", str(tmp_path / "p.json")]) == 0
        text = capsys.readouterr().out
        assert f"padded, max batch size 4, draft length fixed, {refill} refill" in text, text
        assert "no speculation (greedy AR)" in text


def test_show_names_a_length_estimator_other_than_the_default(two_programs, tmp_path, capsys):
    stock = two_programs[0]
    adaptive = replay(stock, [SetMaxBatchSize(4), SetDraftLengthPolicy("per_request_adaptive", 20)])
    for program, said in ((adaptive, "draft length per_request_adaptive, drain refill"),
                          (apply(adaptive, SetLengthEstimator("per_depth")),
                           "draft length per_request_adaptive (per_depth estimator), drain"),
                          (replay(adaptive, [SetRefill("continuous"),
                                             SetLengthDrain("throughput")]),
                           "draft length per_request_adaptive (throughput drain), continuous")):
        save_program(program, tmp_path / "p.json")
        assert main(["ir", "show", str(tmp_path / "p.json")]) == 0
        assert said in capsys.readouterr().out


def test_diff(two_programs, capsys):
    stock, tree, a, folder = two_programs
    assert main(["ir", "diff", str(a), str(folder)]) == 0
    out = capsys.readouterr().out
    assert out == format_diff(diff(stock, tree)) + "\n"
    assert out.splitlines()[0] == "draft.topology: chain(4) → tree([4, 2, 2, 1])"
    assert main(["ir", "diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out == "no differences\n"


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"gpu": "cpu"}), "missing field"),
])
def test_malformed_program_file_is_exit_2(tmp_path, capsys, content, message, two_programs):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for argv in (["ir", "show", str(bad)], ["ir", "diff", str(bad), str(two_programs[2])]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "bad.json" in err and message in err and "Traceback" not in err


def test_missing_program_file_is_exit_2(tmp_path, capsys):
    assert main(["ir", "show", str(tmp_path / "gone.json")]) == 2
    assert "gone.json" in capsys.readouterr().err


@pytest.mark.parametrize("argv,fragments", [
    (["ir", "--help"], ["stock", "show", "diff"]),
    (["ir", "stock", "--help"], ["--target", "--drafter", "--gpu", "--dtype", "--out"]),
    (["ir", "show", "--help"], ["FILE", "program.json"]),
    (["ir", "diff", "--help"], ["A", "B", "Exits 0 either way"]),
])
def test_help(argv, fragments, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    for fragment in fragments:
        assert fragment in out


def test_show_names_the_kernel_choices_other_than_the_defaults(two_programs, tmp_path, capsys):
    from specpilot.ir import SetAcceptKernels, SetDrafterKernels

    stock = two_programs[0]
    save_program(stock, tmp_path / "p.json")
    assert main(["ir", "show", str(tmp_path / "p.json")]) == 0
    plain = capsys.readouterr().out
    assert "accept kernels" not in plain and "drafter kernels" not in plain
    fused = replay(stock, [SetDrafterKernels("fused"), SetAcceptKernels("fused")])
    save_program(fused, tmp_path / "p.json")
    assert main(["ir", "show", str(tmp_path / "p.json")]) == 0
    assert ("backend torch (fast path ops), fused drafter kernels, fused accept kernels, graph "
            "capture off") in capsys.readouterr().out
