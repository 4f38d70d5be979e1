"""Speculative decoding (chain and tree, batched) must reproduce greedy AR decoding exactly.

The reference is `generate_ar` on the same target, itself checked here against HF
`generate(do_sample=False)`. Drafters: a noisy copy of the target (accepts often but not always,
so tree paths through non-first children and their KV compaction are exercised), the target
itself (always right), the target with its top choice removed (always wrong) and an independent
small model.
"""
import pytest

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain, Tree
from specpilot.runtime.acceptance import AcceptedPath
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.errors import CapacityError, TokenizerMismatch
from specpilot.runtime.model import Transformer
from specpilot.runtime.speculative import speculative_generate

from mechanism_setup import ContraryDrafter, noisy_copy, pick_eos
from hf_factory import hf_greedy, load_hf, make_checkpoint, make_pair, random_prompts

MAX_NEW = 24
TOPOLOGIES = [Chain(1), Chain(2), Chain(4), Chain(7),
              Tree((2, 2)), Tree((3, 1, 1)), Tree((4, 2, 2, 1)), Tree((1, 3))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target_dir, drafter_dir = make_pair(tmp_path_factory.mktemp("spec"), "llama3", seed=11)
    target = Transformer.from_checkpoint(target_dir)
    prompts = random_prompts((5, 11, 2), seed=23)
    eos = pick_eos(generate_ar(target, prompts, MAX_NEW).tokens)
    return dict(target_dir=target_dir, target=target, prompts=prompts, eos=(eos,),
                small=Transformer.from_checkpoint(drafter_dir),
                noisy=noisy_copy(target_dir, 0.1, seed=5),
                reference=generate_ar(target, prompts, MAX_NEW, eos_ids=(eos,)))


def check_counts(result, shape_depth):
    """Forward counts and accepted lengths tell the same story as the tokens."""
    steps = max(len(a) for a in result.accepted_lengths)
    assert result.target_forwards == 1 + steps
    assert result.drafter_forwards == steps * shape_depth
    for tokens, accepted in zip(result.tokens, result.accepted_lengths):
        per_step = [n + 1 for n in accepted]
        # 1 token from the prefill, then n+1 per step; only the last step may be cut short.
        if per_step:
            assert 1 + sum(per_step[:-1]) < len(tokens) <= 1 + sum(per_step)
        else:
            assert len(tokens) == 1
        assert all(0 <= n <= shape_depth for n in accepted)
    flat = [n + 1 for a in result.accepted_lengths for n in a]
    assert result.mean_accepted == pytest.approx(sum(flat) / len(flat))


def test_reference_is_hf_greedy(setup):
    hf = load_hf(setup["target_dir"])
    expected = [hf_greedy(hf, p, MAX_NEW, eos_ids=setup["eos"]) for p in setup["prompts"]]
    ref = setup["reference"].tokens
    assert ref == expected
    # The EOS choice makes requests finish at different times.
    assert min(map(len, ref)) < MAX_NEW and max(map(len, ref)) == MAX_NEW


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=str)
def test_matches_ar(setup, topology, batch):
    prompts = setup["prompts"][:batch]
    result = speculative_generate(setup["target"], setup["noisy"], prompts, MAX_NEW,
                                  topology.shape(), eos_ids=setup["eos"])
    assert result.tokens == setup["reference"].tokens[:batch]
    check_counts(result, topology.depth)
    if isinstance(topology, Chain):
        assert result.compactions == 0


@pytest.mark.parametrize("topology", [Tree((2, 2)), Tree((4, 2, 2, 1))], ids=str)
def test_tree_paths_are_compacted(setup, topology):
    result = speculative_generate(setup["target"], setup["noisy"], setup["prompts"], MAX_NEW,
                                  topology, eos_ids=setup["eos"])
    assert result.tokens == setup["reference"].tokens
    # Some accepted paths left the first-child spine and were moved; later steps read them.
    assert result.compactions > 0
    assert 1.5 < result.mean_accepted < topology.depth + 1


