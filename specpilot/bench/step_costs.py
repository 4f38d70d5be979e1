"""Step costs of a model pair: the seconds of each fixed-shape piece of a decode step, at each
batch size, measured as the median of timed runs after warm-up.

  target(B, T)          target forward of T new tokens per request under a causal mask
                        (T = 1 is the AR step, T = k + 1 verifies a chain of k)
  drafter(B, T)         drafter forward of T new tokens (catch-up, or one tree level)
  verify(B, topology)   target forward over root + tree with the tree mask (trees measured
                        explicitly; a chain uses target(B, k + 1))
  accept(B, topology)   greedy acceptance of a whole batch plus the KV commit (compaction for
                        trees), host loop included: what speculative_generate runs per step
  round(B, topology)    one whole round of the graphed runtime (drafting, verification,
                        acceptance, compaction and commit on the device; one graph)

Forwards are CUDA-graphed and timed with CUDA events on a GPU, run eagerly and timed with a host
clock elsewhere. All new tokens sit after `context` committed positions.
"""
from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Optional, Tuple

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain, SparseTree, Topology, Tree
from specpilot.runtime.acceptance import greedy_accept
from specpilot.runtime.cuda_graphs import GraphedStep
from specpilot.runtime.graphed_program import (CAPACITY_STEP, graphed_decoder, rounded_capacity,
                                               timing_capacity)
from specpilot.runtime.tree_plan import TreePlan, tree_mask
from specpilot.runtime.verify_tree import compact_path

from .replay import MissingStepCost


@dataclass
class StepCosts:
    context: int
    graphed: bool
    target_costs: Dict[int, Dict[int, float]] = field(default_factory=dict)
    drafter_costs: Dict[int, Dict[int, float]] = field(default_factory=dict)
    tree_costs: Dict[str, Dict[int, float]] = field(default_factory=dict)     # str(topology)
    accept_costs: Dict[str, Dict[int, float]] = field(default_factory=dict)   # str(topology)
    round_costs: Dict[str, Dict[int, float]] = field(default_factory=dict)    # str(topology)

    def _get(self, table, key, batch, what):
        try:
            return table[key][batch] if isinstance(key, str) else table[batch][key]
        except KeyError:
            raise MissingStepCost(f"no measured {what} at batch {batch}: measure it (add the "
                                  f"batch size to --batch-sizes, or the width/topology)") from None

    def target(self, batch: int, width: int) -> float:
        return self._get(self.target_costs, width, batch, f"target step of {width} tokens")

    def drafter(self, batch: int, width: int) -> float:
        return self._get(self.drafter_costs, width, batch, f"drafter step of {width} tokens")

    def verify(self, batch: int, topology: Topology) -> float:
        if isinstance(topology, Chain):
            return self.target(batch, topology.k + 1)
        return self._get(self.tree_costs, str(topology), batch, f"verification of {topology}")

    def accept(self, batch: int, topology: Topology) -> float:
        return self._get(self.accept_costs, str(topology), batch, f"accept/commit of {topology}")

    def round(self, batch: int, topology: Topology) -> float:
        if not self.has_round(batch, topology):
            raise MissingStepCost(f"no measured graphed {topology} round at batch {batch}: "
                                  f"measure it (add the batch size to --batch-sizes)")
        return self.round_costs[str(topology)][batch]

    def has_round(self, batch: int, topology: Topology) -> bool:
        return batch in self.round_costs.get(str(topology), {})

    @classmethod
    def of_chain_rounds(cls, by_batch: Dict[int, Iterable[float]]) -> "StepCosts":
        """Graphed step costs from per-batch costs of a plain step (L = 0) and of a chain(L)
        round, L = 1..k (in seconds, or in plain steps)."""
        costs = cls(context=0, graphed=True)
        for batch, per_length in by_batch.items():
            plain, *rounds = per_length
            costs.target_costs[batch] = {1: plain}
            for n, seconds in enumerate(rounds, start=1):
                costs.round_costs.setdefault(str(Chain(n)), {})[batch] = seconds
        return costs

    @classmethod
    def of_round_model(cls, base: float, per_draft: float, batch_sizes: Iterable[int],
                       k: int) -> "StepCosts":
        """Step costs in plain steps: a plain step 1, a chain(L) round base + per_draft * L at
        every batch size (the shape of the 161M pair's graphed rounds on the H200)."""
        return cls.of_chain_rounds(
            {b: [1.0] + [base + per_draft * n for n in range(1, k + 1)] for b in batch_sizes})

    def to_json(self) -> dict:
        """target/drafter as {batch: {width: s}}, verify_trees/accept/graphed_rounds as
        {topology: {batch: s}}."""
        def keyed(table):
            return {str(k): {str(b): v for b, v in sorted(row.items())} for k, row in table.items()}
        return {"context": self.context, "graphed": self.graphed, "unit": "seconds",
                "target": keyed(self.target_costs), "drafter": keyed(self.drafter_costs),
                "verify_trees": keyed(self.tree_costs), "accept": keyed(self.accept_costs),
                "graphed_rounds": keyed(self.round_costs)}

    @classmethod
    def from_json(cls, obj: dict) -> "StepCosts":
        """Read back what `to_json` wrote (e.g. to replay another profile without re-measuring)."""
        def by_batch(table):
            return {int(b): {int(w): float(s) for w, s in row.items()} for b, row in table.items()}

        def by_topology(table):
            return {t: {int(b): float(s) for b, s in row.items()} for t, row in table.items()}

        rounds = by_topology(obj.get("graphed_rounds", {}))
        return cls(int(obj["context"]), bool(obj["graphed"]), by_batch(obj["target"]),
                   by_batch(obj["drafter"]), by_topology(obj["verify_trees"]),
                   by_topology(obj["accept"]), rounds)


