"""Agents: one per direction, each proposing Transformation records for a Program.

    base.py          Agent, Budget, Refusal, the legality filter, ranking by the cost model
    weight_format.py WeightFormatAgent   smaller lossless weight formats
    topology.py      TopologyAgent       chain length and static tree shape
    kernels.py       KernelAgent         generated kernels, graph capture, tile tuning (GPU)
    batching.py      BatchingAgent       batch layout and draft-length policy
    llm.py           LLMAgent            an OpenAI-compatible endpoint (untrusted answers)
"""
from .base import Agent, Budget, ProposalSet, Refusal, rank_by_prediction, refusal
from .batching import BatchingAgent
from .kernels import KernelAgent
from .llm import LLMAgent, LLMAgentError, parse_answer
from .topology import TopologyAgent
from .weight_format import WeightFormatAgent


def default_agents(cost_model, acceptance, llm: "LLMAgent" = None) -> list:
    """The built-in agents of a round (and the LLM agent when one is configured)."""
    agents = [WeightFormatAgent(cost_model, acceptance), TopologyAgent(cost_model, acceptance),
              KernelAgent(), BatchingAgent(cost_model, acceptance)]
    return agents + ([llm] if llm is not None else [])


__all__ = ["Agent", "Budget", "ProposalSet", "Refusal", "rank_by_prediction", "refusal",
           "BatchingAgent", "KernelAgent", "LLMAgent", "LLMAgentError", "parse_answer",
           "TopologyAgent", "WeightFormatAgent", "default_agents"]
