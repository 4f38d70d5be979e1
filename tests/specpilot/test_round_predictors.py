"""bench/round_predictors.py: Spearman's correlation on hand-worked ranks (ties included), the
teacher-forced prompt logits against HF transformers, and the script end to end on a tiny pair
whose drafter is a copy of the target, where every feature of agreement is 1, every draft is
accepted, and each request's rounds follow from its length by hand."""
import json
import math
import shutil

import pytest

import torch

from bench_script import load_bench_script
from hf_factory import load_hf, make_checkpoint
from specpilot.runtime.decoder import load_pair
from specpilot.runtime.steps import teacher_forced_logits

# Prompts of several lengths (word-level tokens w0..w63 of the tiny checkpoints' tokenizer).
PROMPTS = ([3, 14, 15, 92 % 64, 65 % 64], [35, 89 % 64, 7], [2, 7, 1, 8, 28, 18, 28], [9])


@pytest.fixture(scope="module")
def script():
    return load_bench_script("round_predictors")


def test_spearman_on_hand_worked_ranks(script):
    assert script.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert script.spearman([1, 5, 9, 20], [2, 3, 4, 100]) == pytest.approx(1.0)
    # ties share their average rank: (0.5, 0.5, 2) against (0, 1, 2): 1.5 / sqrt(1.5 * 2)
    assert script.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    assert math.isnan(script.spearman([4, 4, 4], [1, 2, 3]))


def test_each_feature_orders_the_queue_predicted_longest_first(script):
    # Requests of 1, 1, 4 and 2 rounds on two slots: in this order 1+4 and 1+2 take 5 rounds;
    # longest first (4, 2, 1, 1) takes 4 (4 | 2+1+1), as full rows do.
    rounds = [1, 1, 4, 2]
    # agreement falls as the rounds rise (a good predictor: longest = least agreement), the
    # prompt length rises with them, the confidence says nothing (all equal: the given order)
    features = [{"length": 3.0, "agree_all": 0.9, "agree_last32": 0.1, "conf_last32": 0.5},
                {"length": 4.0, "agree_all": 0.8, "agree_last32": 0.2, "conf_last32": 0.5},
                {"length": 9.0, "agree_all": 0.1, "agree_last32": 0.9, "conf_last32": 0.5},
                {"length": 6.0, "agree_all": 0.5, "agree_last32": 0.5, "conf_last32": 0.5}]
    s = script.schedules(rounds, features, 2)
    assert (s["at_once"], s["longest_first"], s["packed"], s["full_rows"]) == (5, 4, 4, 4.0)
    assert s["by_agree_all"] == s["by_length"] == 4            # least agreement / longest first
    # agree_last32 rises with the rounds: read as "least agreement first" it serves the
    # shortest first (1, 1, 2, 4): 1+2 | 1+4, 5 rounds
    assert s["by_agree_last32"] == 5
    assert s["by_conf_last32"] == s["at_once"]                # a stable sort keeps the order


def test_a_pair_that_always_agrees(script, tmp_path):
    pair = tmp_path / "pair"
    target = make_checkpoint(pair, "llama3", name="target", seed=7, hidden_size=64,
                             intermediate_size=128)
    shutil.copytree(target, pair / "drafter")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(f"w{i}" for i in p) for p in PROMPTS) + "\n")
    out = tmp_path / "r.json"
    new, k = 13, 4
    assert script.main(["--pair", str(pair), "--workload", str(prompts), "--prompts", "4",
                        "--max-new-tokens", str(new), "--k", str(k), "--batch-sizes", "2",
                        "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    for f, p in zip(doc["features"], PROMPTS):
        assert f["length"] == len(p)
        assert f["agree_all"] == f["agree_last32"] == 1.0
        assert 0.0 < f["conf_last32"] <= 1.0
    # The prefill gives each request its first token; every round then commits all k drafts
    # and the target's own next token (the checkpoints have no EOS): ceil((13 - 1) / 5) = 3.
    assert doc["rounds"] == [math.ceil((new - 1) / (k + 1))] * len(PROMPTS)
    s = doc["schedules"]["2"]
    # four requests of 3 rounds on two slots: 6 rounds whatever the order
    assert s["at_once"] == s["longest_first"] == s["by_agree_all"] == s["by_length"] == 6
    assert s["full_rows"] == 6.0
    # every request has the same rounds: no correlation can be formed (null in the JSON)
    assert doc["spearman"] == {name: None for name in script.LONGER_WHEN}


def test_a_folder_without_a_pair_is_refused_with_its_name(script, tmp_path, capsys):
    with pytest.raises(SystemExit):
        script.main(["--pair", str(tmp_path / "none")])
    assert "none/target" in capsys.readouterr().err


def test_teacher_forced_logits_are_hfs_and_the_features_follow_from_them(script, tmp_path):
    target = make_checkpoint(tmp_path, "llama3", name="target", seed=11, hidden_size=64,
                             intermediate_size=128)
    drafter = make_checkpoint(tmp_path, "llama3", name="drafter", seed=12, hidden_size=32,
                              intermediate_size=64, num_hidden_layers=1)
    pair = load_pair(target, drafter, "float32", "cpu")
    prompt = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6, 26, 43, 38, 32, 7, 9, 50,
              28, 8, 4, 19, 7, 16, 9, 39, 37, 51]                       # 33 tokens
    ids = torch.tensor([prompt])
    with torch.no_grad():
        hf_t = load_hf(target)(ids).logits[0].float()
        hf_d = load_hf(drafter)(ids).logits[0].float()
    ours_t = teacher_forced_logits(pair.target, prompt)
    torch.testing.assert_close(ours_t, hf_t, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(teacher_forced_logits(pair.drafter, prompt), hf_d,
                               atol=1e-4, rtol=1e-4)
    f = script.prompt_features(pair.target, pair.drafter, prompt)
    agree = (hf_t.argmax(-1) == hf_d.argmax(-1)).float()
    assert f["length"] == 33
    assert f["agree_all"] == pytest.approx(agree.mean().item())
    assert f["agree_last32"] == pytest.approx(agree[1:].mean().item())
    conf = torch.softmax(hf_t, -1).max(-1).values[1:].mean().item()
    assert f["conf_last32"] == pytest.approx(conf, rel=1e-4)
