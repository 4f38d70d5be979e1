"""The tree from measured acceptance as a bench system of its own (`mech:graphed_sequoia`).

The topology agent proposes Sequoia-shaped trees inside a compile (runtime/sequoia.py), where
they compete with every other transformation; this system measures the mechanism alone. At
each batch size it runs the stock Program (graphed) with the shaped static tree that the cost
model predicts serves the most tokens per second at that batch:

  1. the drafter's rank profile is measured on held-out prompts of the same workload (prompts
     the bench does not time, decoded by greedy AR of the target), so the shape is not fitted
     to the prompts it is timed on; with no held-out prompt it falls back to the benched ones
     and says so in its notes;
  2. `cost/topologies.shaped_topologies` gives the best tree of each size and depth limit for
     that profile (the dynamic programme);
  3. each is priced at the batch size, and the one with the most tokens per unit of cost is
     the row's Program. Two pricings, two systems:
       - `mech:graphed_sequoia`: the cost model, the GPU's built-in spec calibrated at that
         batch size as a compile's round zero calibrates it (greedy AR and the stock chain
         timed on held-out prompts, graphed on a GPU, fitted against the model's predictions
         of those runs);
       - `mech:graphed_sequoia_timed`: Sequoia's own, hardware-aware way: a few probe trees'
         graphed rounds are timed at that batch, and a round's cost is fitted as base + a
         cost per verified token + a cost per drafter level (`sequoia.linear_step_cost`).
     On an H200 (run 33's pair) the calibrated model chose 64-node trees at batch 1 and 4 that
     ran 0.80x and 0.86x the stock chain: it priced them far below what their rounds cost
     (BENCHMARKS.md, sixteenth set). Timing the rounds is meant to price them as they run; it
     has not been benched yet.

Each row says which tree it ran and what was predicted for it (`shaped_tree`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from specpilot.ir import Chain, Program, SetTopology, Tree, apply
from specpilot.ir.errors import SpecPilotError

from .systems import ProgramSystem

# Held-out prompts profiled (the bench's first prompts are the timed ones): a full batch 64 for
# the calibration runs, and enough ranks per depth for the dynamic programme; decoding them
# takes a few seconds on a GPU.
HELD_OUT_PROMPTS = 64
# Calibration runs decode this many held-out prompts (at least one full batch) and time the
# median of this many runs after a warm-up.
CALIBRATION_PROMPTS = 8
CALIBRATION_REPEATS = 3
# Probe trees whose rounds the timed pricing measures: 1 to 64 drafted nodes, 1 to 6 levels, so
# that the fit's three costs (base, per verified token, per drafter level) are told apart.
PROBES = (Chain(1), Chain(6), Tree((8,)), Tree((4, 4)), Tree((4, 3, 2, 1)),
          Tree((2, 2, 2, 2, 1, 1)))
PROBE_WARMUP, PROBE_REPEATS = 2, 5


def best_shaped_topology(base: Program, acceptance, batch: int, cost_model) -> Tuple[object, float]:
    """(topology, predicted tokens/s) of the shaped tree the cost model ranks first for `base`
    at `batch`; a SpecPilotError when the profile yields no tree."""
    from specpilot.cost.topologies import shaped_topologies

    sized = replace(base, batch=replace(base.batch, max_batch_size=batch))
    best: Optional[Tuple[float, object]] = None
    for topology in shaped_topologies(acceptance):
        try:
            program = _with_topology(sized, topology)
            tps = cost_model.predicted_tokens_per_s(program, acceptance, batch)
        except SpecPilotError:
            continue            # a shape this Program cannot take (refused by the IR)
        if best is None or tps > best[0]:
            best = (tps, topology)
    if best is None:
        raise SpecPilotError("the measured rank profile gives no tree to shape (no drafted "
                             "token was ranked)")
    return best[1], best[0]


def _with_topology(program: Program, topology) -> Program:
    return program if program.draft.topology == topology else apply(program,
                                                                     SetTopology(topology))


def fit_linear_cost(probes: Sequence[Tuple[object, float]]) -> Tuple[float, float, float]:
    """(base, per verified token, per drafter level) fitted by least squares to `probes`'
    (topology, round seconds), none negative: where the free fit makes a cost negative (timing
    noise where a term barely matters), the best fit with that cost held at 0 is taken, so no
    tree is priced cheaper for being larger. A SpecPilotError where the probes cannot tell the
    three apart."""
    import numpy as np

    rows = np.array([[1.0, t.num_nodes + 1, t.depth] for t, _ in probes])
    seconds = np.array([s for _, s in probes])
    if np.linalg.matrix_rank(rows) < 3:
        raise SpecPilotError("the probe trees must differ in size and depth independently")
    best = None
    for kept in ((0, 1, 2), (0, 1), (0, 2), (0,)):      # base always; then fewer terms
        coef = np.zeros(3)
        coef[list(kept)] = np.linalg.lstsq(rows[:, kept], seconds, rcond=None)[0]
        if (coef < 0).any():
            continue
        residual = float(((rows @ coef - seconds) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, coef)
    if best is None:
        raise SpecPilotError("the probe rounds fit no non-negative cost")
    base, per_token, per_depth = best[1]
    return float(base), float(per_token), float(per_depth)


def best_timed_topology(acceptance, cost: Callable[[object], float],
                        base: Optional[Program] = None) -> Tuple[object, float]:
    """(topology, expected tokens per second of a row) of the shaped tree with the most expected
    tokens (its accepted drafts replayed over the measured ranks, plus the bonus) per `cost`
    seconds; with `base`, only trees that Program takes."""
    from specpilot.cost.topologies import shaped_topologies

    best: Optional[Tuple[float, object]] = None
    for topology in shaped_topologies(acceptance):
        if base is not None:
            try:
                _with_topology(base, topology)
            except SpecPilotError:
                continue        # a shape this Program cannot take (refused by the IR)
        seconds = cost(topology)
        if seconds <= 0:
            continue            # outside what the fit can price
        rate = (1.0 + acceptance.mean_accepted(topology)) / seconds
        if best is None or rate > best[0]:
            best = (rate, topology)
    if best is None:
        raise SpecPilotError("no shaped tree has a positive fitted round cost")
    return best[1], best[0]


def time_probes(pair, batch: int, context: int, graphed: bool,
                probes: Sequence[object] = PROBES) -> List[Tuple[object, float]]:
    """(probe, median seconds of one of its rounds) at `batch`, every row active after `context`
    positions (captured on a GPU; eager elsewhere, where only a script's check is timed)."""
    import torch

    from .step_costs import measure_round

    warmup, repeats = (PROBE_WARMUP, PROBE_REPEATS) if graphed else (0, 1)
    out = []
    for probe in probes:
        # measure_round's cache holds the context and every timed round's span after it: kept
        # within the target's positions.
        span = (warmup + repeats + 3) * (probe.num_nodes + 1)
        at = max(1, min(context, pair.target.config.max_position_embeddings - span))
        out.append((probe, measure_round(pair.target, pair.drafter, batch, probe, at,
                                         graphed, warmup, repeats)))
        if graphed:
            torch.cuda.empty_cache()        # the probe's caches and graph
    return out


class ShapedTreeSystem(ProgramSystem):
    """`base` (the stock Program, graphed) with, at each batch size, the shaped tree with the
    most tokens per unit of cost for the drafter's ranks on `held_out` prompts
    (`max_new_tokens` each). `pricing` "calibrated": the cost model's predicted tokens/s
    (`cost_model`, default the GPU's spec calibrated at the batch size); "timed": probe trees'
    rounds timed at the batch size and fitted (`fit_linear_cost`)."""

    PRICINGS = ("calibrated", "timed")

    def __init__(self, name: str, base: Program, pair, held_out: Sequence[Sequence[int]],
                 max_new_tokens: int, cost_model=None, description: str = "",
                 graphs_only: bool = True, pricing: str = "calibrated"):
        if pricing not in self.PRICINGS:
            raise SpecPilotError(f"pricing {pricing!r}: expected one of {self.PRICINGS}")
        super().__init__(name, base, pair, description or (
            "stock + CaptureGraphs + the tree from measured acceptance: at each batch size the "
            "Sequoia-shaped tree with the most tokens per unit of cost, for the drafter's ranks "
            "on held-out prompts, priced by " + (
                "the cost model calibrated at that batch" if pricing == "calibrated" else
                "probe trees' rounds timed at that batch")), graphs_only=graphs_only)
        self.held_out = [list(p) for p in held_out]
        self.profile_tokens = max_new_tokens
        self.pricing = pricing
        self._cost_model = cost_model
        self._acceptance = None
        self._chosen: Dict[int, Tuple[object, dict]] = {}
        self._programs: Dict[int, Program] = {}
        self.models: Dict[int, object] = {}      # batch size -> the model that chose there

    def use_benched_prompts(self, prompts: Sequence[Sequence[int]]) -> None:
        """Profile on the benched prompts: where the workload leaves none held out."""
        self.held_out = [list(p) for p in prompts]
        self.notes.append("the workload has no prompt beyond the benched ones: the tree is "
                          "shaped on the prompts it is timed on")

    def acceptance(self):
        """The drafter's rank profile on the held-out prompts (measured once)."""
        if self._acceptance is None:
            from specpilot.cost.acceptance import measure_rank_profile
            from specpilot.runtime.ar import generate_ar

            if not self.held_out:
                raise SpecPilotError(f"{self.name}: no prompts to measure the drafter's ranks on")
            reference = generate_ar(self.pair.target, self.held_out, self.profile_tokens,
                                    self.pair.eos_ids)
            self._acceptance = measure_rank_profile(
                self.pair.drafter, self.held_out, reference.tokens,
                {"prompts": len(self.held_out), "max_new_tokens": self.profile_tokens,
                 "held_out": True})
        return self._acceptance

    def cost_model(self, batch_size: int):
        """The model that prices the shapes at `batch_size`: the one given, else the GPU's
        spec calibrated at that batch on held-out prompts (`calibrated_model`)."""
        if self._cost_model is not None:
            return self._cost_model
        from specpilot.cost import CostModel
        from specpilot.cost.gpu_specs import gpu_spec

        sized = ProgramSystem.at_batch(self, batch_size)
        count = min(len(self.held_out), max(batch_size, CALIBRATION_PROMPTS))
        return calibrated_model(CostModel(gpu_spec(self.program.gpu)), sized, self.pair,
                                self.held_out[:count], self.profile_tokens, self.acceptance())

    def probe_context(self) -> int:
        """Where the probes' rounds are timed: the held-out prompts' mean length plus half the
        tokens each decodes (where a call's rounds are on average)."""
        return sum(len(p) for p in self.held_out) // len(self.held_out) + self.profile_tokens // 2

    def chosen(self, batch_size: int) -> Tuple[object, dict]:
        """(topology, how it was priced) at `batch_size` (chosen once per batch size)."""
        if batch_size not in self._chosen:
            acceptance = self.acceptance()
            if self.pricing == "calibrated":
                model = self.models[batch_size] = self.cost_model(batch_size)
                topology, tps = best_shaped_topology(self.program, acceptance, batch_size,
                                                     model)
                priced = {"predicted_tokens_per_s": tps,
                          "calibration": model.calibration.to_json()}
            else:
                probes = time_probes(self.pair, batch_size, self.probe_context(),
                                     self.graphed)
                fit = fit_linear_cost(probes)
                topology, rate = best_timed_topology(
                    acceptance, lambda t: fit[0] + fit[1] * (t.num_nodes + 1) + fit[2] * t.depth,
                    ProgramSystem.at_batch(self, batch_size))
                # Full rows, no idle slots: unlike the calibrated model's figure.
                priced = {"expected_tokens_per_s_full_rows": rate * batch_size,
                          "probes": {str(t): seconds for t, seconds in probes},
                          "fit_seconds": dict(zip(("base", "per_token", "per_depth"), fit))}
            self._chosen[batch_size] = (topology, dict(priced, pricing=self.pricing))
            self._programs[batch_size] = _with_topology(
                ProgramSystem.at_batch(self, batch_size), topology)
        return self._chosen[batch_size]

    def setup(self, batch_size, prompts, max_new_tokens):
        self.chosen(batch_size)         # profiled and priced before anything is timed
        super().setup(batch_size, prompts, max_new_tokens)

    def at_batch(self, batch_size: int) -> Program:
        # Built once per batch size: the bench asks in every timed run.
        self.chosen(batch_size)
        return self._programs[batch_size]

    def check(self, prompts, batch_size, reference, output):
        checks = super().check(prompts, batch_size, reference, output)
        topology, priced = self.chosen(batch_size)
        checks["shaped_tree"] = {"topology": str(topology),
                                 "drafted_nodes": topology.num_nodes,
                                 "depth": topology.depth,
                                 "predicted_mean_accepted":
                                     self.acceptance().mean_accepted(topology),
                                 "profiled_prompts": len(self.held_out), **priced}
        return checks


def calibrated_model(model, stock: Program, pair, prompts: Sequence[Sequence[int]],
                     max_new_tokens: int, acceptance):
    """`model` calibrated on two timed runs of `prompts` at the stock Program's batch size, as
    a compile's round zero does: greedy AR of the target and the stock Program itself, each on
    the graphed runtime (captured on a GPU, eager elsewhere). `acceptance` must be the rank
    profile of these prompts (first) decoded to `max_new_tokens`: it gives the stock run's
    predicted accepted lengths."""
    import statistics
    import time

    import torch

    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.runtime.graphed_program import release_decoders, run_graphed
    from specpilot.runtime.steps import check_capacity

    from .workload import batches

    cuda = pair.target.device.type == "cuda"
    batch = stock.batch.max_batch_size
    capacity = check_capacity(pair.target, prompts, max_new_tokens, slack=1)
    ar = GraphedChainDecoder(pair.target, None, batch, capacity, 0, pair.eos_ids, capture=cuda)
    ar.prepare_prefill(prompts)
    decoded: Dict[str, List[int]] = {}            # per run, each request's new tokens

    def ar_run():
        return [t for chunk in batches(prompts, batch)
                for t in ar.generate(chunk, max_new_tokens).tokens]

    runs = {"ar": ar_run,
            "stock": lambda: run_graphed(stock, pair, prompts, max_new_tokens,
                                         capture=cuda).tokens}

    def seconds(label, run) -> float:
        decoded[label] = [len(t) for t in run()]    # warm-up (captures on a GPU)
        times = []
        for _ in range(CALIBRATION_REPEATS):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    try:
        measured = {label: seconds(label, run) for label, run in runs.items()}
    finally:
        release_decoders()      # the stock decoder's graphs; the AR one's go with this frame
    lengths = [len(p) for p in prompts]
    # Each run priced at the tokens it decoded (bf16 batches may end a request elsewhere than
    # the profile's reference did); the stock run's rounds from the profile's ranks.
    predictions = {"ar": model.predict_ar_run(stock, lengths, decoded["ar"], batch,
                                              graphed=cuda),
                   "stock": model.predict_speculative_run(stock, acceptance, lengths,
                                                          decoded["stock"])}
    for label, prediction in predictions.items():
        model = model.calibrated(label, measured[label], prediction)
    return model


def held_out_prompts(all_prompts: Sequence[Sequence[int]], benched: int,
                     count: int = HELD_OUT_PROMPTS) -> List[List[int]]:
    """Up to `count` prompts of the workload after the first `benched` (the timed ones)."""
    return [list(p) for p in all_prompts[benched:benched + count]]
