"""Acceptance models: how many drafted tokens a topology gets accepted per step.

The measured model is a **rank profile**: for every generated token of the reference (the stock
decoder's greedy output) after the first, the rank of that token in the drafter's distribution
when the drafter reads the reference prefix (0 = the drafter's top-1). Greedy acceptance walks a
static tree from the root, descending into the child whose token is the target's next token;
on the accepted path every prefix is the reference's, so the child exists exactly when some
child's rank equals the reference token's rank there. The accepted lengths of *any* static tree
or chain therefore follow from one teacher-forced drafter pass over the reference, replayed step
by step (`simulate`), and the per-depth acceptance and per-rank rates fall out of it.

Two weaker models stand in where no ranks were measured: `ChainProfileAcceptance` reads the
per-depth acceptance of a measured chain profile (bench/replay.py), and `AssumedAcceptance` a
fixed per-depth rate; both are labelled as such and credit branching with nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain, TreeShape

RANK_PROFILE_FORMAT = "specpilot-rank-profile"
RANK_PROFILE_VERSION = 1
# Ranks at or past this are stored as MAX_RANK ("not among the drafter's top MAX_RANK"); no
# static tree here branches wider.
MAX_RANK = 16


class AcceptanceError(SpecPilotError):
    """A malformed acceptance profile or a topology the model cannot replay."""


def topology_shape(topology) -> TreeShape:
    """The static TreeShape of a topology; AcceptanceError for one that has none."""
    if isinstance(topology, TreeShape):
        return topology
    shape = getattr(topology, "shape", None)
    if shape is None:
        raise AcceptanceError(f"topology {topology} has no static tree shape")
    return shape()


def topology_depth(topology) -> int:
    """Draft depth of any topology (its number of drafted levels)."""
    if isinstance(topology, TreeShape):
        return topology.max_depth
    return len(topology.level_widths())


def is_dynamic(topology) -> bool:
    return not isinstance(topology, TreeShape) and getattr(topology, "shape", None) is None


def _children_by_rank(shape: TreeShape) -> List[Dict[int, int]]:
    out: List[Dict[int, int]] = [dict() for _ in range(shape.num_nodes + 1)]
    for node, (parent, rank) in enumerate(zip(shape.parents, shape.ranks)):
        out[parent + 1][rank] = node
    return out


def walk_accepted(children: List[Dict[int, int]], ranks: Sequence[int], start: int) -> int:
    """Drafts greedy acceptance takes at one step whose next reference token is ranks[start]."""
    node, accepted = -1, 0
    while start + accepted < len(ranks):
        child = children[node + 1].get(ranks[start + accepted])
        if child is None:
            break
        node, accepted = child, accepted + 1
    return accepted


def per_depth_from_lengths(lengths: Sequence[Sequence[int]], depth: int) -> List[float]:
    """a_d = P(accepted >= d | accepted >= d-1) over every step, d = 1..depth (1.0 where no step
    reached d-1)."""
    flat = [a for row in lengths for a in row]
    out = []
    for d in range(1, depth + 1):
        reached = sum(1 for a in flat if a >= d - 1)
        out.append(sum(1 for a in flat if a >= d) / reached if reached else 1.0)
    return out


@dataclass(frozen=True)
class RankProfile:
    """ranks[r][j]: rank of generated token j+1 of request r under the drafter (see the module
    docstring); new_tokens[r]: the reference's generated tokens (len(ranks[r]) + 1)."""
    ranks: List[List[int]]
    new_tokens: List[int]
    source: Dict = field(default_factory=dict)
    label: str = "measured drafter ranks"

    def __post_init__(self):
        # Replays are asked for the same topologies again and again while a search ranks them.
        object.__setattr__(self, "_replays", {})

    def static_equivalent(self, topology) -> TreeShape:
        """The tree whose acceptance stands for `topology`'s: its own shape when static; for a
        dynamic tree (which picks its nodes every step from the drafter's confidence) the best
        static tree of its budget, depth and width for these ranks (runtime/sequoia.py), an
        estimate the measurement of the candidate replaces."""
        if not is_dynamic(topology):
            return topology_shape(topology)
        from specpilot.ir.topology import SparseTree
        from specpilot.runtime.sequoia import RankTrace, optimal_trees, profile_from_trace

        depth = topology_depth(topology)
        width = max(topology.level_widths())
        profile = profile_from_trace(RankTrace(tuple(tuple(r) for r in self.ranks)), depth, width)
        _, paths = optimal_trees(profile, topology.num_nodes, depth)[topology.num_nodes]
        if not paths:
            paths = ((0,),)
        return SparseTree(tuple(paths)).shape()

    def simulate(self, topology) -> List[List[int]]:
        """Accepted drafts per step per request, as speculative_generate takes them with
        greedy acceptance over `topology` (drafts past the reference's end count as rejected;
        a dynamic tree is replayed as `static_equivalent`)."""
        if topology in self._replays:
            return [list(row) for row in self._replays[topology]]
        children = _children_by_rank(self.static_equivalent(topology))
        out = []
        for ranks in self.ranks:
            steps, i = [], 0
            while i < len(ranks):
                a = walk_accepted(children, ranks, i)
                steps.append(a)
                i += a + 1
            out.append(steps)
        self._replays[topology] = tuple(tuple(row) for row in out)
        return out

    def accepted_lengths(self, topology) -> Optional[List[List[int]]]:
        return self.simulate(topology)

    def mean_accepted(self, topology) -> float:
        """Mean drafts accepted per step (the bonus token not counted)."""
        flat = [a for row in self.simulate(topology) for a in row]
        return sum(flat) / len(flat) if flat else 0.0

    def per_depth_acceptance(self, depth: int) -> List[float]:
        """Per-depth acceptance of chain(depth) (see per_depth_from_lengths)."""
        return per_depth_from_lengths(self.simulate(Chain(depth)), depth)

    def rank_rates(self, count: int = 4) -> List[float]:
        """Fraction of positions whose reference token is the drafter's rank r, r < count."""
        flat = [r for row in self.ranks for r in row]
        return [sum(1 for x in flat if x == r) / len(flat) if flat else 0.0 for r in range(count)]

    def to_json(self) -> dict:
        return {"format": RANK_PROFILE_FORMAT, "version": RANK_PROFILE_VERSION,
                "max_rank": MAX_RANK, "ranks": [list(r) for r in self.ranks],
                "new_tokens": list(self.new_tokens), "source": dict(self.source)}

    @classmethod
    def from_json(cls, obj, where: str = "rank profile") -> "RankProfile":
        if not isinstance(obj, dict) or obj.get("format") != RANK_PROFILE_FORMAT:
            raise AcceptanceError(f"{where}: not a rank profile (\"format\": "
                                  f"\"{RANK_PROFILE_FORMAT}\")")
        if obj.get("version") != RANK_PROFILE_VERSION:
            raise AcceptanceError(f"{where}: unsupported version {obj.get('version')!r}")
        ranks, tokens = obj.get("ranks"), obj.get("new_tokens")
        if (not isinstance(ranks, list) or not isinstance(tokens, list)
                or len(ranks) != len(tokens) or not ranks):
            raise AcceptanceError(f"{where}: ranks and new_tokens must be equally long lists")
        for r, (row, n) in enumerate(zip(ranks, tokens)):
            ok = isinstance(row, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                               and 0 <= x <= MAX_RANK for x in row)
            if not ok or not isinstance(n, int) or n != len(row) + 1:
                raise AcceptanceError(f"{where}: request {r} needs {MAX_RANK}-capped integer "
                                      "ranks, one fewer than its new_tokens")
        return cls([list(r) for r in ranks], list(tokens), dict(obj.get("source") or {}))

    def to_profile(self, topology):
        """The bench's AcceptanceProfile of `topology` replayed from these ranks."""
        from specpilot.bench.replay import AcceptanceProfile
        return AcceptanceProfile(topology, self.simulate(topology), list(self.new_tokens),
                                 {"replayed_from": RANK_PROFILE_FORMAT, **self.source})


