"""Two-level verification: a cheaper path through the target prunes the drafted tree, the full
target verifies the survivors and keeps the last word. The cheap paths are checked against HF
and the bf16 checkpoint, pruning by hand and against the target itself, the decode against
greedy AR and by forcing; a decoder that lets the cheap path decide must be caught.
"""
import pytest
import torch
import transformers

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.prune import LayerSkipPrune, LowPrecisionPrune
from specpilot.ir.topology import DynamicTree, Tree
from specpilot.runtime import two_level
from specpilot.runtime.dynamic_tree import DynamicProposer
from specpilot.runtime.model import Transformer
from specpilot.runtime.row_tree import RowTree
from specpilot.runtime.steps import append_step
from specpilot.runtime.tree_drafting import StaticProposer
from specpilot.runtime.two_level import (TreePruner, cheap_verifier, layer_skip_model,
                                         low_precision_model, surviving_nodes)

from hf_factory import hf_logits, load_hf, random_prompts
from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import SEEDS, assert_caught, assert_clean, decode, force, pair_setup

PRUNES = [LayerSkipPrune((0,), 1), LayerSkipPrune((1,), 2), LowPrecisionPrune("bfloat16", 1)]


def pruner(target, prune):
    cheap = cheap_verifier(target, prune)
    return lambda batch, capacity: TreePruner(cheap, prune.top_k, batch, capacity)


def all_logits(model, tokens):
    cache = model.new_cache(1, len(tokens))
    return append_step(model, cache, torch.zeros(1, dtype=torch.int64), [tokens],
                       logits_last_only=False)[0]


@pytest.mark.parametrize("keep", [(0,), (1,)])
def test_layer_skip_is_hf_with_only_those_layers(keep):
    s = pair_setup(SEEDS[0])
    hf = load_hf(s["target_dir"])
    config = hf.config.to_dict()
    config.update(num_hidden_layers=len(keep))
    config.pop("layer_types", None)
    short = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), dtype=torch.float32).eval()
    state = {}
    for name, tensor in hf.state_dict().items():
        if ".layers." in name:
            layer = int(name.split(".layers.")[1].split(".")[0])
            if layer not in keep:
                continue
            name = name.replace(f".layers.{layer}.", f".layers.{keep.index(layer)}.")
        state[name] = tensor
    short.load_state_dict(state)
    prompt = random_prompts((12,), seed=9)[0]
    ours = all_logits(layer_skip_model(s["target"], keep), prompt)
    torch.testing.assert_close(ours, hf_logits(short, prompt), rtol=1e-4, atol=1e-4)
    # and it is not the full target
    assert (ours - all_logits(s["target"], prompt)).abs().max() > 1e-1


def test_low_precision_is_the_checkpoint_loaded_in_bfloat16():
    s = pair_setup(SEEDS[0])
    prompt = random_prompts((12,), seed=10)[0]
    cheap = low_precision_model(s["target"], "bfloat16")
    loaded = Transformer.from_checkpoint(s["target_dir"], "bfloat16")
    assert torch.equal(all_logits(cheap, prompt), all_logits(loaded, prompt))
    assert s["target"].dtype == torch.float32  # the target itself is untouched


def test_surviving_nodes_by_hand():
    # root ── 0 (tok 5) ── 2 (tok 7) ── 4 (tok 1)
    #      └─ 1 (tok 6) ── 3 (tok 8)
    tree = RowTree((5, 6, 7, 8, 1), (-1, -1, 0, 1, 2), (1, 1, 2, 2, 3), (0, 1, 0, 0, 0))
    logits = torch.zeros(6, 10)
    logits[0, [5, 9]] = torch.tensor([3.0, 4.0])   # root: top-2 = {9, 5}
    logits[1, [7, 2]] = torch.tensor([2.0, 1.0])   # after node 0: top-2 = {7, 2}
    logits[2, 8] = 5.0                              # after node 1 (pruned anyway)
    logits[3, [3, 4]] = torch.tensor([2.0, 1.0])   # after node 2: top-2 = {3, 4}: drops node 4
    assert surviving_nodes(tree, logits, 2) == [0, 2]
    assert surviving_nodes(tree, logits, 1) == []          # node 0's token is only 2nd at root
    assert tree.subtree([0, 2]) == RowTree((5, 7), (-1, 0), (1, 2), (0, 0))


@pytest.mark.parametrize("batch", [3, 4])      # batches of 3 and 1 requests; one batch of 4
@pytest.mark.parametrize("prune", PRUNES, ids=str)
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_ar(seed, prune, batch):
    s = pair_setup(seed)
    for proposer, layout in ((StaticProposer(Tree((2, 2))), "padded"),
                             (DynamicProposer(DynamicTree(6, 3, 3)), "ragged")):
        result = decode(s, proposer, batch, layout=layout,
                        pruner_factory=pruner(s["target"], prune))
        assert result.tokens == s["reference"].tokens
        assert result.stats["cheap_forwards"] == result.target_forwards
        assert result.stats["verified_nodes"] < result.stats["drafted_nodes"]


def test_pruning_with_the_target_itself_keeps_exactly_the_accepted_path():
    # With the full target as the "cheap" verifier and top-1, a node survives iff the target
    # accepts it, so the target verifies nothing but the accepted paths.
    s = pair_setup(SEEDS[1])
    itself = lambda batch, capacity: TreePruner(s["target"], 1, batch, capacity)  # noqa: E731
    pruned = decode(s, StaticProposer(Tree((3, 2))), 3, pruner_factory=itself)
    full = decode(s, StaticProposer(Tree((3, 2))), 3)
    assert pruned.tokens == full.tokens == s["reference"].tokens
    assert pruned.accepted_lengths == full.accepted_lengths
    assert pruned.stats["verified_nodes"] == sum(map(sum, pruned.accepted_lengths)) > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_forcing_is_clean(seed):
    s = pair_setup(seed)
    report = force(s, DynamicProposer(DynamicTree(6, 3, 3)), 3,
                   pruner_factory=pruner(s["target"], PRUNES[1]))
    assert_clean(report, s["reference"])


def test_cheap_path_with_the_last_word_is_caught():
    # The two verifiers wired the wrong way round: the layer-skipping path decides.
    s = pair_setup(SEEDS[0])
    cheap = layer_skip_model(s["target"], (0,))
    report = force(s, StaticProposer(Tree((2, 2))), 3, target=cheap,
                   pruner_factory=pruner(s["target"], PRUNES[1]))
    assert_caught(report, s["reference"])


def test_survivor_without_its_parent_is_refused(monkeypatch):
    def ignore_parents(tree, logits, top_k):
        top = torch.topk(logits, top_k, dim=-1).indices.tolist()
        return [i for i in range(tree.num_nodes) if tree.tokens[i] in top[tree.parents[i] + 1]]

    s = pair_setup(SEEDS[0])
    monkeypatch.setattr(two_level, "surviving_nodes", ignore_parents)
    with pytest.raises(SpecPilotError, match="not its parent"):
        decode(s, StaticProposer(Tree((3, 3, 2))), 3,
               pruner_factory=pruner(s["target"], LayerSkipPrune((1,), 1)))
