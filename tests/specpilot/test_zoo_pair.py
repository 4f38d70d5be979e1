"""A real micro pair end to end: train, cache, HF loading, quality, determinism, CLI."""
import json

import pytest
import torch

from specpilot.cli import main as cli_main
from specpilot.zoo.cache import ensure_pair, pair_key
from specpilot.zoo.corpus import load_corpus
from specpilot.zoo.evaluate import heldout_windows
from specpilot.zoo.pair import train_pair
from specpilot.zoo.presets import PRESETS, ZooError
from specpilot.zoo.save_hf import load_train_model

MICRO = PRESETS["micro"]


@pytest.fixture(scope="module")
def micro_pair(tmp_path_factory):
    cache = tmp_path_factory.mktemp("zoo-cache")
    lines = []
    target_dir, drafter_dir = ensure_pair("micro", seed=0, cache_dir=cache, progress=lines.append)
    return {"cache": cache, "target": target_dir, "drafter": drafter_dir, "lines": lines,
            "report": json.loads((target_dir.parent / "train_report.json").read_text())}


def test_training_reports_progress_and_writes_a_full_pair(micro_pair):
    steps = [line for line in micro_pair["lines"] if " step " in line]
    assert any(line.startswith("[target] step") and "tok/s" in line for line in steps)
    assert any(line.startswith("[drafter] step") for line in steps)
    assert micro_pair["target"].parent.name == pair_key(MICRO, 0)
    for folder in (micro_pair["target"], micro_pair["drafter"]):
        names = {p.name for p in folder.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json"} <= names
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["torch_dtype"] == "float32" and cfg["bos_token_id"] == cfg["eos_token_id"] == 0
    assert (micro_pair["target"] / "tokenizer.json").read_bytes() == \
        (micro_pair["drafter"] / "tokenizer.json").read_bytes()
    no_leftovers = [p.name for p in micro_pair["cache"].rglob(".*tmp-*")]
    assert no_leftovers == []


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_hf_transformers_loads_each_checkpoint_with_our_logits(micro_pair, role):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = micro_pair[role]
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    ours = load_train_model(folder)
    ids = torch.randint(1, MICRO.vocab_size, (3, 41))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)
    tok = AutoTokenizer.from_pretrained(folder)
    snippet = "import os\n\nclass Path:\n    def __init__(self, p):\n        self.p = p  # λ\n"
    assert tok.decode(tok(snippet)["input_ids"], skip_special_tokens=True) == snippet


