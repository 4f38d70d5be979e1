"""The measured bench on a real model pair: HF baselines and SpecPilot's decoders side by side.

In order: load the pair → encode the workload → the stock reference (greedy AR, batch 1) →
for each batch size, each system: set-up, warm-up, timed runs, correctness check → speedups →
acceptance profiles of the speculative systems → one result document.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from specpilot.ir import CaptureGraphs, apply, load_program, program_id, stock_program
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import ARResult
from specpilot.runtime.decoder import load_pair, needs_own_pair

from .hf_systems import HFAssisted, HFGreedy, HFModels
from .interleave import measure_interleaved
from .measure import add_speedups, measure, skipped_row
from .replay import AcceptanceProfile
from .systems import EagerAR, ProgramSystem, StrongAR, StrongARRefill, System
from .workload import encode_prompts, stock_reference

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class PairBenchSettings:
    pair: str
    batch_sizes: Sequence[int] = (1, 4, 16, 64)
    max_new_tokens: int = 256
    prompts: Optional[int] = None           # None: the whole workload
    workload: str = "humaneval"
    repeats: int = 3
    eager_repeats: Optional[int] = None     # timed runs of HF and eager systems (None: repeats)
    warmup: int = 1
    programs: Sequence[str] = ()            # Program JSON files
    systems: Optional[Sequence[str]] = None  # None: every builtin plus every --program
    device: Optional[str] = None
    dtype: Optional[str] = None
    name: Optional[str] = None
    time_budget_s: Optional[float] = None    # cells not started by then are recorded as skipped
    mechanisms: bool = False                 # add the mechanism Programs (mechanism_programs.py)
    interleave: bool = False                 # our systems timed side by side (interleave.py)


def pair_dirs(pair: str):
    """(target_dir, drafter_dir) of a pair folder; a clear error if either is missing."""
    dirs = tuple(os.path.join(pair, role) for role in ("target", "drafter"))
    for d in dirs:
        if not os.path.isfile(os.path.join(d, "config.json")):
            raise SpecPilotError(f"--pair {pair!r} must hold target/ and drafter/ HF checkpoint "
                                 f"folders (as `specpilot zoo train --out DIR` writes); "
                                 f"{d!r} has no config.json")
    return dirs


def program_systems(settings: PairBenchSettings, target_dir: str, drafter_dir: str, dtype: str,
                    gpu: str, pair, benched: Sequence[Sequence[int]]) -> List[ProgramSystem]:
    """The stock Program's systems, the mechanisms' (with `--mechanisms`; the shaped tree is
    profiled on the workload's prompts after the `benched` ones) and every `--program`."""
    from specpilot.deploy import build_deployment

    stock = stock_program(build_deployment(target_dir, drafter_dir, gpu=gpu, dtype=dtype))
    out = [ProgramSystem("stock", stock, pair,
                         f"SpecPilot stock Program: {stock.draft.topology}, torch backend, eager")]
    graphed = apply(stock, CaptureGraphs(on=True))
    out.append(ProgramSystem("stock_graphed", graphed, pair,
                             f"SpecPilot stock Program + CaptureGraphs: "
                             f"{graphed.draft.topology}, each round one CUDA graph",
                             graphs_only=True))
    if settings.mechanisms:
        from .mechanism_programs import mechanism_systems
        from .shaped_tree_system import HeldOutProfile, held_out_prompts

        held_out = held_out_prompts(encode_prompts(pair, settings.workload, None), len(benched))
        profile = HeldOutProfile(pair, held_out or benched, settings.max_new_tokens,
                                 benched=not held_out)
        out += mechanism_systems(stock, pair, profile)
    for path in settings.programs:
        program = load_program(path)
        if program.models.target.dtype != dtype:
            raise SpecPilotError(f"Program {path} computes in {program.models.target.dtype} but "
                                 f"the bench runs {dtype}: pass --dtype "
                                 f"{program.models.target.dtype} or use a matching Program")
        stem = os.path.splitext(os.path.basename(path))[0]
        # A Program built unlike the stock pair (its own kernels, formats or fast path) gets
        # models built for it, so that it is timed as the decoder it describes.
        own = (load_pair(target_dir, drafter_dir, dtype, pair.target.device.type,
                         program=program) if needs_own_pair(program) else pair)
        out.append(ProgramSystem(f"program:{stem}", program, own))
    return out


def select_systems(available: Dict[str, System], wanted: Optional[Sequence[str]]) -> List[System]:
    names = list(available) if wanted is None else list(wanted)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise SpecPilotError(f"unknown system(s) {', '.join(unknown)}; known: "
                             f"{', '.join(available)}")
    return [available[n] for n in names]


def run_pair_bench(settings: PairBenchSettings, progress: Callable[[str], None],
                   environment: dict, on_row: Optional[Callable[[dict], None]] = None) -> tuple:
    """Run the bench; returns (result document, {system: {batch: AcceptanceProfile}}), a
    profile for each speculative system's measured batch sizes (`widest_profile` picks the one
    a --shapes replay wants). `on_row` gets the document as it stands after every measured cell
    (to keep partial results)."""
    from specpilot.deploy import detect_gpu

    started = time.perf_counter()
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = settings.dtype or ("bfloat16" if device == "cuda" else "float32")
    target_dir, drafter_dir = pair_dirs(settings.pair)
    progress(f"[bench] loading {settings.pair} ({dtype}, {device})")
    pair = load_pair(target_dir, drafter_dir, dtype, device)
    # Larger batches take more distinct prompts than --prompts where the workload has them.
    prompts = encode_prompts(pair, settings.workload, settings.prompts)
    if settings.prompts is not None and max(settings.batch_sizes) > settings.prompts:
        more = encode_prompts(pair, settings.workload, None)
        prompts = more[:max(settings.prompts, max(settings.batch_sizes))]
    progress(f"[bench] {len(prompts)} prompts; stock reference, {settings.max_new_tokens} "
             f"new tokens each")
    reference = stock_reference(pair, prompts, settings.max_new_tokens)

    hf = HFModels(settings.pair, DTYPES[dtype], device, pair.eos_ids)
    available: Dict[str, System] = {"hf_ar": HFGreedy(hf), "hf_assisted": HFAssisted(hf),
                                    "ar_torch": EagerAR(pair), "strong_ar": StrongAR(pair),
                                    "strong_ar_refill": StrongARRefill(pair)}
    gpu = detect_gpu() if device == "cuda" else "cpu"
    for s in program_systems(settings, target_dir, drafter_dir, dtype, gpu, pair, prompts):
        available[s.name] = s
    systems = select_systems(available, settings.systems)

    rows, profiles = [], {}

    def document() -> dict:
        return {
            "kind": "measured", "name": settings.name or default_name(settings.pair),
            "environment": environment,
            "settings": {"pair": os.path.abspath(settings.pair), "workload": settings.workload,
                         "prompts": len(prompts), "base_prompts": settings.prompts,
                         "max_new_tokens": settings.max_new_tokens,
                         "batch_sizes": list(settings.batch_sizes), "repeats": settings.repeats,
                         "eager_repeats": repeats_of(settings, None),
                         "warmup": settings.warmup, "dtype": dtype, "device": device,
                         "systems": [s.name for s in systems],
                         "time_budget_s": settings.time_budget_s,
                         "interleave": settings.interleave},
            "reference": {"decoder": ("stock: greedy AR, torch backend, batch 1" +
                                      (", decode steps replayed from a CUDA graph"
                                       if device == "cuda" else "")),
                          "requests": len(reference.tokens),
                          "tokens": sum(len(t) for t in reference.tokens)},
            "systems": [{"name": s.name, "family": s.family, "description": s.description,
                         "notes": list(s.notes)} for s in systems],
            "rows": rows,
        }

    def spent() -> Optional[str]:
        """Why no more cells start (the time budget is spent), or None."""
        elapsed = time.perf_counter() - started
        if settings.time_budget_s is not None and elapsed > settings.time_budget_s:
            return f"time budget of {settings.time_budget_s:.0f} s spent ({elapsed:.0f} s elapsed)"
        return None

    def cell_inputs(b: int):
        n = workload_size(len(prompts), settings.prompts, b)
        return prompts[:n], ARResult(reference.tokens[:n], reference.margins[:n], 0)

    def record(system: System, b: int, row: dict, output) -> None:
        if row["status"] != "measured":
            progress(f"  {system.name} at batch {b}: {row['status']}: {row['reason']}")
        rows.append(row)
        if output is not None and output.accepted_lengths is not None:
            profiles.setdefault(system.name, {})[b] = _profile(system, output, settings,
                                                                pair, b, dtype)
        if on_row is not None:
            add_speedups(rows)
            on_row(document())

    # Our graphed systems first (quick, and their peak memory is measured without the HF
    # models resident), then the HF baselines, then our eager systems: a time budget that runs
    # out cuts the slowest measurements, and the HF models are released before the eager ones.
    ordered = sorted(systems, key=lambda s: 1 if s.family == "hf" else (0 if s.graphed else 2))
    # With --interleave our systems that take the same timed runs are measured side by side,
    # batch size by batch size, before the rest.
    together = [s for s in ordered if settings.interleave and s.family != "hf"
                and repeats_of(settings, s) == settings.repeats]
    for b in (settings.batch_sizes if together else ()):
        reason = spent()
        if reason:
            rows.extend(skipped_row(s, b, reason) for s in together)
            continue
        progress(f"[bench] {len(together)} systems side by side at batch {b} "
                 f"({time.perf_counter() - started:.0f} s elapsed)")
        cell_prompts, part = cell_inputs(b)
        measured = measure_interleaved(together, cell_prompts, part, b, settings.max_new_tokens,
                                       settings.warmup, settings.repeats, device, progress)
        for system, (row, output) in zip(together, measured):
            record(system, b, row, output)
    for i, system in enumerate(ordered):
        for b in (() if system in together else settings.batch_sizes):   # measured above
            reason = spent()
            if reason:
                rows.append(skipped_row(system, b, reason))
                continue
            progress(f"[bench] {system.name} at batch {b} "
                     f"({time.perf_counter() - started:.0f} s elapsed)")
            cell_prompts, part = cell_inputs(b)
            row, output = measure(system, cell_prompts, part, b, settings.max_new_tokens,
                                  settings.warmup, repeats_of(settings, system), device, progress)
            record(system, b, row, output)
        if system.family == "hf" and all(s.family != "hf" for s in ordered[i + 1:]):
            hf.release()
    add_speedups(rows)
    return document(), profiles


def repeats_of(settings: PairBenchSettings, system: Optional[System]) -> int:
    """Timed runs of `system`: the graphed ones take `repeats`; HF and eager systems take
    `eager_repeats` where given (on a slow host one run of them takes minutes). With `system`
    None: the eager systems' count."""
    eager = settings.repeats if settings.eager_repeats is None else settings.eager_repeats
    return settings.repeats if system is not None and system.graphed else eager


def workload_size(available: int, base: Optional[int], batch: int) -> int:
    """Prompts measured at `batch`: `base` (all when None), but at least one batch of distinct
    prompts where the workload has them, so large batches are not repeats of a few prompts
    while the slow batch-1 baselines stay affordable."""
    if base is None:
        return available
    return min(available, max(base, batch))


def default_name(pair: str) -> str:
    return os.path.basename(os.path.normpath(pair)) or "pair"


def widest_profile(by_batch: Dict[int, AcceptanceProfile]) -> AcceptanceProfile:
    """The profile with the most distinct requests (the smaller batch where they tie): a replay
    at batch 64 wants 64 of them, not the 4 of batch 1 cycled (a batch's tail is its slowest
    request)."""
    return max(sorted(by_batch.items()), key=lambda kv: (len(kv[1].accepted_lengths), -kv[0]))[1]


def _profile(system: ProgramSystem, output, settings, pair, batch: int,
             dtype: str) -> AcceptanceProfile:
    """The acceptance profile of a speculative system's first timed run at batch `batch`."""
    return AcceptanceProfile(
        topology=system.at_batch(batch).draft.topology,
        accepted_lengths=[list(a) for a in output.accepted_lengths],
        new_tokens=[len(t) for t in output.tokens],
        source={"pair": os.path.abspath(settings.pair), "system": system.name,
                "program_id": program_id(system.at_batch(batch)), "workload": settings.workload,
                "max_new_tokens": settings.max_new_tokens, "batch_size": batch, "dtype": dtype,
                "target_dims": _dims(pair.target), "drafter_dims": _dims(pair.drafter)})


def _dims(model) -> dict:
    c = model.config
    return {"hidden": c.hidden_size, "layers": c.num_layers, "vocab": c.vocab_size}
