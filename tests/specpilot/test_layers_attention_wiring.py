"""specpilot/bench/mechanism_programs.py's systems on compiled whole layers with the generated
attention: each is its per-op twin but for kernels.fast_path, and runs on a copy of the bench's
pair (weights shared) whose models compile whole layers and call the kernel from them, one pair
of each kind; a pair loaded off the fast path refuses them with the reason."""
from dataclasses import replace

import pytest

from specpilot.bench.mechanism_programs import mechanism_systems
from specpilot.codegen.cache import triton_interpreting
from specpilot.deploy import build_deployment
from specpilot.ir import stock_program
from specpilot.runtime.compiled_attention import CompiledGeneratedAttention
from specpilot.runtime.decoder import load_pair
from specpilot.runtime.fused_forward import FusedForward
from specpilot.runtime.model import compiles_layers

from hf_factory import FUSABLE, make_checkpoint

pytestmark = pytest.mark.skipif(not triton_interpreting(),
                                reason="checks the wiring with CPU models in Triton's interpreter")

# name → its per-op twin
TWINS = {"graphed_layers_attention": "graphed_attention",
         "graphed_refill_fused_layers_attention": "graphed_refill_fused_attention",
         "graphed_adaptive_refill_fused_layers_attention":
             "graphed_adaptive_refill_fused_attention",
         "graphed_adaptive_refill_fused_layers_attention_chain8":
             "graphed_adaptive_refill_fused_attention_chain8",
         "graphed_ar_layers_attention": "graphed_ar_attention"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layers-attention")
    target = make_checkpoint(folder, "llama3", name="target", seed=7, **FUSABLE)
    drafter = make_checkpoint(folder, "llama3", name="drafter", seed=8,
                              **dict(FUSABLE, num_hidden_layers=1))
    return target, drafter, stock_program(build_deployment(target, drafter, dtype="float32"))


def _systems(stock, pair):
    return {s.name.removeprefix("mech:"): s for s in mechanism_systems(stock, pair)}


def test_each_layers_system_is_its_per_op_twin_on_compiled_layers(checkpoints):
    target, drafter, stock = checkpoints
    # fast_path=True: the models the bench loads on a GPU (per op, projections fused)
    pair = load_pair(target, drafter, "float32", "cpu", fast_path=True)
    systems = _systems(stock, pair)
    pairs = {}
    for name, twin in TWINS.items():
        mine, other = systems[name], systems[twin]
        assert type(mine) is type(other), name
        p, q = mine.program, other.program
        assert (p.kernels.fast_path, q.kernels.fast_path) == ("layers", "ops"), name
        assert replace(p, kernels=replace(p.kernels, fast_path="ops"),
                       history=q.history) == q, name
        # off a GPU refused only as every graphed system is
        assert mine.unavailable(4).startswith("its rounds cannot be graphed here"), name
        model = mine.pair.target
        assert model is not pair.target and model.lm_head[0] is pair.target.lm_head[0], name
        assert compiles_layers(model.backend) and model.backend.attention_kernels == "generated"
        assert isinstance(model.backend.graph_ops._attention, CompiledGeneratedAttention)
        assert model._blocks is not None and model._blocks is not other.pair.target._blocks
        fused = p.kernels.drafter_kernels == "fused"
        if p.draft.speculates:
            inner = mine.pair.drafter.model if fused else mine.pair.drafter
            assert isinstance(mine.pair.drafter, FusedForward) == fused, name
            assert compiles_layers(inner.backend), name
            assert inner.backend.attention_kernels == "generated", name
        else:
            assert mine.pair.drafter is None, name
        pairs.setdefault((fused, p.draft.speculates), set()).add(id(mine.pair))
    # one pair of each kind: stock's drafter, the fused drafter, greedy AR's target alone
    assert {kind: len(ids) for kind, ids in pairs.items()} == {
        (False, True): 1, (True, True): 1, (False, False): 1}
    # the pair the bench loaded is untouched
    assert not compiles_layers(pair.target.backend)
    assert pair.target.backend.attention_kernels == "model"


def test_a_pair_loaded_off_the_fast_path_refuses_the_layers_systems(checkpoints):
    target, drafter, stock = checkpoints
    plain = load_pair(target, drafter, "float32", "cpu")        # the CPU's reference ops
    systems = _systems(stock, plain)
    for name in TWINS:
        why = systems[name].unavailable(4)
        assert "not a torch-backend model on the fast path" in why, (name, why)
