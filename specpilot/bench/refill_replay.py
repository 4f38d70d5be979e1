"""Replayed acceptance with continuous refill: the same requests and step costs as
`replay.replay`, but a slot whose request is done takes the next request from the queue at the
next step instead of idling until the batch's longest request is done.

Each request holds a slot for as many steps as it has rounds in the profile (speculation) or
decode tokens (plain AR); requests take the first free slot in queue order (the profile's
requests, cycled as `replay.replay` cycles them, so both replays decode the same tokens). Every
step of the batch costs the same as there: one graphed round of the profile's topology at batch
B, or the modelled step with the widest catch-up the topology allows, and one target(B, 1) step
for AR. Prefills are excluded, as in every replay: a refill's prefill is free here, which favours
refill over the padded loop by what the batch's prefills cost. Both AR and speculation are
replayed with refill, so the refill rows compare with each other as well as with the padded
ones.
"""
from __future__ import annotations

from specpilot.cost.refill_schedule import refill_steps

from .replay import (GRAPHED_ROUND_MODEL, AcceptanceProfile, ReplayFigure, cycled_queue,
                     spec_step_cost)

REFILL_MODEL = "continuous refill: a finished request's slot takes the next one at the next step"


def replay_refill(profile: AcceptanceProfile, costs, batch: int) -> ReplayFigure:
    """Replay `profile` at batch size `batch` with continuous refill, for speculation and for
    plain AR alike (see the module)."""
    order, decode = cycled_queue(profile, batch)
    spec_steps = refill_steps([len(profile.accepted_lengths[r]) for r in order], batch)
    ar_steps = refill_steps(decode, batch)
    # A modelled step is priced at the widest catch-up the topology allows (see the module).
    step_seconds, graphed = spec_step_cost(costs, batch, profile.topology)
    round_seconds = step_seconds(profile.topology.depth + 1)
    model = GRAPHED_ROUND_MODEL if graphed else "sum of step costs, widest catch-up"
    return ReplayFigure(batch, len(order), sum(decode), spec_steps, spec_steps * round_seconds,
                        ar_steps, ar_steps * costs.target(batch, 1), profile.mean_accepted,
                        step_model=f"{model}; {REFILL_MODEL}")
