"""Run a Program: load its model pair, decode with its topology and batch layout, and force it
against the stock decoder (plain greedy AR of the target)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from specpilot.ir import Program
from specpilot.ir.errors import SpecPilotError

from .ar import ARResult, generate_ar
from .checkpoint import check_same_vocabulary, load_tokenizer
from .errors import CheckpointError
from .forcing import ForcingReport, force_tokens
from .model import Transformer
from .speculative import SpecResult, speculative_generate


class UnsupportedProgram(SpecPilotError):
    """A Program this runtime cannot execute (yet); the message names the attribute."""


@dataclass
class ModelPair:
    target: Transformer
    drafter: Optional[Transformer]
    tokenizer: object            # tokenizers.Tokenizer or None
    eos_ids: tuple

    def encode(self, text: str) -> List[int]:
        if self.tokenizer is None:
            raise CheckpointError("the target checkpoint has no tokenizer.json: cannot encode text prompts")
        ids = self.tokenizer.encode(text).ids
        if not ids:
            raise SpecPilotError(f"prompt {text[:40]!r} encodes to no tokens")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids)) if self.tokenizer is not None else " ".join(map(str, ids))


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_pair(target_dir: str, drafter_dir: Optional[str], dtype: str = "float32",
              device: Optional[str] = None) -> ModelPair:
    """Load target (and drafter) for decoding; a clear error if they do not share a vocabulary."""
    device = device or default_device()
    target = Transformer.from_checkpoint(target_dir, dtype, device)
    tokenizer = load_tokenizer(target_dir)
    drafter = None
    if drafter_dir is not None:
        drafter = Transformer.from_checkpoint(drafter_dir, dtype, device)
        check_same_vocabulary(target.config, drafter.config, tokenizer, load_tokenizer(drafter_dir),
                              target_dir, drafter_dir)
    return ModelPair(target, drafter, tokenizer, tuple(target.config.eos_token_ids))


def check_runnable(program: Program) -> None:
    """Refuse, with the reason, Programs whose mechanisms this runtime does not execute."""
    if program.kernels.backend != "torch":
        raise UnsupportedProgram(f"kernels.backend {program.kernels.backend!r}: this runtime "
                                 f"executes the 'torch' backend only")
    if program.batch.layout != "padded":
        raise UnsupportedProgram(f"batch.layout {program.batch.layout!r}: only 'padded' is implemented")
    if program.verify.acceptance != "greedy":
        raise UnsupportedProgram(f"verify.acceptance {program.verify.acceptance!r}: only 'greedy'")
    for role in ("target", "drafter"):
        spec = getattr(program.models, role)
        for linear, fmt in spec.weight_formats:
            if fmt not in ("bf16", "fp32"):
                raise UnsupportedProgram(f"models.{role}.weight_formats[{linear}] = {fmt!r}: the torch "
                                         f"backend runs dense formats only")


def _batches(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield start, items[start:start + size]


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclass
class TimedRun:
    tokens: List[List[int]]
    seconds: float
    target_forwards: int
    mean_accepted: Optional[float]

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("inf")


def run_reference(pair: ModelPair, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  batch_size: int = 1) -> ARResult:
    """The stock decoder's output (greedy AR), with the margins token forcing needs."""
    out = ARResult([], [], 0)
    for _, chunk in _batches(list(prompts), batch_size):
        r = generate_ar(pair.target, chunk, max_new_tokens, pair.eos_ids)
        out.tokens += r.tokens
        out.margins += r.margins
        out.target_forwards += r.target_forwards
    return out


def timed_ar(pair: ModelPair, prompts, max_new_tokens: int, batch_size: int = 1) -> TimedRun:
    _sync(pair.target.device)
    start = time.perf_counter()
    r = run_reference(pair, prompts, max_new_tokens, batch_size)
    _sync(pair.target.device)
    return TimedRun(r.tokens, time.perf_counter() - start, r.target_forwards, None)


def timed_program(program: Program, pair: ModelPair, prompts, max_new_tokens: int) -> TimedRun:
    """Decode with the Program's topology in batches of `batch.max_batch_size`."""
    check_runnable(program)
    if pair.drafter is None:
        raise SpecPilotError("this Program speculates: give a drafter checkpoint")
    shape = program.draft.topology.shape()
    tokens, forwards, steps_total, accepted_total = [], 0, 0, 0.0
    _sync(pair.target.device)
    start = time.perf_counter()
    for _, chunk in _batches(list(prompts), program.batch.max_batch_size):
        r: SpecResult = speculative_generate(pair.target, pair.drafter, chunk, max_new_tokens,
                                             shape, pair.eos_ids)
        tokens += r.tokens
        forwards += r.target_forwards
        n = sum(len(a) for a in r.accepted_lengths)
        steps_total += n
        accepted_total += r.mean_accepted * n
    _sync(pair.target.device)
    mean = accepted_total / steps_total if steps_total else 0.0
    return TimedRun(tokens, time.perf_counter() - start, forwards, mean)


def force_program(program: Program, pair: ModelPair, prompts, reference: ARResult,
                  tolerance: Optional[float] = None) -> ForcingReport:
    """Token-force the Program against `reference` (see runtime/forcing.py)."""
    check_runnable(program)
    shape = program.draft.topology.shape()
    report = None
    for start, chunk in _batches(list(prompts), program.batch.max_batch_size):
        ref = ARResult(reference.tokens[start:start + len(chunk)],
                       reference.margins[start:start + len(chunk)], 0)
        part = force_tokens(pair.target, pair.drafter, chunk, shape, ref, tolerance=tolerance)
        report = part if report is None else _merge_reports(report, part, start)
    return report


def _merge_reports(a: ForcingReport, b: ForcingReport, offset: int) -> ForcingReport:
    """One report over two batches; b's prompt indices are shifted by `offset`."""
    shift = [d._replace(prompt=d.prompt + offset) for d in b.near_tie_flips]
    viol = [d._replace(prompt=d.prompt + offset) for d in b.violations]
    return ForcingReport(a.positions_compared + b.positions_compared,
                         a.positions_expected + b.positions_expected, a.exact + b.exact,
                         a.tolerance, a.near_tie_flips + shift, a.violations + viol)
