"""SpecPilot's own decoders as benchmark systems: eager AR (`ar_torch`), CUDA-graphed AR
(`strong_ar`), and speculative Programs (`stock`, `program:<name>`).

A system runs a whole workload at one batch size (`run`, timed by the caller), may prepare
untimed state first (`setup`: graph capture), and checks its output against the reference
(`check`). `unavailable(batch)` gives the reason it cannot run there, or None.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from specpilot.ir import Program, program_id
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.cuda_graphs import GraphsUnavailable, require_cuda
from specpilot.runtime.decoder import (ModelPair, acceptance_rule, check_pair_runs,
                                      check_runnable, force_program)
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.mechanisms import force_ar_proposals, run_program_decode
from specpilot.runtime.graphed_program import (decoder_for, graph_refusal, release_decoders,
                                               plain_capacity, run_graphed)

from .correctness import forcing_json, forcing_report
from .workload import batches


@dataclass
class RunOutput:
    tokens: List[List[int]]
    target_forwards: int
    drafter_forwards: Optional[int] = None
    mean_accepted: Optional[float] = None                 # speculative systems only
    accepted_lengths: Optional[List[List[int]]] = None    # speculative systems only
    # The decoder's own counts (a graphed decoder's rounds of each chain length, its refills):
    # what lengths an adaptive decoder chose, and whether it ran plain steps.
    stats: Optional[Dict[str, int]] = None
    # An adaptive refill decoder's length rule (SpecResult.length_rule): its measured round
    # prices and when it turned speculation off, so that the call can be replayed.
    length_rule: Optional[dict] = None


class System(ABC):
    name = ""
    family = "ours"          # "ours" (token-forced) or "hf" (exact-match count only)
    description = ""
    graphed = False          # runs CUDA graphs (fast to measure; measured first)

    def __init__(self):
        self.notes: List[str] = []

    def unavailable(self, batch_size: int) -> Optional[str]:
        return None

    def setup(self, batch_size: int, prompts, max_new_tokens: int) -> None:
        pass

    @abstractmethod
    def run(self, prompts, batch_size: int, max_new_tokens: int) -> RunOutput:
        """Decode `prompts` in batches of `batch_size`; the tokens and counters of the run."""

    @abstractmethod
    def check(self, prompts, batch_size: int, reference, output: RunOutput) -> dict:
        """How `output` compares with the stock AR `reference` (forcing or exact matches)."""

    def teardown(self) -> None:
        pass


class _ARSystem(System):
    """Plain greedy AR of the target in batches: subclasses say how a batch is decoded and how
    it proposes tokens when fed the reference (token forcing)."""

    def __init__(self, pair: ModelPair):
        super().__init__()
        self.pair = pair

    @abstractmethod
    def _decode(self, prompts, max_new_tokens: int):
        """An ARResult (or SpecResult) of one batch."""

    @abstractmethod
    def _forced(self, prompts, reference_tokens) -> List[List[int]]:
        """The decoder's own argmax at every reference position of one batch."""

    def run(self, prompts, batch_size, max_new_tokens):
        tokens, forwards = [], 0
        for chunk in batches(prompts, batch_size):
            r = self._decode(chunk, max_new_tokens)
            tokens += r.tokens
            forwards += r.target_forwards
        return RunOutput(tokens, forwards)

    def check(self, prompts, batch_size, reference, output):
        proposals = []
        for start in range(0, len(prompts), batch_size):
            proposals += self._forced(prompts[start:start + batch_size],
                                      reference.tokens[start:start + batch_size])
        return {"forcing": forcing_json(forcing_report(proposals, reference,
                                                       self.pair.target.dtype))}


class EagerAR(_ARSystem):
    name = "ar_torch"
    description = "SpecPilot greedy AR, torch backend, eager (padded batches)"

    def _decode(self, prompts, max_new_tokens):
        return generate_ar(self.pair.target, prompts, max_new_tokens, self.pair.eos_ids)

    def _forced(self, prompts, reference_tokens):
        return force_ar_proposals(self.pair.target, prompts, reference_tokens)


