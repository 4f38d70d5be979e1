"""Shared setup of the mechanism tests: a tiny target, drafters of known quality, mixed-length
prompts, and the stock reference (greedy AR, itself checked against HF in test_speculative.py).

Pairs are built once per seed for the whole run (several test modules use the same ones).
"""
import functools
import tempfile

import torch

from specpilot.runtime.ar import generate_ar
from specpilot.runtime.checkpoint import load_checkpoint
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.model import Transformer
from specpilot.runtime.row_tree import RowTree
from specpilot.runtime.step_loop import decode_with_mechanisms

from hf_factory import make_pair, random_prompts, with_noise
from torch_threads import single_thread_fixture

MAX_NEW = 16
PROMPT_LENGTHS = (5, 11, 2, 8)
SEEDS = (11, 4)

_FOLDER = tempfile.TemporaryDirectory(prefix="specpilot-mechanisms-")


# Imported by the mechanism test modules as their autouse fixture.
one_thread = single_thread_fixture()


def noisy_copy(checkpoint_dir, scale, seed):
    """The checkpoint's model with Gaussian noise (`scale` x each matrix's std) on every matrix:
    a drafter that agrees with the target often, not always."""
    ckpt = load_checkpoint(checkpoint_dir)
    return Transformer(ckpt.config, with_noise(ckpt.tensors, scale, seed), torch.float32)


class ContraryDrafter:
    """The target with its own top choice forbidden: it never drafts the target's next token."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.device, self.dtype = model.device, model.dtype

    def new_cache(self, batch, capacity):
        return self.model.new_cache(batch, capacity)

    def forward(self, *args, **kwargs):
        logits = self.model.forward(*args, **kwargs)
        return logits.scatter(-1, logits.argmax(-1, keepdim=True), float("-inf"))


def pick_eos(tokens):
    """A token that ends request 0 early while another request never produces it, so that
    requests finish at different times."""
    for i, tok in enumerate(tokens[0][2:-4], start=2):
        if tok not in tokens[0][:i] and any(tok not in other for other in tokens[1:]):
            return tok
    raise AssertionError("no token ends only some requests; change the prompt seed")


@functools.lru_cache(maxsize=None)
def pair_setup(seed: int):
    """dict(target_dir, drafter_dir, target, drafter (a noisy copy of the target), prompts,
    eos, reference (greedy AR, stopping at eos), plain (greedy AR without eos)) for one seed."""
    target_dir, drafter_dir = make_pair(_FOLDER.name, "llama3", seed=seed)
    target = Transformer.from_checkpoint(target_dir)
    prompts = random_prompts(PROMPT_LENGTHS, seed=seed + 100)
    plain = generate_ar(target, prompts, MAX_NEW)
    eos = (pick_eos(plain.tokens),)
    reference = generate_ar(target, prompts, MAX_NEW, eos_ids=eos)
    lengths = [len(t) for t in reference.tokens]
    assert min(lengths) < MAX_NEW == max(lengths), "requests must finish at different times"
    return dict(target_dir=target_dir, drafter_dir=drafter_dir, target=target, prompts=prompts,
                eos=eos, plain=plain,
                reference=reference, drafter=noisy_copy(target_dir, 0.1, seed=seed + 7))


def decode(s, proposer, batch, **kw):
    """Unforced mechanism decode of the setup's prompts with the setup's EOS."""
    return decode_with_mechanisms(s["target"], kw.pop("drafter", s["drafter"]), s["prompts"],
                                  MAX_NEW, proposer, s["eos"], max_batch_size=batch, **kw)


def force(s, proposer, batch, target=None, **kw):
    """The forcing report of a mechanism decode against the setup's reference (float32
    tolerance, a few ulps)."""
    target = target or s["target"]
    ref = s["reference"]
    run = decode_with_mechanisms(target, kw.pop("drafter", s["drafter"]), s["prompts"], MAX_NEW,
                                 proposer, max_batch_size=batch, force_reference=ref, **kw)
    return compare_to_reference(run.proposals, ref, default_tolerance(torch.float32))


def assert_clean(report, reference):
    total = sum(len(t) for t in reference.tokens)
    assert report.passed and not report.violations and not report.near_tie_flips, report.format()
    assert report.positions_compared == report.exact == total


def assert_caught(report, reference):
    assert not report.passed and report.violations, report.format()
    assert report.positions_compared == sum(len(t) for t in reference.tokens)


def off_by_one_ancestors(tree, node):
    """A tree-mask bug: the attention mask reads the parent of node i from parents[i] - 1 (the
    accept walk and the commit still read parents[i])."""
    out = [node]
    p = tree.parents[node]
    p = p - 1 if p > 0 else p
    while p != -1:
        out.append(p)
        p = tree.parents[p]
    return tuple(reversed(out))


ORIGINAL_ANCESTORS = RowTree.ancestors_or_self


def program_of(s, *transformations, batch: int):
    """The stock Program of pair_setup `s` (float32) with `transformations` applied in order,
    at batch size `batch`."""
    from dataclasses import replace

    from specpilot.deploy import build_deployment
    from specpilot.ir import replay, stock_program

    stock = stock_program(build_deployment(s["target_dir"], s["drafter_dir"], dtype="float32"))
    program = replay(stock, transformations)
    return replace(program, batch=replace(program.batch, max_batch_size=batch))


def run_program_graphed(s, program, decoder_class):
    """Run `program` on the graphed runtime over pair_setup `s` (rounds eager, no decoder kept
    from before): its decoder is a `decoder_class`, its output greedy AR and its forcing
    clean. Returns (the decoder, the result) for the caller's own checks."""
    from specpilot.runtime.decoder import ModelPair
    from specpilot.runtime.graphed_program import (decoder_for, force_graphed,
                                                   release_decoders, run_graphed)

    pair = ModelPair(s["target"], s["drafter"], None, s["eos"])
    release_decoders()
    decoder = decoder_for(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert type(decoder) is decoder_class
    r = run_graphed(program, pair, s["prompts"], MAX_NEW, capture=False)
    assert r.tokens == s["reference"].tokens
    assert_clean(force_graphed(program, pair, s["prompts"], s["reference"], capture=False),
                 s["reference"])
    return decoder, r


def fill_with_noise(cache):
    """Random K/V in every slot of `cache` (where a run must neither read nor write); returns a
    function telling, per K and V tensor, whether it still holds exactly that noise."""
    for t in cache.k + cache.v:
        t.copy_(torch.randn_like(t))
    noise = [t.clone() for t in cache.k + cache.v]
    return lambda: [torch.equal(a, b) for a, b in zip(noise, cache.k + cache.v)]
