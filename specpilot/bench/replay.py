"""Replayed acceptance: tokens/s of a speculative decoder at a scale where acceptance cannot be
measured (random-weight shape presets), from an acceptance profile measured on a real pair and
step costs measured on the presets.

An acceptance profile (JSON, written by the pair bench from `SpecResult.accepted_lengths`):

    {"format": "specpilot-acceptance-profile", "version": 1,
     "topology": {"kind": "chain", "k": 4},            # ir.topology JSON
     "accepted_lengths": [[3, 4, 0, ...], ...],       # per request, per step: drafts accepted
     "new_tokens": [256, 87, ...],                    # per request: generated tokens, EOS included
     "source": {...}}                                 # free-form provenance

Replay model (steady-state decode; both models' prefills are excluded, for AR as for
speculation). Requests are cycled to fill batches of B that run in lock step, as the padded
batched loop does; a batch lasts until its longest request is done. One speculative step of a
batch costs

    drafter(B, catch-up width) + sum over tree levels but the last of drafter(B, level width)
    + verify(B, topology) + accept(B, topology)

where the catch-up width is the largest (accepted + 1) of the previous step over the rows still
active (1 on the first step; finished rows pad with 1), or the fixed width `replay(catch_up=)`
asks for (the graphed rounds feed 2). Where the costs hold a measured graphed
round of the profile's topology at this batch size (the graphed runtime: drafting, verification,
acceptance, compaction and commit in one CUDA graph), one step costs that round instead, and
the figure says so. Plain AR decodes each request's new_tokens - 1 tokens
after its prefill, one target(B, 1) step per token of the batch's longest request. Every figure
computed here is labelled "replayed acceptance".
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from specpilot.ir.errors import IRError, SpecPilotError
from specpilot.ir.topology import DynamicTree, Topology, topology_from_json
from specpilot.runtime.tree_plan import TreePlan

PROFILE_FORMAT = "specpilot-acceptance-profile"
PROFILE_VERSION = 1
REPLAYED = "replayed acceptance"
GRAPHED_ROUND_MODEL = "graphed round (one CUDA graph per round)"
SUMMED_STEPS_MODEL = "sum of step costs"
NO_DECODE_STEPS = ("the acceptance profile has no decode steps (every request ended at its "
                   "prefill): measure it with more new tokens")


class ProfileError(SpecPilotError):
    """An acceptance profile file that is missing or malformed."""


class MissingStepCost(SpecPilotError):
    """A replay needs a step cost that was not measured."""


def acceptance_suffix(system: str, batch: Optional[int] = None) -> str:
    """The suffix of the acceptance profile of `system` that `specpilot bench` writes beside
    its result `<name>.json`: the widest batch's, or with `batch` that batch's own (written
    where the run measured more than one)."""
    return (f".acceptance.{system.replace(':', '-')}"
            + ("" if batch is None else f".b{batch}") + ".json")


@dataclass(frozen=True)
class AcceptanceProfile:
    topology: Topology
    accepted_lengths: List[List[int]]
    new_tokens: List[int]
    source: Dict = field(default_factory=dict)

    @property
    def mean_accepted(self) -> float:
        """Mean over (step, request) of tokens committed per target forward (accepted + 1)."""
        steps = [a + 1 for row in self.accepted_lengths for a in row]
        return sum(steps) / len(steps) if steps else 0.0

    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION,
                "topology": self.topology.to_json(),
                "accepted_lengths": [list(r) for r in self.accepted_lengths],
                "new_tokens": list(self.new_tokens), "source": dict(self.source)}

    @classmethod
    def from_json(cls, obj, where: str = "acceptance profile") -> "AcceptanceProfile":
        """Validate and read a profile object; errors name the file and the field."""
        def fail(msg):
            raise ProfileError(f"{where}: {msg}")

        if not isinstance(obj, dict) or obj.get("format") != PROFILE_FORMAT:
            fail(f"not an acceptance profile (expected \"format\": \"{PROFILE_FORMAT}\"); "
                 f"write one with `specpilot bench --pair DIR`")
        if obj.get("version") != PROFILE_VERSION:
            fail(f"version {obj.get('version')!r} is not supported (expected {PROFILE_VERSION})")
        try:
            topology = topology_from_json(obj.get("topology"))
        except IRError as exc:
            fail(f"topology: {exc}")
        depth = topology.depth           # the most drafts one step can accept
        lengths, tokens = obj.get("accepted_lengths"), obj.get("new_tokens")
        if (not isinstance(lengths, list) or not lengths
                or not all(isinstance(r, list) for r in lengths)):
            fail("accepted_lengths must be a non-empty list (one list per request)")
        if not isinstance(tokens, list) or len(tokens) != len(lengths):
            fail(f"new_tokens must list one count per request ({len(lengths)})")
        for r, (row, n) in enumerate(zip(lengths, tokens)):
            if not all(_is_int(a) and 0 <= a <= depth for a in row):
                fail(f"accepted_lengths[{r}] must hold integers in 0..{depth} "
                     f"(the depth of {topology})")
            if not _is_int(n) or n < 1:
                fail(f"new_tokens[{r}] must be a positive integer, got {n!r}")
            if sum(a + 1 for a in row) < n - 1:
                fail(f"request {r}: {len(row)} steps commit at most {sum(a + 1 for a in row)} "
                     f"tokens after the prefill, fewer than new_tokens - 1 = {n - 1}")
        source = obj.get("source", {})
        if not isinstance(source, dict):
            fail("source must be an object")
        return cls(topology, [list(r) for r in lengths], list(tokens), source)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "AcceptanceProfile":
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except FileNotFoundError:
            raise ProfileError(f"acceptance profile {path!r} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProfileError(f"cannot read acceptance profile {path!r}: {exc}") from None
        return cls.from_json(obj, path)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class ReplayFigure:
    """Replayed tokens/s of speculation vs plain AR on one batch size (seconds are modelled)."""
    batch_size: int
    requests: int
    tokens: int              # decode tokens (each request's new_tokens - 1)
    spec_steps: int          # batched speculative steps
    spec_seconds: float
    ar_steps: int            # batched AR steps
    ar_seconds: float
    mean_accepted: float
    label: str = REPLAYED
    step_model: str = SUMMED_STEPS_MODEL

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.spec_seconds if self.spec_seconds > 0 else math.inf

    @property
    def ar_tokens_per_s(self) -> float:
        return self.tokens / self.ar_seconds if self.ar_seconds > 0 else math.inf

    @property
    def speedup(self) -> float:
        return self.ar_seconds / self.spec_seconds if self.spec_seconds > 0 else math.inf

    def to_json(self) -> dict:
        return {"label": self.label, "batch_size": self.batch_size, "requests": self.requests,
                "tokens": self.tokens, "spec_steps": self.spec_steps,
                "spec_seconds": self.spec_seconds, "ar_steps": self.ar_steps,
                "ar_seconds": self.ar_seconds, "tokens_per_s": self.tokens_per_s,
                "ar_tokens_per_s": self.ar_tokens_per_s, "speedup_vs_ar": self.speedup,
                "mean_accepted": self.mean_accepted, "step_model": self.step_model}


def spec_step_seconds(costs, batch: int, topology: Topology, plan: TreePlan,
                      catch_up_width: int) -> float:
    """Modelled seconds of one speculative step of a batch (see the module docstring)."""
    drafting = sum(costs.drafter(batch, len(level)) for level in plan.levels[:-1])
    return (costs.drafter(batch, catch_up_width) + drafting + costs.verify(batch, topology)
            + costs.accept(batch, topology))


def spec_step_cost(costs, batch: int,
                   topology: Topology) -> Tuple[Callable[[int], float], bool]:
    """(seconds of one speculative step of a batch as a function of its catch-up width, whether
    that is a measured graphed round): the graphed round of `topology` at `batch` where `costs`
    hold one (the same whatever the width), else `spec_step_seconds`. A dynamic tree has no
    modelled step: without its graphed round it is refused (MissingStepCost)."""
    if getattr(costs, "has_round", None) and costs.has_round(batch, topology):
        seconds = costs.round(batch, topology)
        return (lambda catch_up_width: seconds), True
    if isinstance(topology, DynamicTree):
        raise MissingStepCost(f"{topology} is replayed from a measured graphed round only (its "
                              f"shape changes every step): measure at batch {batch} on a GPU")
    plan = TreePlan.build(topology)
    return (lambda catch_up_width: spec_step_seconds(costs, batch, topology, plan,
                                                     catch_up_width)), False


def cycled_batches(count: int, batch: int) -> List[List[int]]:
    """The requests 0..count-1 of a profile, cycled to fill whole batches of `batch`: the
    request indices of each batch in turn."""
    if batch < 1:
        raise SpecPilotError(f"batch size must be at least 1, got {batch}")
    padded = math.ceil(count / batch) * batch
    order = [i % count for i in range(padded)]
    return [order[start:start + batch] for start in range(0, padded, batch)]


def cycled_queue(profile: AcceptanceProfile, batch: int) -> Tuple[List[int], List[int]]:
    """(the profile's requests cycled to whole batches of `batch` as `cycled_batches` fills
    them, in one queue; each one's decode tokens, new_tokens - 1), for the replays that fill
    slots from a queue; ProfileError where no request decodes a token."""
    order = [r for rows in cycled_batches(len(profile.accepted_lengths), batch) for r in rows]
    decode = [profile.new_tokens[r] - 1 for r in order]
    if sum(decode) == 0:
        raise ProfileError(NO_DECODE_STEPS)
    return order, decode


def replay(profile: AcceptanceProfile, costs, batch: int,
           catch_up: Optional[int] = None) -> ReplayFigure:
    """Replay `profile` at batch size `batch` with `costs` (a StepCosts or anything with
    target/drafter/verify/accept(batch, ...) -> seconds). `catch_up` prices every step's
    drafter catch-up at that width instead of the eager loop's (the graphed rounds feed the
    drafter a fixed 2 tokens, the previous and the last, whatever was accepted)."""
    batches = cycled_batches(len(profile.accepted_lengths), batch)
    ar_step = costs.target(batch, 1)
    step_seconds, graphed = spec_step_cost(costs, batch, profile.topology)
    tokens = spec_steps = ar_steps = 0
    spec_seconds = 0.0
    for rows in batches:
        seqs = [profile.accepted_lengths[r] for r in rows]
        widths = [1] * batch
        for s in range(max(len(q) for q in seqs)):
            spec_seconds += step_seconds(catch_up if catch_up is not None else max(widths))
            # A row still active next step re-feeds what it committed; a finished row pads with 1.
            widths = [q[s] + 1 if s + 1 < len(q) else 1 for q in seqs]
            spec_steps += 1
        decode = [profile.new_tokens[r] - 1 for r in rows]
        tokens += sum(decode)
        ar_steps += max(decode)
    if tokens == 0 or spec_steps == 0:
        raise ProfileError(NO_DECODE_STEPS)
    return ReplayFigure(batch, len(batches) * batch, tokens, spec_steps, spec_seconds, ar_steps,
                        ar_steps * ar_step, profile.mean_accepted,
                        step_model=GRAPHED_ROUND_MODEL if graphed else SUMMED_STEPS_MODEL)