@dataclass(frozen=True)
class PerDepthAcceptance:
    """Acceptance from per-depth rates alone: depth d is reached with probability
    a_1 * ... * a_d along the top-1 path; deeper depths reuse the last rate. Branching is
    credited with nothing (no ranks were measured)."""
    rates: List[float]
    label: str

    def rate(self, depth: int) -> float:
        return self.rates[min(depth, len(self.rates)) - 1] if self.rates else 0.0

    def mean_accepted(self, topology) -> float:
        depth = topology_depth(topology)
        total, reach = 0.0, 1.0
        for d in range(1, depth + 1):
            reach *= self.rate(d)
            total += reach
        return total

    def accepted_lengths(self, topology) -> Optional[List[List[int]]]:
        return None


def program_mean_accepted(program, acceptance) -> float:
    """Drafts accepted per step by `program`: the acceptance model's figure for its topology, or
    0 for a Program that does not speculate (greedy AR commits one token per step)."""
    if not program.draft.speculates:
        return 0.0
    return acceptance.mean_accepted(program.draft.topology)


def program_accepted_lengths(program, acceptance) -> Optional[List[List[int]]]:
    """Accepted drafts per step per request for `program` (None where the model has no
    per-request lengths). A Program that does not speculate takes one AR step, accepting no
    draft, per generated token after the prefill's first: new_tokens - 1 steps per request."""
    if program.draft.speculates:
        return acceptance.accepted_lengths(program.draft.topology)
    new_tokens = getattr(acceptance, "new_tokens", None)
    if new_tokens is None:
        return None
    return [[0] * max(0, n - 1) for n in new_tokens]


