"""Agents and speculation off: the batching agent offers SetDrafter("none") to a Program that
speculates, at any batch size (ranked by the cost model, never left out by the budget), and
SetDrafter("model") back to a Program that does not speculate; every agent's proposals on such
a Program are legal and runnable, and what does not apply to it is refused with the reason."""
import pytest

from specpilot.agents import BatchingAgent, Budget, default_agents
from specpilot.cost import AssumedAcceptance, CostModel, RankProfile, gpu_spec
from specpilot.ir import SetBatchLayout, SetDrafter, SetMaxBatchSize, SetRefill, apply

from hf_factory import make_pair
from test_agents import assert_runnable, cost_model, programs, ranks_with_branching
from test_search_support import one_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("pair"), "llama3")


def without_drafter(pair):
    p = programs(pair)
    return {"cpu": apply(p["cpu"], SetDrafter("none")),
            "batched": apply(p["batched"], SetDrafter("none")),
            "tree": apply(apply(p["tree"], SetMaxBatchSize(8)), SetDrafter("none"))}


@pytest.mark.parametrize("name", ["cpu", "batched", "tree"])
def test_every_agents_proposals_on_a_program_without_drafter_are_legal(pair, name):
    program = without_drafter(pair)[name]
    acceptance = ranks_with_branching()
    model = cost_model(program)
    report = model.report(program, acceptance)
    proposals = []
    for agent in default_agents(model, acceptance):
        made = agent.propose(program, report, None, Budget(8))
        assert_runnable(program, made)
        proposals += made
        for refusal in agent.refusals:
            assert refusal.reason
    # the way back is always offered; nothing that only shapes a draft is
    assert SetDrafter("model") in proposals
    assert not any(type(t).__name__ in ("SetTopology", "SetDraftLength", "SetVerifyPrune",
                                        "SetDraftLengthPolicy") for t in proposals)


def test_speculation_off_is_offered_to_a_batch_and_ranked_by_the_cost_model(pair):
    p = programs(pair)
    model = CostModel(gpu_spec("h200"))
    agent = BatchingAgent(model, AssumedAcceptance(0.0))   # a drafter that is never right
    # batch 1: no batch layout or refill to change, but speculation off is still offered
    assert agent.propose(p["gpu"], None, None, Budget(8)) == [SetDrafter("none")]
    proposals = agent.propose(p["batched"], None, None, Budget(8))
    assert_runnable(p["batched"], proposals)
    # drafting that never pays: greedy AR is predicted fastest and ranks first
    assert proposals[0] == SetDrafter("none")
    off = apply(p["batched"], SetDrafter("none"))
    never = AssumedAcceptance(0.0)
    assert (model.predicted_tokens_per_s(off, never)
            > model.predicted_tokens_per_s(p["batched"], never))


def test_speculation_off_keeps_a_slot_when_predicted_to_lose(pair):
    p = programs(pair)
    ranks = [[0] * 30, [0] * 25]                       # a drafter that is always right
    acceptance = RankProfile(ranks, [len(r) + 1 for r in ranks])
    model = CostModel(gpu_spec("h200"))
    off = apply(p["batched"], SetDrafter("none"))
    assert (model.predicted_tokens_per_s(off, acceptance)
            < model.predicted_tokens_per_s(p["batched"], acceptance))
    agent = BatchingAgent(model, acceptance)
    # offered at batch 1 too, although predicted to lose there: measurement decides
    assert agent.propose(p["gpu"], None, None, Budget(8)) == [SetDrafter("none")]
    everything = agent.propose(p["batched"], None, None, Budget(20))
    assert everything[-1] == SetDrafter("none")        # ranked last ...
    two = BatchingAgent(model, acceptance).propose(p["batched"], None, None, Budget(2))
    assert two == [everything[0], SetDrafter("none")]  # ... but never cut by the budget


def test_a_program_without_drafter_is_offered_the_drafter_back_and_refill(pair):
    off = without_drafter(pair)["batched"]
    agent = BatchingAgent(CostModel(gpu_spec("h200")), ranks_with_branching())
    offered = agent.propose(off, None, None, Budget(8))
    # greedy AR may refill its slots (its own decoder); nothing that shapes drafts applies
    assert sorted(map(str, offered)) == sorted(map(str, [SetDrafter("model"),
                                                         SetRefill("continuous")]))
    refused = {r.proposal: r.reason for r in agent.refusals}
    assert "padded batches" in refused[str(SetBatchLayout("ragged"))]
    refilled = apply(off, SetRefill("continuous"))
    assert str(SetRefill("drain")) in map(str, agent.propose(refilled, None, None, Budget(8)))