def test_heldout_report_is_reproduced_by_hf_and_beats_baselines(micro_pair):
    """Recompute the held-out numbers with HF models; the target must beat a unigram model
    clearly, the drafter must trail the target, and agreement must beat always guessing the
    target's most frequent argmax."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = micro_pair["report"]["heldout"]
    tok = AutoTokenizer.from_pretrained(micro_pair["target"])
    corpus = load_corpus(MICRO.corpus_bytes, MICRO.holdout_files)
    stream = []
    for f in corpus.heldout:
        stream.extend(tok(f.text)["input_ids"])  # BOS first, as in training
    windows = heldout_windows(torch.tensor(stream), MICRO.seq_len, MICRO.eval_tokens)
    inputs, labels = windows[:, :-1], windows[:, 1:].flatten()
    with torch.no_grad():
        t_logits = AutoModelForCausalLM.from_pretrained(micro_pair["target"])(inputs).logits.flatten(0, 1)
        d_logits = AutoModelForCausalLM.from_pretrained(micro_pair["drafter"])(inputs).logits.flatten(0, 1)
    t_loss = float(torch.nn.functional.cross_entropy(t_logits, labels))
    d_loss = float(torch.nn.functional.cross_entropy(d_logits, labels))
    t_top, d_top = t_logits.argmax(-1), d_logits.argmax(-1)
    agreement = float((t_top == d_top).float().mean())
    constant_guess = float(torch.bincount(t_top).max()) / t_top.numel()

    assert report["positions"] == labels.numel()
    assert t_loss == pytest.approx(report["target_loss"], abs=1e-3)
    assert d_loss == pytest.approx(report["drafter_loss"], abs=1e-3)
    assert agreement == pytest.approx(report["agreement"], abs=2e-3)
    assert t_loss < report["unigram_loss"] - 0.5
    assert t_loss < d_loss
    assert agreement > constant_guess + 0.15


def test_second_ensure_pair_reuses_the_cache(micro_pair):
    weights = micro_pair["target"] / "model.safetensors"
    before = weights.stat().st_mtime_ns
    lines = []
    again = ensure_pair("micro", seed=0, cache_dir=micro_pair["cache"], progress=lines.append)
    assert again == (micro_pair["target"], micro_pair["drafter"])
    assert not [line for line in lines if " step " in line]
    assert any("reusing" in line for line in lines)
    assert weights.stat().st_mtime_ns == before


def test_same_seed_gives_bit_identical_weights(micro_pair, tmp_path):
    train_pair(MICRO, 0, tmp_path, progress=lambda line: None)
    for role in ("target", "drafter"):
        assert (tmp_path / role / "model.safetensors").read_bytes() == \
            (micro_pair[role] / "model.safetensors").read_bytes()


def test_interrupted_training_leaves_no_cache_entry(tmp_path):
    def stop_at_first_step(line):
        if " step " in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_pair("micro", seed=3, cache_dir=tmp_path, progress=stop_at_first_step)
    assert list(tmp_path.iterdir()) == []


def test_cli_trains_into_out_and_refuses_foreign_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "pair"
    assert cli_main(["zoo", "train", "--preset", "micro", "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[target] step" in printed and "agreement" in printed
    assert sorted(p.name for p in out.iterdir()) == ["drafter", "target", "train_report.json"]
    cached = tmp_path / "cache" / "zoo" / pair_key(MICRO, 1)
    assert (out / "target" / "model.safetensors").read_bytes() == \
        (cached / "target" / "model.safetensors").read_bytes()
    assert json.loads((out / "train_report.json").read_text())["seed"] == 1

    # Same command again: the pair is already there, nothing is retrained.
    assert cli_main(["zoo", "train", "--preset", "micro", "--seed", "1", "--out", str(out)]) == 0
    assert "[target] step" not in capsys.readouterr().out

    # --force retrains and replaces the pair in --out (same seed, so the same bytes).
    before = (out / "drafter" / "model.safetensors").read_bytes()
    args = ["zoo", "train", "--preset", "micro", "--seed", "1", "--out", str(out), "--force"]
    assert cli_main(args) == 0
    assert "[drafter] step" in capsys.readouterr().out
    assert (out / "drafter" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["cache", "pair"]  # no temporaries left

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert cli_main(["zoo", "train", "--preset", "micro", "--seed", "1", "--out", str(foreign)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_cuda_preset_without_gpu_is_a_clear_error(tmp_path, monkeypatch):
    import dataclasses

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ZooError, match="CUDA"):
        train_pair(dataclasses.replace(MICRO, device="cuda"), 0, tmp_path, progress=lambda line: None)


def _reference_chain(target, drafter, prompt, k, max_new_tokens, eos):
    """Greedy chain speculation by full recomputation with the training module: (tokens, accepted
    length + 1 per step), and greedy AR tokens the same way."""
    def argmax_after(model, seq):
        with torch.no_grad():
            return model(torch.tensor([seq])).argmax(-1)[0].tolist()

    seq, out, steps = list(prompt), [], []
    out.append(argmax_after(target, seq)[-1])
    seq.append(out[-1])
    while len(out) < max_new_tokens and out[-1] not in eos:
        drafts = []
        for _ in range(k):
            drafts.append(argmax_after(drafter, seq + drafts)[-1])
        verdict = argmax_after(target, seq + drafts)[len(seq) - 1:]
        accepted = 0
        while accepted < k and drafts[accepted] == verdict[accepted]:
            accepted += 1
        steps.append(accepted + 1)
        for tok in drafts[:accepted] + [verdict[accepted]]:
            out.append(tok)
            seq.append(tok)
            if tok in eos or len(out) >= max_new_tokens:
                break
    ar = list(prompt)
    while len(ar) - len(prompt) < max_new_tokens and (len(ar) == len(prompt) or ar[-1] not in eos):
        ar.append(argmax_after(target, ar)[-1])
    return out, steps, ar[len(prompt):]


def _check_against_reference(result, target_dir, drafter_dir, prompts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    target, drafter = load_train_model(target_dir), load_train_model(drafter_dir)
    ids = [tok.encode(p).ids for p in prompts]
    assert result["prompts"] == len(ids) and result["prompt_tokens"] == sum(map(len, ids))
    for k, got in result["chain"].items():
        runs = [_reference_chain(target, drafter, p, int(k), result["max_new_tokens"], {0}) for p in ids]
        for out, _, ar in runs:
            assert out == ar  # greedy speculation is lossless
        steps = [s for _, st, _ in runs for s in st]
        new_tokens = sum(len(out) for out, _, _ in runs)
        assert got["mean_accepted"] == pytest.approx(sum(steps) / len(steps), abs=1e-12)
        assert got["new_tokens"] == new_tokens
        assert got["target_forwards"] == 1 + max(len(st) for _, st, _ in runs)
        request_forwards = sum(1 + len(st) for _, st, _ in runs)  # prefill + one per step
        assert got["tokens_per_target_forward"] == pytest.approx(new_tokens / request_forwards)
        assert 1.0 <= got["mean_accepted"] <= int(k) + 1


def test_report_gives_chain_acceptance_on_humaneval_prompts(micro_pair):
    from specpilot.prompts import humaneval_prompts

    spec = micro_pair["report"]["speculation"]
    assert sorted(spec["chain"], key=int) == [str(k) for k in MICRO.spec_eval_draft_lengths] == ["4", "8"]
    assert spec["max_new_tokens"] == MICRO.spec_eval_new_tokens and spec["dtype"] == "float32"
    _check_against_reference(spec, micro_pair["target"], micro_pair["drafter"],
                             humaneval_prompts(MICRO.spec_eval_prompts))
    assert "speculation_eval" in micro_pair["report"]["seconds"]
    assert any("greedy chain k=8: mean accepted" in line for line in micro_pair["lines"])


def test_chain_acceptance_of_a_partly_agreeing_pair(micro_pair, tmp_path):
    """The trained micro pair agrees everywhere on these prompts (both emit blank lines), so
    this pair is built to agree only sometimes: a random target with sharp logits and, as the
    drafter, that target with noise added. The measured figures must equal the reference count."""
    import copy

    from tokenizers import Tokenizer

    from specpilot.prompts import humaneval_prompts
    from specpilot.zoo.llama_train_model import TrainLlama
    from specpilot.zoo.save_hf import save_checkpoint
    from specpilot.zoo.speculation_eval import chain_acceptance

    tok = Tokenizer.from_file(str(micro_pair["target"] / "tokenizer.json"))
    target = TrainLlama(MICRO.target, tok.get_vocab_size())
    target.init_weights(torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()))))
    drafter = copy.deepcopy(target)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if "norm" not in name:
                p.mul_(6.0)  # far from uniform attention and logits: no near-ties
        for p, q in zip(drafter.parameters(), target.parameters()):
            p.copy_(q + torch.randn_like(q) * q.std() * 0.07)
    save_checkpoint(target, tok, tmp_path / "target")
    save_checkpoint(drafter, tok, tmp_path / "drafter")
    prompts = humaneval_prompts(3)
    result = chain_acceptance(tmp_path / "target", tmp_path / "drafter", prompts, (2, 5), 24,
                              "float32", "cpu")
    _check_against_reference(result, tmp_path / "target", tmp_path / "drafter", prompts)
    assert all(1.0 < r["mean_accepted"] < int(k) + 1 for k, r in result["chain"].items())