class StrongAR(_ARSystem):
    name = "strong_ar"
    description = ("SpecPilot greedy AR, each step one CUDA graph with its input, argmax and "
                   "stopping on the device (the graphed runtime with no drafter); torch backend "
                   "with its CUDA fast path (cuBLAS GEMMs on fused q/k/v and gate/up, compiled "
                   "norm/RoPE/SwiGLU, SDPA attention)")

    graphed = True
    decoder_class = GraphedChainDecoder     # what `setup` builds: chains of 0, no drafter

    def __init__(self, pair: ModelPair):
        super().__init__(pair)
        self.decoder: Optional[GraphedChainDecoder] = None

    def unavailable(self, batch_size):
        try:
            require_cuda(self.pair.target.device)
        except GraphsUnavailable as exc:
            return str(exc)
        return None

    def setup(self, batch_size, prompts, max_new_tokens):
        # Capture once per batch size, outside the timed runs (a server captures at start-up).
        # Rounded as the systems' caches are: cuDNN's masked attention looked slower over an
        # odd number of slots (BENCHMARKS.md, eighteenth set).
        capacity = plain_capacity(self.pair.target, prompts, max_new_tokens)
        self.decoder = self.decoder_class(self.pair.target, None, batch_size, capacity, 0,
                                          self.pair.eos_ids)
        self.decoder.prepare_prefill(prompts)

    def _decode(self, prompts, max_new_tokens):
        return self.decoder.generate(prompts, max_new_tokens)

    def _forced(self, prompts, reference_tokens):
        return self.decoder.force(prompts, reference_tokens)

    def teardown(self):
        self.decoder = None


class StrongARRefill(StrongAR):
    name = "strong_ar_refill"
    description = ("strong_ar with continuous refill: a finished request's slot takes the next "
                   "prompt between two replays (runtime/graphed_refill.py); it decodes every "
                   "prompt in one call, so it differs from strong_ar only where there are more "
                   "prompts than slots")

    decoder_class = GraphedRefillDecoder

    def run(self, prompts, batch_size, max_new_tokens):
        r = self.decoder.generate(list(prompts), max_new_tokens)
        return RunOutput(r.tokens, r.target_forwards)

    def check(self, prompts, batch_size, reference, output):
        proposals = self.decoder.force(list(prompts), reference.tokens)
        return {"forcing": forcing_json(forcing_report(proposals, reference,
                                                       self.pair.target.dtype))}


class ProgramSystem(System):
    """A Program (speculative, or plain greedy steps where it does not speculate) run at the
    bench's batch size (its `batch.max_batch_size` is replaced by it; everything else is the
    Program's). With `kernels.capture_graphs` on a GPU its rounds are CUDA graphs
    (runtime/graphed_program.py), captured in `setup`."""

    def __init__(self, name: str, program: Program, pair: ModelPair, description: str = "",
                 graphs_only: bool = False):
        """`graphs_only`: a system that exists to measure graph capture is skipped, with the
        reason, where its rounds cannot be graphed (rather than measured eagerly)."""
        super().__init__()
        self.name, self.program, self.pair = name, program, pair
        self.description = description or (f"Program {program_id(program)[:12]}: "
                                            f"{program.draft.describe()}, "
                                            f"{program.kernels.backend} kernels")
        self.refusal = None
        try:
            check_runnable(program)
            check_pair_runs(program, pair)    # models built as this Program runs them
        except SpecPilotError as exc:
            self.refusal = str(exc)
        if pair.drafter is None and program.draft.speculates:
            self.refusal = "this Program speculates and the pair has no drafter"
        refusal = graph_refusal(program, pair.target.device)
        self.graphed = refusal is None
        if graphs_only and not self.graphed:
            self.refusal = self.refusal or f"its rounds cannot be graphed here: {refusal}"
        elif program.kernels.capture_graphs and not self.graphed:
            self.notes.append(f"kernels.capture_graphs is on, but rounds run eagerly: {refusal}")

    def unavailable(self, batch_size):
        return self.refusal

    def at_batch(self, batch_size: int) -> Program:
        return replace(self.program, batch=replace(self.program.batch, max_batch_size=batch_size))

    def setup(self, batch_size, prompts, max_new_tokens):
        if self.graphed:   # capture once per batch size, outside the timed runs
            decoder_for(self.at_batch(batch_size), self.pair, prompts, max_new_tokens)

    def run(self, prompts, batch_size, max_new_tokens):
        if self.graphed:
            r = run_graphed(self.at_batch(batch_size), self.pair, list(prompts), max_new_tokens)
            return RunOutput(r.tokens, r.target_forwards, r.drafter_forwards, r.mean_accepted,
                             r.accepted_lengths, dict(r.stats or {}), r.length_rule or None)
        # The Program's own decode loop: the stock mechanisms in batches, or the mechanism
        # loop (dynamic trees, two-level verification, ragged layout, adaptive lengths, refill).
        program = self.at_batch(batch_size)
        r = run_program_decode(program, self.pair.target, self.pair.drafter, list(prompts),
                               max_new_tokens, self.pair.eos_ids,
                               acceptance=acceptance_rule(program, self.pair))
        return RunOutput(r.tokens, r.target_forwards, r.drafter_forwards, r.mean_accepted,
                         r.accepted_lengths, dict(r.stats or {}))

    def check(self, prompts, batch_size, reference, output):
        report = force_program(self.at_batch(batch_size), self.pair, prompts, reference)
        return {"forcing": forcing_json(report)}

    def teardown(self):
        if self.graphed:
            release_decoders()
