"""The greedy AR decoder and the padded append step: batching, EOS, margins, capacity.

References: HF generate / HF logits for the same checkpoint, and our own single-prompt runs
(batched decoding must not change any request's result).
"""
import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.config import load_model_config
from specpilot.runtime.errors import CapacityError
from specpilot.runtime.model import Transformer
from specpilot.runtime.steps import append_step

from hf_factory import hf_greedy, hf_logits, load_hf, make_checkpoint, random_prompts


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """A Mistral checkpoint whose window (5) is shorter than every sequence below."""
    folder = make_checkpoint(tmp_path_factory.mktemp("ar"), "mistral", seed=21)
    return folder, Transformer.from_checkpoint(folder, "float32")


@pytest.mark.parametrize("family,overrides", [
    ("mistral", {}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}),
    ("qwen3", {}),
])
def test_batched_ar_equals_each_prompt_alone(tmp_path, family, overrides):
    model = Transformer.from_checkpoint(make_checkpoint(tmp_path, family, seed=22, **overrides))
    prompts = random_prompts((3, 11, 1, 7), seed=23)
    batched = generate_ar(model, prompts, 18)
    for row, prompt in enumerate(prompts):
        alone = generate_ar(model, [prompt], 18)
        assert batched.tokens[row] == alone.tokens[0]
        torch.testing.assert_close(torch.tensor(batched.margins[row]),
                                   torch.tensor(alone.margins[0]), rtol=1e-4, atol=1e-4)
    assert batched.target_forwards == 18


def test_margins_are_hf_top1_minus_top2(mistral):
    folder, model = mistral
    prompt = random_prompts((9,), seed=24)[0]
    result = generate_ar(model, [prompt], 12)
    hf = load_hf(folder)
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                      pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    top = torch.topk(torch.stack(out.logits)[:, 0].float(), 2, dim=-1).values
    assert result.tokens[0] == out.sequences[0, len(prompt):].tolist()
    torch.testing.assert_close(torch.tensor(result.margins[0]), top[:, 0] - top[:, 1],
                               rtol=1e-4, atol=1e-4)
    assert all(m >= 0 for m in result.margins[0])


def test_eos_from_the_config_stops_only_its_request(tmp_path):
    prompts = random_prompts((5, 8), seed=25)
    plain = make_checkpoint(tmp_path, "llama3", name="plain", seed=26)
    free = generate_ar(Transformer.from_checkpoint(plain), prompts, 16).tokens
    # An id the model really emits for request 0 (not first at step 0) and never for request 1.
    eos, stop = next((tok, i) for i, tok in enumerate(free[0])
                     if i >= 2 and tok not in free[0][:i] and tok not in free[1])
    folder = make_checkpoint(tmp_path, "llama3", name="with-eos", seed=26, eos_token_id=eos)
    cfg = load_model_config(folder)
    assert cfg.eos_token_ids == (eos,)
    result = generate_ar(Transformer.from_checkpoint(folder), prompts, 16, eos_ids=cfg.eos_token_ids)
    assert result.tokens[0] == free[0][:stop + 1]
    assert result.tokens[1] == free[1]
    assert result.target_forwards == 16
    hf = load_hf(folder)  # HF takes its EOS from the checkpoint's generation config
    assert [hf_greedy(hf, p, 16) for p in prompts] == result.tokens


def test_append_steps_of_several_tokens_match_hf_positions(mistral):
    """Prefill, then multi-token appends of different widths per row (as chain verification
    does), past the sliding window: every returned logit equals HF's at that position."""
    folder, model = mistral
    seqs = random_prompts((14, 12), seed=27)
    chunks = [[4, 6, 1, 3], [2, 1, 5, 4]]  # per row; rows are padded to a common width
    cache = model.new_cache(2, 16)
    lengths = torch.zeros(2, dtype=torch.int64)
    got = [[], []]
    for step in range(4):
        new = []
        for row in range(2):
            start = sum(chunks[row][:step])
            new.append(seqs[row][start:start + chunks[row][step]])
        logits = append_step(model, cache, lengths, new, logits_last_only=False)
        for row in range(2):
            got[row].append(logits[row, :len(new[row])])
        lengths += torch.tensor([len(t) for t in new])
    hf = load_hf(folder)
    for row in range(2):
        torch.testing.assert_close(torch.cat(got[row]), hf_logits(hf, seqs[row]),
                                   rtol=1e-4, atol=1e-4)


# --- bad requests ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("ctx"), "llama3", seed=28,
                             max_position_embeddings=16)
    return folder, Transformer.from_checkpoint(folder)


def test_prompt_longer_than_the_context_is_refused(short_context):
    _, model = short_context
    prompt = random_prompts((17,), seed=29)[0]
    with pytest.raises(CapacityError, match="exceeds the model's context of 16 positions: "
                                            "shorten the prompt or lower max_new_tokens"):
        generate_ar(model, [prompt], 1)
    with pytest.raises(CapacityError, match="12 tokens plus 5 new tokens exceeds"):
        generate_ar(model, [prompt[:12], prompt[:3]], 5)


def test_a_request_that_exactly_fills_the_context_runs(short_context):
    folder, model = short_context
    prompt = random_prompts((12,), seed=30)[0]
    result = generate_ar(model, [prompt], 4)
    assert result.tokens[0] == hf_greedy(load_hf(folder), prompt, 4)


@pytest.mark.parametrize("prompts,new,message", [
    ([], 4, "no prompts given"),
    ([[1, 2], []], 4, "a prompt is empty"),
    ([[1, 2]], 0, "max_new_tokens must be at least 1"),
])
def test_malformed_requests_are_refused(short_context, prompts, new, message):
    with pytest.raises(CapacityError, match=message) as info:
        generate_ar(short_context[1], prompts, new)
    assert isinstance(info.value, SpecPilotError)
