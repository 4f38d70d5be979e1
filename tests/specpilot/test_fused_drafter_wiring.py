"""specpilot/bench/mechanism_programs.py's fused-drafter systems: the Programs with
kernels.drafter_kernels "fused" (the shaped tree's timed system with the fused drafter among
them) get one FusedForward around the pair's own drafter model (the other systems keep the pair
as it is), and a drafter the fused kernels cannot run refuses those systems with the reason."""
from dataclasses import replace

import pytest

from specpilot.bench.mechanism_programs import mechanism_systems
from specpilot.bench.system_pairs import fused_drafter_pair
from specpilot.codegen.cache import triton_interpreting
from specpilot.deploy import build_deployment
from specpilot.ir import stock_program
from specpilot.runtime.decoder import ModelPair, load_pair
from specpilot.runtime.fused_forward import FusedForward

from hf_factory import FUSABLE, make_checkpoint, make_pair, random_prompts

# The bench as it loads a pair off a GPU: models on the CPU, the fused and attention kernels in
# Triton's interpreter (tests/conftest.py sets it where there is no CUDA). On a GPU machine the
# same systems run for real in tests/gpu/ (test_fused_drafter_gpu.py,
# test_generated_attention_gpu.py).
pytestmark = pytest.mark.skipif(not triton_interpreting(),
                                reason="checks the wiring with CPU models in Triton's interpreter")

FUSED = {"graphed_fused_drafter", "graphed_refill_fused", "graphed_adaptive_fused",
         "graphed_adaptive_refill_fused", "graphed_adaptive_refill_fused_chain8",
         "graphed_tree_fused", "graphed_tree_refill_fused", "graphed_adaptive_refill_fused_depth",
         "graphed_adaptive_refill_fused_chain8_depth", "graphed_refill_fused_accept",
         "graphed_adaptive_refill_fused_accept", "graphed_adaptive_refill_fused_accept_depth",
         "graphed_adaptive_refill_fused_accept_depth_drain"}
ATTENTION = {"graphed_attention", "graphed_fused_attention", "graphed_refill_fused_attention",
             "graphed_adaptive_refill_fused_attention", "graphed_tree_fused_attention",
             "graphed_tree_refill_fused_attention", "graphed_ar_attention",
             "graphed_adaptive_refill_fused_attention_depth",
             "graphed_adaptive_refill_fused_attention_chain8_depth",
             "graphed_adaptive_refill_fused_attention_chain8"}
# On compiled layers with the generated attention: wired as test_layers_attention_wiring.py checks.
LAYERS_ATTENTION = {"graphed_layers_attention", "graphed_refill_fused_layers_attention",
                    "graphed_adaptive_refill_fused_layers_attention",
                    "graphed_adaptive_refill_fused_layers_attention_chain8",
                    "graphed_ar_layers_attention"}
FUSED_ATTENTION = {name for name in ATTENTION | LAYERS_ATTENTION if "fused" in name}
AR = {"graphed_ar_attention", "graphed_ar_layers_attention"}       # the target alone


def _stock_and_pair(target_dir, drafter_dir):
    stock = stock_program(build_deployment(target_dir, drafter_dir, dtype="float32"))
    # On the CPU (as `specpilot bench` loads it off a GPU): the graphed systems cannot capture.
    return stock, load_pair(target_dir, drafter_dir, "float32", "cpu")


def _by_name(systems):
    out = {s.name.removeprefix("mech:"): s for s in systems}
    assert len(out) == len(systems) and all(s.name.startswith("mech:") for s in systems)
    return out