def read_step_costs(path: str) -> Tuple[StepCosts, dict]:
    """(the step costs, the whole document) of a `specpilot bench --shapes` result's JSON at
    `path`; a SpecPilotError where it cannot be read or holds no step costs."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        return StepCosts.from_json(doc["step_costs"]), doc
    except OSError as exc:
        raise SpecPilotError(f"cannot read step costs from {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise not_a_result(path, exc) from None


def not_a_result(path: str, exc: Exception) -> SpecPilotError:
    """The error for a file that is not a `specpilot bench --shapes` result with step costs."""
    return SpecPilotError(f"{path} is not a `specpilot bench --shapes` result with step costs "
                          f"({type(exc).__name__}: {exc})")


def timed_runs(graphs: bool, warmup: int, repeats: int) -> Tuple[int, int]:
    """(warm-up, timed) runs of a script's measurement: as given on a GPU, one eager run
    without warm-up off it (the script's check: the interpreter's timings mean nothing)."""
    return (warmup, repeats) if graphs else (0, 1)


def time_median(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int,
                host_bound: bool = False) -> float:
    """Median seconds of `fn()` over `repeats` runs after `warmup` runs. On CUDA each run is
    bracketed by events (device time) unless `host_bound`, which times with the host clock
    after a synchronize (for steps whose cost is host work)."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        if cuda and not host_bound:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_step(model, cache, context: int, width: int, plan: Optional[TreePlan],
                 graphed: bool):
    """A GraphedStep whose static inputs put `width` random tokens after `context` positions,
    causal or (with `plan`) as root + tree."""
    step = GraphedStep(model, cache, width, capture=graphed)
    b, dev = cache.batch, model.device
    roots = torch.full((b,), context, dtype=torch.int64, device=dev)
    gen = torch.Generator(device=dev).manual_seed(width)
    step.tokens.copy_(torch.randint(0, model.config.vocab_size, (b, width), device=dev,
                                    generator=gen))
    step.slots.copy_(roots[:, None] + torch.arange(width, device=dev)[None, :])
    if plan is None:
        step.positions.copy_(step.slots)
        step.mask.copy_(torch.arange(cache.capacity, device=dev)[None, None, :]
                        <= step.slots[:, :, None])
    else:
        step.positions.copy_(roots[:, None] + plan.depth_offsets.to(dev)[None, :])
        step.mask.copy_(tree_mask(roots, plan.ancestors, cache.capacity))
    return step