def ChainProfileAcceptance(profile) -> PerDepthAcceptance:
    """Per-depth acceptance read from a measured bench AcceptanceProfile of a chain or tree."""
    depth = topology_depth(profile.topology)
    rates = per_depth_from_lengths(profile.accepted_lengths, depth)
    return PerDepthAcceptance(rates, f"per-depth acceptance replayed from a {profile.topology} "
                                     "profile")


def AssumedAcceptance(rate: float = 0.7) -> PerDepthAcceptance:
    """A fixed per-depth acceptance for costing before anything was measured."""
    if not 0.0 <= rate <= 1.0:
        raise AcceptanceError(f"an acceptance rate is in 0..1, got {rate}")
    return PerDepthAcceptance([rate], f"assumed per-depth acceptance {rate:g} (not measured)")


def load_acceptance(path: str):
    """A rank profile or a bench acceptance profile from a JSON file."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AcceptanceError(f"cannot read acceptance file {path!r}: {exc}") from None
    if isinstance(obj, dict) and obj.get("format") == RANK_PROFILE_FORMAT:
        return RankProfile.from_json(obj, path)
    from specpilot.bench.replay import AcceptanceProfile
    return ChainProfileAcceptance(AcceptanceProfile.from_json(obj, path))


def measure_rank_profile(drafter, prompts: Sequence[Sequence[int]], reference_tokens,
                         source: Optional[dict] = None) -> RankProfile:
    """Teacher-force `drafter` (a runtime Transformer) over each prompt + its reference tokens and
    record the rank of every reference token after the first (see the module docstring)."""
    import torch

    from specpilot.runtime.steps import teacher_forced_logits

    ranks_out, counts = [], []
    with torch.no_grad():
        for prompt, ref in zip(prompts, reference_tokens):
            ref = list(ref)
            counts.append(len(ref))
            if len(ref) < 2:
                ranks_out.append([])
                continue
            logits = teacher_forced_logits(drafter, list(prompt) + ref[:-1])
            rows = logits[len(prompt):]            # row j predicts reference token j + 1
            wanted = torch.tensor(ref[1:], device=rows.device)
            chosen = rows.gather(1, wanted[:, None])
            ranks = (rows > chosen).sum(dim=1).clamp(max=MAX_RANK)
            ranks_out.append([int(r) for r in ranks.tolist()])
    return RankProfile(ranks_out, counts, dict(source or {}))
