"""The replayed-acceptance bench: step costs of two shape presets on this device, then tokens/s
of AR and of the profile's topology replayed from a measured acceptance profile.

In order: read the profile → build the target preset on the device → target steps (T = 1..max
width and the verification width), tree verification, accept/commit → release it → build the
drafter preset → drafter steps (catch-up and tree-level widths) → replay at every batch size →
one result document, every figure labelled "replayed acceptance".
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain, DynamicTree, Tree
from specpilot.runtime.tree_plan import TreePlan

from .adaptive_refill_replay import replay_adaptive_refill
from .adaptive_replay import READINGS, replay_adaptive
from .refill_replay import replay_refill
from .replay import REPLAYED, AcceptanceProfile, replay
from .shapes import build_preset, parse_shapes
from .step_costs import (StepCosts, measure_accept, measure_forwards, measure_round,
                         measure_tree_verify, not_a_result, read_step_costs)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
REPLAY_MODEL = ("steady-state decode, prefills excluded; one speculative step = drafter catch-up "
                "+ drafter tree levels + target verification + accept/commit, each at its "
                "measured cost (forwards CUDA-graphed on a GPU), or, on a GPU, one measured "
                "graphed round of the profile's topology (chain, static or dynamic tree: all of "
                "that in one CUDA graph); host work of the "
                "decode loop beyond that is not counted; AR = one graphed target step per token")


@dataclass
class ShapesBenchSettings:
    shapes: str                      # "TARGET:DRAFTER"
    acceptance: str                  # profile path
    batch_sizes: Sequence[int] = (1, 4, 16, 64)
    scale: float = 1.0
    context: int = 512
    max_width: int = 16              # target widths 1..max_width are measured
    trees: Sequence[Tree] = ()       # more trees whose verification and accept are measured
    adaptive: bool = False           # also replay the batch-length rule (chain profiles, GPU)
    refill: bool = False             # also replay AR and speculation with continuous refill
    warmup: int = 3
    repeats: int = 10
    device: Optional[str] = None
    dtype: Optional[str] = None
    name: Optional[str] = None
    step_costs: Optional[str] = None  # an earlier shapes result whose step costs are replayed


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_step_costs(settings: ShapesBenchSettings, profile: AcceptanceProfile, device: str,
                       dtype: torch.dtype, progress: Callable[[str], None]) -> StepCosts:
    """Every step cost the replay of `profile` needs (and target widths 1..max_width)."""
    target_preset, drafter_preset = parse_shapes(settings.shapes)
    for preset in (target_preset, drafter_preset):
        preset.config(settings.scale)  # refuse a bad scale before any measurement
    topology = profile.topology
    dev = torch.device(device)
    graphed = dev.type == "cuda"
    if settings.adaptive and not (graphed and isinstance(topology, Chain)):
        raise SpecPilotError("--adaptive replays the graphed batch-length rule: it needs a chain "
                             f"profile (this one is {topology}) and a CUDA GPU, whose graphed "
                             "rounds of every length price the rule")
    costs = StepCosts(settings.context, graphed)
    # Target verification is root + every node of the step's tree (a dynamic tree: its budget).
    target_widths = set(range(1, settings.max_width + 1)) | {topology.num_nodes + 1}
    if isinstance(topology, DynamicTree):
        if not graphed:
            raise SpecPilotError(f"{topology} is replayed from a graphed round, which needs a "
                                 f"CUDA GPU")
        # Its shape changes every step: only the whole graphed round has a fixed cost.
        trees, shaped = list(settings.trees), []
        drafter_widths = {1, 2, topology.width}
    else:
        plan = TreePlan.build(topology)
        trees = list(dict.fromkeys(([] if isinstance(topology, Chain) else [topology])
                                   + list(settings.trees)))
        shaped = [topology]
        drafter_widths = set(range(1, plan.shape.max_depth + 2)) | {len(l) for l in plan.levels}

    progress(f"[bench] building {target_preset.name} (scale {settings.scale}) on {device}")
    target = build_preset(target_preset.name, device, dtype, settings.scale, seed=1)
    for b in settings.batch_sizes:
        progress(f"[bench] target steps at batch {b}")
        costs.target_costs[b] = measure_forwards(target, b, target_widths, settings.context,
                                                 graphed, settings.warmup, settings.repeats)
        for tree in trees:
            costs.tree_costs.setdefault(str(tree), {})[b] = measure_tree_verify(
                target, b, tree, settings.context, graphed, settings.warmup, settings.repeats)
        for shape in dict.fromkeys([*shaped, *trees]):
            costs.accept_costs.setdefault(str(shape), {})[b] = measure_accept(
                target, b, shape, settings.context, settings.warmup, settings.repeats)
    _release(dev)

    progress(f"[bench] building {drafter_preset.name} (scale {settings.scale}) on {device}")
    drafter = build_preset(drafter_preset.name, device, dtype, settings.scale, seed=2)
    for b in settings.batch_sizes:
        progress(f"[bench] drafter steps at batch {b}")
        costs.drafter_costs[b] = measure_forwards(drafter, b, drafter_widths, settings.context,
                                                  graphed, settings.warmup, settings.repeats)
    if graphed:
        # The graphed runtime's whole round (both models resident, as when decoding).
        # The adaptive rule runs rounds of every chain length up to the profile's.
        rounds = ([Chain(n) for n in range(1, topology.k + 1)] if settings.adaptive
                  else [topology])
        for b in settings.batch_sizes:
            for shape in rounds:
                progress(f"[bench] graphed {shape} round at batch {b}")
                costs.round_costs.setdefault(str(shape), {})[b] = measure_round(
                    target, drafter, b, shape, settings.context, graphed, settings.warmup,
                    settings.repeats)
                _release(dev)
    del target, drafter
    _release(dev)
    return costs


def load_step_costs(settings: ShapesBenchSettings) -> tuple:
    """(the step costs, where they were measured: device, dtype, scale, context, environment)
    of an earlier `specpilot bench --shapes` result (its JSON), for replaying another profile or
    rule on them without a GPU; refused when its shapes differ."""
    path = settings.step_costs
    costs, doc = read_step_costs(path)
    try:
        measured_shapes = doc["settings"]["shapes"]
        source = {key: doc["settings"][key] for key in ("device", "dtype", "scale", "context")}
        source["environment"] = doc["environment"]
    except (KeyError, TypeError) as exc:
        raise not_a_result(path, exc) from None
    if measured_shapes != settings.shapes:
        raise SpecPilotError(f"{path} holds step costs of {measured_shapes}, not "
                             f"{settings.shapes}: pass the same --shapes")
    if settings.adaptive and not costs.graphed:
        raise SpecPilotError(f"--adaptive replays graphed rounds, and {path} measured eager "
                             f"steps: measure the step costs on a CUDA GPU")
    return costs, source


def replay_rows(profile: AcceptanceProfile, costs: StepCosts, batch_sizes,
                adaptive: bool = False, refill: bool = False) -> tuple:
    """(rows for tables/plots, replay figures as JSON), all labelled replayed acceptance; with
    `adaptive`, rows of the batch-length rule too, pessimistic and optimistic about the
    drafts the profile does not show (specpilot/bench/adaptive_replay.py), and pessimistic
    after a warm-up pass over the whole profile; with `refill`, rows
    of AR and of the topology with continuous refill (specpilot/bench/refill_replay.py), their
    × AR against the padded AR row; with both, rows of the two combined
    (specpilot/bench/adaptive_refill_replay.py), also against the padded AR row."""
    ar_name = "ar (graphed steps)" if costs.graphed else "ar (eager steps)"
    spec_name = f"spec {profile.topology}"
    rows, figures = [], []
    for b in batch_sizes:
        fig = replay(profile, costs, b)
        figures.append(fig.to_json())
        systems = [(ar_name, fig.ar_tokens_per_s, fig.ar_steps, 1.0, None),
                   (spec_name, fig.tokens_per_s, fig.spec_steps, fig.speedup, fig.mean_accepted)]
        if adaptive:
            for bound, unknown_agrees in READINGS.items():
                rule = replay_adaptive(profile, costs, b, unknown_agrees=unknown_agrees)
                figures.append(dict(rule.to_json(), system=f"adaptive lengths, {bound}"))
                systems.append((f"spec {profile.topology}, adaptive lengths, {bound}",
                                rule.tokens_per_s, rule.spec_steps, rule.speedup,
                                rule.mean_accepted))
            # Timed after a warm-up on the whole workload, as `specpilot bench` times a system:
            # a batch may start off by what the decoder remembers (runtime/workload_memory.py).
            warm = replay_adaptive(profile, costs, b, warm=True)
            figures.append(dict(warm.to_json(), system="adaptive lengths, warm, pessimistic"))
            systems.append((f"spec {profile.topology}, adaptive lengths, warm, pessimistic",
                            warm.tokens_per_s, warm.spec_steps, warm.speedup,
                            warm.mean_accepted))
        if refill:
            kept = replay_refill(profile, costs, b)
            figures.append(dict(kept.to_json(), system="continuous refill"))
            systems += [(f"{ar_name}, refill", kept.ar_tokens_per_s, kept.ar_steps,
                         fig.ar_seconds / kept.ar_seconds, None),
                        (f"{spec_name}, refill", kept.tokens_per_s, kept.spec_steps,
                         fig.ar_seconds / kept.spec_seconds, kept.mean_accepted)]
        if adaptive and refill:
            for bound, unknown_agrees in READINGS.items():
                both = replay_adaptive_refill(profile, costs, b, unknown_agrees=unknown_agrees)
                figures.append(dict(both.to_json(), system=f"adaptive lengths, refill, {bound}"))
                systems.append((f"{spec_name}, adaptive lengths, refill, {bound}",
                                both.tokens_per_s, both.spec_steps,
                                fig.ar_seconds / both.spec_seconds, both.mean_accepted))
        for system, rate, steps, speedup, accepted in systems:
            rows.append({"system": system, "batch_size": b, "status": "measured",
                         "label": REPLAYED, "steps": steps, "requests": fig.requests,
                         "tokens": fig.tokens, "speedup_vs_ar": speedup,
                         "mean_accepted": accepted,
                         "tokens_per_s": {"median": rate, "min": rate, "max": rate}})
    return rows, figures


def run_shapes_bench(settings: ShapesBenchSettings, progress: Callable[[str], None],
                     environment: dict) -> dict:
    """Measure step costs (or read them: `settings.step_costs`), replay the profile, and return
    the result document."""
    profile = AcceptanceProfile.load(settings.acceptance)
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = settings.dtype or ("bfloat16" if device == "cuda" else "float32")
    if settings.step_costs:
        costs, measured = load_step_costs(settings)
        progress(f"[bench] step costs from {settings.step_costs} (measured there, not here)")
        # The figures are the measuring machine's: its device, dtype and environment head the
        # result, and this machine is recorded as where the replay ran.
        device, dtype = measured["device"], measured["dtype"]
        settings = replace(settings, scale=measured["scale"], context=measured["context"])
        environment = dict(measured["environment"], replayed_on=environment)
    else:
        costs = measure_step_costs(settings, profile, device, DTYPES[dtype], progress)
    rows, figures = replay_rows(profile, costs, settings.batch_sizes, settings.adaptive,
                                settings.refill)
    target, drafter = parse_shapes(settings.shapes)
    return {
        "kind": REPLAYED, "label": REPLAYED,
        "name": settings.name or f"{target.name}_{drafter.name}-replayed",
        "environment": environment,
        "settings": {"shapes": settings.shapes, "scale": settings.scale, "dtype": dtype,
                     "device": device, "context": settings.context,
                     "batch_sizes": list(settings.batch_sizes), "warmup": settings.warmup,
                     "repeats": settings.repeats, "profile": settings.acceptance,
                     "topology": str(profile.topology),
                     "verify_width": profile.topology.num_nodes + 1,
                     "trees": [str(t) for t in settings.trees],
                     "adaptive": settings.adaptive, "refill": settings.refill,
                     "step_costs_from": settings.step_costs,
                     "profile_requests": len(profile.accepted_lengths),
                     "profile_mean_accepted": profile.mean_accepted,
                     "profile_source": profile.source},
        "replay_model": REPLAY_MODEL,
        "step_costs": costs.to_json(),
        "replay": figures,
        "rows": rows,
    }