def measure_forwards(model, batch: int, widths: Iterable[int], context: int, graphed: bool,
                     warmup: int, repeats: int, progress=None) -> Dict[int, float]:
    """{width: median seconds} of causal forwards of `width` tokens after `context`."""
    widths = sorted(set(widths))
    cache = model.new_cache(batch, rounded_capacity(context + max(widths)))
    out = {}
    for w in widths:
        step = forward_step(model, cache, context, w, None, graphed)
        out[w] = time_median(step.replay, model.device, warmup, repeats)
        del step
        if progress:
            progress(f"  batch {batch} width {w}: {out[w] * 1e3:.3f} ms")
    return out


def measure_tree_verify(model, batch: int, topology: Topology, context: int, graphed: bool,
                        warmup: int, repeats: int) -> float:
    plan = TreePlan.build(topology)
    cache = model.new_cache(batch, rounded_capacity(context + plan.num_nodes + 1))
    step = forward_step(model, cache, context, plan.num_nodes + 1, plan, graphed)
    return time_median(step.replay, model.device, warmup, repeats)


def measure_accept(model, batch: int, topology: Topology, context: int, warmup: int,
                   repeats: int) -> float:
    """Seconds of greedy acceptance + KV commit for a batch whose drafts are all accepted along
    each node's first child (the longest walk and, for trees, a compaction copy)."""
    plan = TreePlan.build(topology)
    n, dev, vocab = plan.num_nodes, model.device, model.config.vocab_size
    cache = model.new_cache(batch, context + n + 1)
    gen = torch.Generator(device=dev).manual_seed(n)
    node_tokens = torch.randint(0, vocab, (batch, n), device=dev, generator=gen)
    logits = torch.randn((batch, n + 1, vocab), device=dev, generator=gen)
    for parent in range(-1, n):
        children = plan.children(parent)
        if children:  # make the first child the target's argmax after its parent
            logits[:, parent + 1].scatter_(1, node_tokens[:, children[0]][:, None], 1e4)

    def accept_and_commit():
        rows = node_tokens.tolist()
        for row in range(batch):
            path = greedy_accept(plan, rows[row], logits[row])
            compact_path(cache, row, context, path.nodes)

    return time_median(accept_and_commit, dev, warmup, repeats, host_bound=True)


def round_timing_capacity(context: int, topology: Topology, warmup: int, repeats: int) -> int:
    """The cache `measure_round` times `topology` in from `context`: its warm-up and timed
    rounds and three more (`timing_capacity`)."""
    return timing_capacity(context, topology, warmup + repeats + 3)


def round_timing_context(model, context: int, topology: Topology, warmup: int,
                         repeats: int) -> int:
    """`context`, or less where `measure_round`'s cache after it (rounding included) would
    pass `model`'s positions; at least 1."""
    limit = model.config.max_position_embeddings // CAPACITY_STEP * CAPACITY_STEP
    return max(1, min(context, limit - round_timing_capacity(0, topology, warmup, repeats)))


def measure_round(target, drafter, batch: int, topology: Topology, context: int, graphed: bool,
                  warmup: int, repeats: int, prepare: Optional[Callable] = None) -> float:
    """Median seconds of one graphed round of `topology` (chain, static or dynamic tree) at
    `batch` after `context` positions (`prepare`, if given, called on the decoder first)."""
    capacity = round_timing_capacity(context, topology, warmup, repeats)
    decoder = graphed_decoder(target, drafter, batch, capacity, topology, capture=graphed)
    if prepare is not None:
        prepare(decoder)
    return time_median(decoder.timing_round(context), target.device, warmup, repeats)


def topology_from_key(name: str):
    """The static topology a step-costs key names (the keys are str(topology)); None for
    anything else (a dynamic tree)."""
    m = re.fullmatch(r"chain\((\d+)\)", name)
    if m:
        return Chain(int(m.group(1)))
    m = re.fullmatch(r"tree\((\[.*\])\)", name)
    if m:
        return Tree(tuple(json.loads(m.group(1))))
    m = re.fullmatch(r"sparse_tree\((\[.*\])\)", name)
    if m:
        return SparseTree(tuple(tuple(q) for q in json.loads(m.group(1))))
    return None
