"""Token forcing: correct candidates pass with every position compared; a perturbed target or a
broken acceptance rule is rejected; near-ties are tolerated only below the tolerance.

Independent references: the proposals of a forced candidate are checked against one plain causal
forward of its target over prompt + reference tokens (teacher forcing), and the default tolerance
against the dtype's bit-level spacing.
"""
import collections
import json

import pytest
import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain, Tree
from specpilot.runtime.acceptance import AcceptedPath
from specpilot.runtime.ar import ARResult, generate_ar
from specpilot.runtime.checkpoint import load_checkpoint
from specpilot.runtime.forcing import compare_to_reference, default_tolerance, force_tokens
from specpilot.runtime.model import Transformer
from specpilot.runtime.steps import append_step

from hf_factory import make_pair, random_prompts

MAX_NEW = 24


def model_with(ckpt, edit=None, seed=None, noise=0.0):
    """The checkpoint's model after `edit(tensors)`; with `noise`, Gaussian noise of that many
    stds on every matrix (a drafter that agrees with the target often, not always)."""
    tensors = dict(ckpt.tensors)
    if noise:
        gen = torch.Generator().manual_seed(seed)
        tensors = {n: t + noise * t.std() * torch.randn(t.shape, generator=gen)
                   if t.dim() == 2 else t for n, t in tensors.items()}
    if edit is not None:
        edit(tensors)
    return Transformer(ckpt.config, tensors, torch.float32)


def teacher_forced_argmax(model, prompts, reference):
    """argmax after prompt + reference[:p] for every generated position p, from one causal
    forward per request: what a correct forced candidate must propose."""
    out = []
    for prompt, ref in zip(prompts, reference.tokens):
        seq = list(prompt) + ref[:-1]
        cache = model.new_cache(1, len(seq) + 1)
        logits = append_step(model, cache, torch.zeros(1, dtype=torch.int64), [seq],
                             logits_last_only=False)[0]
        out.append(logits[len(prompt) - 1:].argmax(-1).tolist())
    return out


def accept_unchecked(plan, node_tokens, target_logits):
    """A broken rule: takes the drafter's first choices to full depth without checking them."""
    nodes, current = [], -1
    while plan.children(current):
        current = plan.children(current)[0]
        nodes.append(current)
    return AcceptedPath(tuple(nodes), int(target_logits[current + 1].argmax()))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target_dir, _ = make_pair(tmp_path_factory.mktemp("forcing"), "llama3", seed=11)
    ckpt = load_checkpoint(target_dir)
    target = model_with(ckpt)
    prompts = random_prompts((5, 11, 2), seed=23)
    plain = generate_ar(target, prompts, MAX_NEW)
    eos = plain.tokens[0][3]  # ends request 0 early, the others at various points or never
    return dict(ckpt=ckpt, target=target, prompts=prompts, plain=plain,
                reference=generate_ar(target, prompts, MAX_NEW, eos_ids=(eos,)),
                drafter=model_with(ckpt, seed=5, noise=0.1))


@pytest.mark.parametrize("topology", [Chain(4), Tree((2, 2)), Tree((4, 2, 2, 1))], ids=str)
def test_correct_candidate_passes(setup, topology):
    ref = setup["reference"]
    report = force_tokens(setup["target"], setup["drafter"], setup["prompts"], topology, ref)
    total = sum(len(t) for t in ref.tokens)
    assert report.passed and not report.violations and not report.near_tie_flips
    assert report.positions_compared == report.exact == total
    assert report.tolerance == default_tolerance(torch.float32)


@pytest.mark.parametrize("self_drafting", [False, True], ids=["noisy-drafter", "self-drafter"])
def test_perturbed_target_is_rejected(setup, self_drafting):
    def scale_down_proj(tensors):
        name = "model.layers.1.mlp.down_proj.weight"
        tensors[name] = tensors[name] * 1.5

    candidate = model_with(setup["ckpt"], scale_down_proj)
    # Drafting with itself, the candidate accepts whole paths, so it disagrees with the
    # reference mid-path: what follows in that step must not be compared or kept.
    drafter = candidate if self_drafting else setup["drafter"]
    ref = setup["reference"]
    report = force_tokens(candidate, drafter, setup["prompts"], Tree((3, 1, 1)), ref)
    assert not report.passed
    assert report.positions_compared == sum(len(t) for t in ref.tokens)
    # Every disagreement is exactly where the perturbed model, fed the reference, picks otherwise.
    want = teacher_forced_argmax(candidate, setup["prompts"], ref)
    expected = {(r, p, ref.tokens[r][p], g) for r, row in enumerate(want) for p, g in enumerate(row)
                if g != ref.tokens[r][p]}
    found = {(d.prompt, d.position, d.ref_token, d.got_token)
             for d in report.violations + report.near_tie_flips}
    assert found == expected and report.violations
    assert all(d.margin >= report.tolerance for d in report.violations)


