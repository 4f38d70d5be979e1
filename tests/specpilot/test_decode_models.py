"""specpilot/bench/decode_models.py: with --pair, the pair's own drafter, eos ids and the first
prompts of the workload, encoded by the pair's tokenizer; too few prompts is one clear error;
without, random shapes with a drafter of their own."""
import argparse

import pytest

from hf_factory import make_checkpoint
from specpilot.bench.decode_models import add_model_arguments, decode_models
from specpilot.ir.errors import SpecPilotError

pytestmark = pytest.mark.usefixtures("cpu_only")     # CPU models on any host
LINES = ["w3 w14 w15 w92", "w35 w89 w79", "w1 w2"]


def _args(argv):
    ap = argparse.ArgumentParser()
    add_model_arguments(ap)
    return ap.parse_args(argv)


def test_the_pair_mode_serves_the_pairs_models_and_first_prompts(tmp_path):
    root = tmp_path / "pair"
    make_checkpoint(root, "llama3", name="target", seed=51, hidden_size=64,
                    intermediate_size=128)
    make_checkpoint(root, "llama3", name="drafter", seed=52, hidden_size=32,
                    intermediate_size=64)
    (tmp_path / "p.txt").write_text("\n".join(LINES) + "\n")
    args = _args(["--pair", str(root), "--workload", str(tmp_path / "p.txt")])
    target, drafter, prompts, eos, graphs = decode_models(args, 2)
    assert drafter.config.hidden_size == 32 and target.config.hidden_size == 64
    # the checkpoints' word-level tokenizer maps "wN" to id N (hand-checked), and their config
    # names no end-of-sequence id
    assert prompts == [[3, 14, 15, 92], [35, 89, 79]]
    assert eos == [] and graphs is False
    with pytest.raises(SpecPilotError, match=r"4 prompts \(the largest batch\) asked for.*has only 3"):
        decode_models(args, 4)


def test_random_shapes_give_random_prompts_of_the_asked_length():
    args = _args(["--scale", "0.0625", "--prompt-len", "7"])
    target, drafter, prompts, eos, _ = decode_models(args, 3)
    assert drafter is not None and drafter is not target and eos == []
    assert [len(p) for p in prompts] == [7, 7, 7]
    assert all(0 <= t < target.config.vocab_size for p in prompts for t in p)