def test_chain_is_the_unit_branching_tree(setup):
    a = speculative_generate(setup["target"], setup["noisy"], setup["prompts"], MAX_NEW, Chain(3),
                             eos_ids=setup["eos"])
    b = speculative_generate(setup["target"], setup["noisy"], setup["prompts"], MAX_NEW,
                             Tree((1, 1, 1)), eos_ids=setup["eos"])
    assert a == b and a.tokens == setup["reference"].tokens and a.compactions == 0


@pytest.mark.parametrize("topology", [Chain(4), Tree((2, 2))], ids=str)
def test_drafter_always_right(setup, topology):
    target = setup["target"]
    ref = generate_ar(target, setup["prompts"], MAX_NEW)  # no EOS: every request runs 24 tokens
    result = speculative_generate(target, target, setup["prompts"], MAX_NEW, topology)
    assert result.tokens == ref.tokens
    k = topology.depth
    assert all(n == k for a in result.accepted_lengths for n in a)
    assert result.mean_accepted == k + 1
    steps = -(-(MAX_NEW - 1) // (k + 1))  # after the prefill's token, k+1 per step
    assert result.target_forwards == 1 + steps


@pytest.mark.parametrize("topology", [Chain(3), Tree((4, 2, 2, 1))], ids=str)
def test_drafter_always_wrong(setup, topology):
    target = setup["target"]
    result = speculative_generate(target, ContraryDrafter(target), setup["prompts"], MAX_NEW,
                                  topology, eos_ids=setup["eos"])
    assert result.tokens == setup["reference"].tokens
    assert all(n == 0 for a in result.accepted_lengths for n in a)
    assert result.mean_accepted == 1.0
    assert result.target_forwards == max(map(len, result.tokens))  # one token per forward


def test_independent_small_drafter(setup):
    result = speculative_generate(setup["target"], setup["small"], setup["prompts"], MAX_NEW,
                                  Chain(4), eos_ids=setup["eos"])
    assert result.tokens == setup["reference"].tokens
    assert result.mean_accepted < 1.5  # an unrelated model rarely guesses the target's token
    check_counts(result, 4)


@pytest.mark.parametrize("family", ["mistral", "qwen3"])
def test_other_families(tmp_path, family):
    # Mistral's sliding window reads token positions, which differ from slots in the tree.
    target_dir, _ = make_pair(tmp_path, family, seed=3)
    target = Transformer.from_checkpoint(target_dir)
    drafter = noisy_copy(target_dir, 0.15, seed=7)
    prompts = random_prompts((9, 3, 6), seed=31)
    ref = generate_ar(target, prompts, 16)
    for topology in (Chain(3), Tree((3, 2, 1))):
        assert speculative_generate(target, drafter, prompts, 16, topology).tokens == ref.tokens


def test_max_new_tokens_one(setup):
    result = speculative_generate(setup["target"], setup["noisy"], setup["prompts"], 1, Chain(2))
    assert result.tokens == generate_ar(setup["target"], setup["prompts"], 1).tokens
    assert result.target_forwards == 1 and result.mean_accepted == 0.0


def test_rejects_drafter_with_other_vocabulary(setup, tmp_path):
    other = Transformer.from_checkpoint(make_checkpoint(tmp_path, "llama3", vocab_size=50))
    with pytest.raises(TokenizerMismatch, match="vocab_size"):
        speculative_generate(setup["target"], other, setup["prompts"], 4, Chain(2))


def test_rejects_prompt_beyond_context(setup):
    limit = setup["target"].config.max_position_embeddings
    with pytest.raises(CapacityError, match="max_new_tokens"):
        speculative_generate(setup["target"], setup["noisy"], [[1] * (limit - 2)], 8, Chain(2))


def test_rejects_acceptance_path_that_leaves_the_tree(setup):
    def jump(plan, node_tokens, target_logits):
        return AcceptedPath((plan.num_nodes - 1,), 0)  # a leaf, skipping its ancestors

    with pytest.raises(SpecPilotError, match="not a child"):
        speculative_generate(setup["target"], setup["noisy"], setup["prompts"], 8, Tree((2, 2)),
                             acceptance=jump)