@pytest.mark.parametrize("topology", [Chain(3), Tree((2, 2))], ids=str)
def test_unchecked_acceptance_is_rejected(setup, topology):
    ref = setup["reference"]
    report = force_tokens(setup["target"], setup["drafter"], setup["prompts"], topology, ref,
                          acceptance=accept_unchecked)
    assert not report.passed and report.violations
    assert report.positions_compared == sum(len(t) for t in ref.tokens)
    assert "REJECTED" in report.format()


def tie_models(setup):
    """(tied, boosted): the target with lm_head row b copied from a frequent token a (exact ties
    wherever a is top-1), and with row b = row a x (1 + 1e-4) (b wins those ties)."""
    ckpt = setup["ckpt"]
    a = collections.Counter(t for row in setup["plain"].tokens for t in row).most_common(1)[0][0]
    b = (a + 1) % ckpt.config.vocab_size

    def head(scale):
        def edit(tensors):
            h = tensors["lm_head.weight"].clone()
            h[b] = h[a] * scale
            tensors["lm_head.weight"] = h
        return edit

    return a, b, model_with(ckpt, head(1.0)), model_with(ckpt, head(1.0 + 1e-4))


def test_real_near_tie_is_tolerated_and_reported(setup):
    a, b, tied, boosted = tie_models(setup)
    ref = generate_ar(tied, setup["prompts"], MAX_NEW)
    report = force_tokens(boosted, setup["drafter"], setup["prompts"], Tree((2, 2)), ref)
    assert report.passed and not report.violations
    assert report.near_tie_flips
    assert all((d.ref_token, d.got_token) == (a, b) and d.margin < report.tolerance
               for d in report.near_tie_flips)
    assert "near-tie flip" in report.format()
    # With no tolerance the very same flips reject the candidate.
    strict = force_tokens(boosted, setup["drafter"], setup["prompts"], Tree((2, 2)), ref,
                          tolerance=0.0)
    assert not strict.passed and strict.violations == report.near_tie_flips


def test_same_flip_against_a_decisive_reference_is_a_violation(setup):
    a, b, _, boosted = tie_models(setup)
    ref = setup["plain"]  # the untouched target: a beats b by a wide margin
    report = force_tokens(boosted, setup["drafter"], setup["prompts"], Tree((2, 2)), ref)
    assert not report.passed and not report.near_tie_flips
    assert report.violations
    assert all((d.ref_token, d.got_token) == (a, b) and d.margin > report.tolerance
               for d in report.violations)


def test_compare_classifies_by_reference_margin():
    gen = torch.Generator().manual_seed(41)
    tokens = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (6, 9)]
    tol = default_tolerance(torch.bfloat16)  # 0.5
    margins = [(2 * tol + torch.rand(len(t), generator=gen)).tolist() for t in tokens]
    margins[1][4] = tol / 3                             # a near-tie in the reference
    proposals = [list(t) for t in tokens]
    proposals[1][4] = (tokens[1][4] + 1) % 97           # flipped at the near-tie
    proposals[0][2] = (tokens[0][2] + 5) % 97           # flipped where the reference is decisive
    report = compare_to_reference(proposals, ARResult(tokens, margins), tol)
    assert report.near_tie_flips == [(1, 4, tokens[1][4], proposals[1][4], margins[1][4])]
    assert report.violations == [(0, 2, tokens[0][2], proposals[0][2], margins[0][2])]
    assert report.exact == 13 and report.positions_compared == 15 and not report.passed
    # The same near-tie flip alone passes; with the decisive margin at that spot it does not.
    proposals[0][2] = tokens[0][2]
    assert compare_to_reference(proposals, ARResult(tokens, margins), tol).passed
    margins[1][4] = 3 * tol
    assert not compare_to_reference(proposals, ARResult(tokens, margins), tol).passed
    data = json.loads(json.dumps(report.to_json()))
    assert data["passed"] is False and data["violations"][0]["position"] == 2


def test_missing_positions_fail_coverage():
    tokens, margins = [[3, 4, 5]], [[1.0, 1.0, 1.0]]
    report = compare_to_reference([[3, 4]], ARResult(tokens, margins), 0.1)
    assert not report.violations and report.positions_compared == 2 and not report.passed


@pytest.mark.parametrize("dtype, int_view", [(torch.bfloat16, torch.int16),
                                             (torch.float16, torch.int16),
                                             (torch.float32, torch.int32)])
def test_default_tolerance_is_a_few_ulps_at_sixteen(dtype, int_view):
    sixteen = torch.tensor([16.0], dtype=dtype)
    next_up = (sixteen.view(int_view) + 1).view(dtype)
    ulp = (next_up.double() - 16.0).item()
    assert default_tolerance(dtype) == 4 * ulp
    # Top-1 logits in [32, 64) sit on a grid twice as coarse.
    assert default_tolerance(dtype, top1_magnitude=40.0) == 4 * 2 * ulp


def test_reference_must_match_prompts(setup):
    with pytest.raises(SpecPilotError, match="prompts"):
        force_tokens(setup["target"], setup["drafter"], setup["prompts"][:2], Chain(2),
                     setup["reference"])
