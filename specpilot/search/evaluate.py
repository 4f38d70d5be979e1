"""Evaluating candidates on the device: token forcing against the stock decoder, then timing.

The Evaluator loads the pair once for the torch backend with dense weights (the stock decoder,
which also produces the reference) and loads it again, built the candidate's way, only for
Programs whose kernels or weight formats differ (the two most recent such pairs are kept, so a
candidate and its base can be timed alternately).
"""
from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Sequence

from specpilot.ir import Program
from specpilot.runtime.ar import ARResult

from .output_check import OutputDivergence, first_divergences


# Pairs built another way than the stock pair kept loaded at once: a candidate and its base.
OWN_PAIRS = 2


def _build_key(program: Program):
    return (program.kernels, program.models.target.weight_formats,
            program.models.drafter.weight_formats)


@dataclass
class Timing:
    """Timed runs of one decoder over the workload."""
    tokens_per_s: List[float]
    seconds: List[float]
    tokens: int
    mean_accepted: Optional[float] = None
    # the first divergence from the reference of each prompt of the warm-up run that differs
    divergences: Sequence[OutputDivergence] = ()

    @property
    def mismatched_prompts(self) -> List[int]:
        return [d.prompt for d in self.divergences]

    @property
    def median_tokens_per_s(self) -> float:
        return statistics.median(self.tokens_per_s)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(max - min) / median of tokens/s: the run-to-run noise of this measurement."""
        return ((max(self.tokens_per_s) - min(self.tokens_per_s)) / self.median_tokens_per_s
                if len(self.tokens_per_s) > 1 else 0.0)

    def to_json(self) -> dict:
        return {"tokens_per_s": self.tokens_per_s, "seconds": self.seconds,
                "median_tokens_per_s": self.median_tokens_per_s, "spread": self.spread,
                "tokens": self.tokens, "mean_accepted": self.mean_accepted,
                "mismatched_prompts": self.mismatched_prompts,
                "divergences": [d._asdict() for d in self.divergences]}


class Evaluator:
    """Forces and times Programs of one deployment on `device` over fixed prompts (token ids)."""

    def __init__(self, target_dir: str, drafter_dir: str, dtype: str, device: str,
                 prompts: Sequence[Sequence[int]], max_new_tokens: int, batch_size: int,
                 kernel_cache=None, reference: Optional[ARResult] = None, stock_pair=None):
        """`reference`: the stock decoder's output, when already known (a resumed compile);
        `stock_pair`: the pair loaded for the torch backend, when the caller has it."""
        from specpilot.runtime.decoder import load_pair, run_reference

        self.target_dir, self.drafter_dir = target_dir, drafter_dir
        self.dtype, self.device = dtype, device
        self.prompts = [list(p) for p in prompts]
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.kernel_cache = kernel_cache
        self.stock_pair = stock_pair or load_pair(target_dir, drafter_dir, dtype, device)
        self.reference = reference if reference is not None else run_reference(
            self.stock_pair, self.prompts, max_new_tokens, batch_size)
        self._own: "OrderedDict" = OrderedDict()   # build key -> pair, most recent last
        self._strong, self._strong_checked = None, False

    @property
    def new_tokens(self) -> List[int]:
        return [len(t) for t in self.reference.tokens]

    def pair_for(self, program: Program):
        """The pair built the way `program` runs it."""
        from specpilot.runtime.decoder import load_pair, needs_own_pair

        if not needs_own_pair(program):
            return self.stock_pair

        key = _build_key(program)
        if key in self._own:
            self._own.move_to_end(key)
            return self._own[key]
        while len(self._own) >= OWN_PAIRS:     # free the oldest before loading the next
            self._own.popitem(last=False)
        self._own[key] = load_pair(self.target_dir, self.drafter_dir, program.models.target.dtype,
                                   self.device, program=program, kernel_cache=self.kernel_cache)
        return self._own[key]

    def force(self, program: Program):
        """The ForcingReport of `program` against the stock decoder's reference."""
        from specpilot.runtime.decoder import force_program
        return force_program(program, self.pair_for(program), self.prompts, self.reference)

    def time(self, program: Program, repeats: int) -> Timing:
        """One warm-up run, whose output is compared with the reference (its first divergences
        are kept, with the reference's margins there), then `repeats` timed unforced runs."""
        from specpilot.runtime.decoder import timed_program

        pair = self.pair_for(program)
        warm = timed_program(program, pair, self.prompts, self.max_new_tokens)
        divergences = first_divergences(warm.tokens, self.reference)
        runs = [timed_program(program, pair, self.prompts, self.max_new_tokens)
                for _ in range(repeats)]
        return Timing([r.tokens_per_s for r in runs], [r.seconds for r in runs],
                      warm.new_tokens, warm.mean_accepted, divergences)

    def time_paired(self, program: Program, base: Program, repeats: int):
        """(Timing of `program`, Timing of `base`, their paired gain): a warm-up run of
        `program` (compared with the reference), then `repeats` rounds of one run of each,
        alternating, so that drift of the machine hits both alike. The gain is the median over
        the rounds of program tokens/s / base tokens/s, minus one."""
        from specpilot.runtime.decoder import timed_program

        pair, base_pair = self.pair_for(program), None
        warm = timed_program(program, pair, self.prompts, self.max_new_tokens)
        divergences = first_divergences(warm.tokens, self.reference)
        mine, theirs = [], []
        for _ in range(repeats):
            mine.append(timed_program(program, self.pair_for(program), self.prompts,
                                      self.max_new_tokens))
            base_pair = self.pair_for(base)
            theirs.append(timed_program(base, base_pair, self.prompts, self.max_new_tokens))
        gain = statistics.median(a.tokens_per_s / b.tokens_per_s
                                 for a, b in zip(mine, theirs)) - 1.0
        return (Timing([r.tokens_per_s for r in mine], [r.seconds for r in mine],
                       warm.new_tokens, warm.mean_accepted, divergences),
                Timing([r.tokens_per_s for r in theirs], [r.seconds for r in theirs],
                       theirs[0].new_tokens, theirs[0].mean_accepted), gain)

    def time_ar(self, repeats: int) -> Timing:
        """Plain greedy AR of the target: CUDA-graphed (strong AR) on a GPU, eager elsewhere."""
        import torch

        from specpilot.runtime.decoder import timed_ar

        runner = self._strong_ar()
        runs = []
        for _ in range(repeats + 1):      # the first run warms up and is not counted
            if runner is None:
                r = timed_ar(self.stock_pair, self.prompts, self.max_new_tokens, self.batch_size)
                runs.append((r.tokens_per_s, r.seconds, r.new_tokens))
                continue
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = runner.run(self.prompts, self.batch_size, self.max_new_tokens)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            tokens = sum(len(t) for t in out.tokens)
            runs.append((tokens / seconds, seconds, tokens))
        runs = runs[1:]
        return Timing([r[0] for r in runs], [r[1] for r in runs], runs[0][2])

    @property
    def graphed_ar(self) -> bool:
        """Whether `time_ar` replays CUDA graphs (strong AR) rather than running eagerly."""
        return self._strong_ar() is not None

    @property
    def ar_label(self) -> str:
        return "strong AR (CUDA graphs)" if self.graphed_ar else "AR (torch, eager)"

    def _strong_ar(self):
        """The CUDA-graphed AR system, set up once (None without CUDA)."""
        if self._strong_checked:
            return self._strong
        self._strong_checked = True
        if str(self.device).startswith("cuda"):
            from specpilot.bench.systems import StrongAR
            system = StrongAR(self.stock_pair)
            if system.unavailable(self.batch_size) is None:
                system.setup(self.batch_size, self.prompts, self.max_new_tokens)
                self._strong = system
        return self._strong
