"""The generated kernels that end a graphed chain round (a Program's `kernels.accept_kernels`
"fused"), by the plan node each is: the one place that says which specs they are, read by the
graphed decoders, which build them here (`round_end_kernels`, runtime/graphed_chain.py), and by
lowering, which lists them in the Program's kernel plan so that an export ships them.

  step.chain_commit        the round's end: acceptance, commit, who stops, the log (chain_commit;
                           logged by each row's own round counter with continuous refill)
  step.chain_commit_plain  a refilled batch's plain step (chain_commit, counters only)
  step.length_policy       adaptive lengths: the length's update after a round (length_policy;
                           the batch's makespan, or with refill the time per token)
  step.length_admit        adaptive lengths with refill: a newcomer's estimates (length_admit)
  step.row_start           continuous refill: a newcomer's row started after its prefill
                           (row_start: first token, output, log, counters, who runs)
"""
from __future__ import annotations

from typing import Dict

from specpilot.ir.errors import SpecPilotError

from .kernel_spec import KernelSpec, kernel_spec

COMMIT_NODE = "step.chain_commit"
PLAIN_COMMIT_NODE = "step.chain_commit_plain"
POLICY_NODE = "step.length_policy"
ADMIT_NODE = "step.length_admit"
ROW_START_NODE = "step.row_start"


def round_end_specs(refill: bool, adaptive: bool, estimator: str = "geometric",
                    turn_off: bool = True) -> Dict[str, KernelSpec]:
    """{plan node: kernel spec} of a graphed chain round's fused end: with continuous `refill`
    or drained batches, fixed or `adaptive` lengths (by `estimator`, turning speculation off
    where `turn_off`)."""
    specs = {COMMIT_NODE: kernel_spec("chain_commit", LOG="row" if refill else "round")}
    if refill:
        specs[PLAIN_COMMIT_NODE] = kernel_spec("chain_commit", LOG="row_plain")
        specs[ROW_START_NODE] = kernel_spec("row_start")
    if adaptive:
        specs[POLICY_NODE] = kernel_spec("length_policy", ESTIMATOR=estimator,
                                         OBJECTIVE="throughput" if refill else "makespan",
                                         TURN_OFF=turn_off)
        if refill:
            specs[ADMIT_NODE] = kernel_spec("length_admit", ESTIMATOR=estimator)
    return specs


def round_end_kernels(device, refill: bool, adaptive: bool, estimator: str = "geometric",
                      turn_off: bool = True) -> Dict[str, object]:
    """{plan node: built kernel module} of `round_end_specs`, for rounds on `device`; a
    SpecPilotError where Triton cannot run there."""
    from .cache import KernelCache, build_triton_module, triton_refusal

    why = triton_refusal(device)
    if why is not None:
        raise SpecPilotError(f"the fused round end cannot run: {why}")
    cache = KernelCache()
    return {node: build_triton_module(spec, cache)
            for node, spec in round_end_specs(refill, adaptive, estimator, turn_off).items()}