@pytest.fixture(scope="module")
def fusable(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fusable")
    target_dir = make_checkpoint(folder, "llama3", name="target", seed=3, hidden_size=64,
                                 intermediate_size=128)
    drafter_dir = make_checkpoint(folder, "llama3", name="fusable-drafter", seed=5,
                                 **dict(FUSABLE, num_hidden_layers=1))
    return _stock_and_pair(target_dir, drafter_dir)


def test_the_fused_systems_share_one_fused_forward_around_the_pairs_drafter(fusable):
    stock, pair = fusable
    assert not isinstance(pair.drafter, FusedForward)       # loaded for the stock Program
    systems = _by_name(mechanism_systems(stock, pair))
    assert FUSED <= set(systems)
    fused_drafters = set()
    for name, system in systems.items():
        if name in ATTENTION | LAYERS_ATTENTION:
            continue        # test_the_attention_systems_share_one_pair_of_each_kind
        if name in FUSED:
            assert system.program.kernels.drafter_kernels == "fused", name
            assert system.program.kernels.capture_graphs, name
            assert isinstance(system.pair.drafter, FusedForward), name
            assert system.pair.drafter.model is pair.drafter, name
            # the rest of the pair is the original's
            assert system.pair.target is pair.target and system.pair.eos_ids == pair.eos_ids
            assert system.pair.tokenizer is pair.tokenizer
            fused_drafters.add(id(system.pair.drafter))
        else:
            assert system.program.kernels.drafter_kernels != "fused", name
            assert system.pair is pair, name
    assert len(fused_drafters) == 1
    # The fused systems are what their non-fused twins are but for the drafter kernels.
    for name, twin in [("graphed_fused_drafter", None), ("graphed_refill_fused", "graphed_refill"),
                       ("graphed_adaptive_fused", "graphed_adaptive"),
                       ("graphed_adaptive_refill_fused", "graphed_adaptive_refill"),
                       ("graphed_tree_fused", "graphed_tree"),
                       ("graphed_tree_refill_fused", "graphed_tree_refill")]:
        mine = systems[name].program
        if twin:        # adaptive ones set their token budget per batch size like their twins
            assert type(systems[name]) is type(systems[twin])
        if twin:        # the whole Program, but for the drafter kernels and the history
            other = systems[twin].program
            as_twin = replace(mine, kernels=replace(mine.kernels, drafter_kernels="model"),
                              history=other.history)
            assert as_twin == other, name
        else:           # stock with graphs captured: the same draft and batch as stock
            assert mine.draft == stock.draft and mine.batch == stock.batch
    # The fused round end's systems are their twins but for the accept kernels.
    for name, twin in [("graphed_accept", None), ("graphed_refill_fused_accept",
                                                  "graphed_refill_fused"),
                       ("graphed_adaptive_refill_fused_accept", "graphed_adaptive_refill_fused")]:
        mine = systems[name].program
        assert mine.kernels.accept_kernels == "fused", name
        other = systems[twin].program if twin else replace(stock, kernels=replace(
            stock.kernels, capture_graphs=True))
        assert replace(mine, kernels=replace(mine.kernels, accept_kernels="ops"),
                       history=other.history) == other, name
        assert twin is None or (type(systems[name]) is type(systems[twin])
                                and systems[name].pair is systems[twin].pair)
    # Chains of up to 8: the chain(4) adaptive system but for the topology, whose k sets the
    # adaptive cap (the budget per batch size follows it: at batch 16, 16 x 9 tokens).
    long, short = systems["graphed_adaptive_refill_fused_chain8"], \
        systems["graphed_adaptive_refill_fused"]
    assert type(long) is type(short) and long.pair is short.pair
    assert long.program.draft.topology.k == 8 and short.program.draft.topology.k == 4
    assert long.program.batch.token_budget == stock.batch.max_batch_size * 9
    assert replace(long.program, draft=short.program.draft, history=short.program.history,
                   batch=short.program.batch) == short.program
    assert replace(long.program.batch, token_budget=short.program.batch.token_budget) \
        == short.program.batch
    # Off a GPU the ridge is unknown and caps nothing: a full chain each.
    assert long.at_batch(16).batch.token_budget == 16 * 9
    assert short.at_batch(16).batch.token_budget == 16 * 5
    # Off a GPU every graphed system is refused because its rounds cannot be graphed, the
    # fused ones included: their fused drafter itself is accepted.
    for name in FUSED:
        why = systems[name].unavailable(4)
        assert why is not None and "its rounds cannot be graphed here" in why, (name, why)
        assert "CUDA graphs need a CUDA GPU" in why and "fused" not in why, (name, why)
    assert systems["graphed_fused_drafter"].unavailable(4) == \
        systems["graphed_refill"].unavailable(4)


def test_the_attention_systems_share_one_pair_of_each_kind(fusable):
    """The generated-attention systems run on copies of the pair's models (sharing their
    weights) whose attention is the generated kernel: one pair for those with the model's
    drafter, one for those with the fused drafter, whose FusedForward wraps a copy too."""
    stock, pair = fusable
    systems = _by_name(mechanism_systems(stock, pair))
    assert ATTENTION <= set(systems)
    pairs = {}
    for name in ATTENTION - {"graphed_ar_attention"}:
        system = systems[name]
        assert system.program.kernels.attention_kernels == "generated", name
        # off a GPU refused only as every graphed system is, not for the attention
        why = system.unavailable(4)
        assert why.startswith("its rounds cannot be graphed here"), (name, why)
        assert "attention" not in why, (name, why)
        target = system.pair.target
        assert target is not pair.target and target.lm_head[0] is pair.target.lm_head[0]
        assert target.backend.attention_kernels == "generated"
        fused = system.program.kernels.drafter_kernels == "fused"
        assert fused == ("fused" in name), name
        drafter = system.pair.drafter
        assert isinstance(drafter, FusedForward) == fused, name
        model = drafter.model if fused else drafter
        assert model.backend.attention_kernels == "generated" and model is not pair.drafter
        pairs.setdefault(fused, set()).add(id(system.pair))
    assert {k: len(v) for k, v in pairs.items()} == {True: 1, False: 1}
    # the stock Program's twin with the attention alone, and greedy AR's (the target alone)
    assert systems["graphed_attention"].program.draft == stock.draft
    ar = systems["graphed_ar_attention"]
    assert not ar.program.draft.speculates and ar.pair.drafter is None
    # the systems without it keep the pair's own models
    assert pair.target.backend.attention_kernels == "model"
    assert systems["graphed_refill"].pair is pair


def test_a_drafter_without_fused_kernels_refuses_the_fused_systems_with_why(tmp_path):
    target_dir, drafter_dir = make_pair(tmp_path, "llama3", seed=1)   # drafter head_dim 8
    stock, pair = _stock_and_pair(target_dir, drafter_dir)
    assert pair.drafter.config.head_dim == 8
    why = fused_drafter_pair(pair)
    assert isinstance(why, str) and "head_dim 8" in why
    systems = _by_name(mechanism_systems(stock, pair))
    assert FUSED <= set(systems)
    for name, system in systems.items():
        refusal = system.unavailable(4)
        if name in FUSED | FUSED_ATTENTION:
            assert refusal.startswith("the drafter has no fused kernels: "), (name, refusal)
            assert "head_dim 8" in refusal, (name, refusal)
            assert system.pair is pair                  # the original pair, unused
        elif name not in AR:                            # greedy AR's: the target alone
            assert system.pair is pair
            assert refusal is None or "fused" not in refusal, (name, refusal)
    # The generated attention takes heads of 16 to 256 as well: the systems with it alone
    # name that.
    assert systems["graphed_attention"].unavailable(4) == (
        "the generated attention cannot run the drafter: head_dim 8 is outside the attention "
        "kernel's 16..256")
    # greedy AR runs no drafter: its head_dim does not refuse it (off a GPU, its steps cannot
    # be graphed)
    assert "head_dim" not in systems["graphed_ar_attention"].unavailable(4)
    # The other systems are refused only where their rounds cannot be graphed (off a GPU),
    # or run: the drafter's head_dim does not concern them.
    assert systems["graphed_refill"].unavailable(4).startswith("its rounds cannot be graphed")
    assert systems["refill"].unavailable(4) is None


def test_a_pair_without_a_drafter_has_no_fused_pair(fusable):
    stock, pair = fusable
    bare = ModelPair(pair.target, None, pair.tokenizer, pair.eos_ids)
    assert fused_drafter_pair(bare) == "the pair has no drafter"
    systems = _by_name(mechanism_systems(stock, bare))
    for name in FUSED:
        assert systems[name].unavailable(4) == \
            "the drafter has no fused kernels: the pair has no drafter"
        assert systems[name].pair is bare


def _with_profile(stock, pair):
    from specpilot.bench.shaped_tree_system import HeldOutProfile

    profile = HeldOutProfile(pair, random_prompts((5, 3), seed=9), 6, benched=True)
    return _by_name(mechanism_systems(stock, pair, profile)), profile


def test_the_shaped_tree_runs_timed_with_the_fused_drafter_too(fusable):
    stock, pair = fusable
    systems, profile = _with_profile(stock, pair)
    fused, plain = systems["graphed_sequoia_timed_fused"], systems["graphed_sequoia_timed"]
    assert fused.pricing == plain.pricing == "timed" and fused.profile is profile
    assert fused.program.kernels.drafter_kernels == "fused"
    assert plain.program.kernels.drafter_kernels == "model"
    # the same Program but for the drafter kernels; the one fused drafter of the other systems
    assert replace(fused.program, kernels=plain.program.kernels,
                   history=plain.program.history) == plain.program
    assert isinstance(fused.pair.drafter, FusedForward) and fused.pair.drafter.model is pair.drafter
    assert fused.pair.drafter is systems["graphed_fused_drafter"].pair.drafter
    assert plain.pair is pair
    # off a GPU it is refused as the other graphed systems are, not for its drafter
    why = fused.unavailable(4)
    assert why.startswith("its rounds cannot be graphed here") and "fused" not in why


def test_a_drafter_without_fused_kernels_refuses_the_fused_shaped_tree(tmp_path):
    target_dir, drafter_dir = make_pair(tmp_path, "llama3", seed=1)   # drafter head_dim 8
    stock, pair = _stock_and_pair(target_dir, drafter_dir)
    systems, _ = _with_profile(stock, pair)
    refusal = systems["graphed_sequoia_timed_fused"].unavailable(4)
    assert refusal.startswith("the drafter has no fused kernels: ") and "head_dim 8" in refusal
    assert systems["graphed_sequoia_timed_fused"].pair is pair
    assert "fused" not in systems["graphed_sequoia_timed"].unavailable(4)
