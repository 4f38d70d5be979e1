"""Run a Program: load its model pair, decode with its topology and batch layout, and force it
against the stock decoder (plain greedy AR of the target)."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence

import torch

from specpilot.ir import KernelsSpec, Program
from specpilot.ir.formats import DENSE_FORMATS
from specpilot.ir.prune import LowPrecisionPrune
from specpilot.ir.errors import SpecPilotError

from .acceptance import greedy_accept
from .ar import ARResult, generate_ar
from .checkpoint import check_same_vocabulary, load_tokenizer
from .errors import CheckpointError
from .forcing import ForcingReport
from .graphed_program import decoder_for, force_graphed, graph_refusal, run_graphed
from .model import Transformer
from .mechanisms import force_program_decode, run_program_decode
from .speculative import SpecResult
from .fast_ops import LAYERS, OFF, OPS, compile_refusal, fast_ops_mode
from .torch_backend import TorchBackend


class UnsupportedProgram(SpecPilotError):
    """A Program this runtime cannot execute (yet); the message names the attribute."""


@dataclass
class ModelPair:
    target: Transformer
    drafter: Optional[Transformer]   # or a FusedForward around one (kernels.drafter_kernels)
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
              device: Optional[str] = None, program: Optional[Program] = None,
              kernel_cache=None, fast_path: Optional[bool] = None) -> ModelPair:
    """Load target (and drafter) for decoding; a clear error if they do not share a vocabulary.

    With `program`, each model is built the way the Program runs it: in the Program's dtype,
    with its kernel backend (`generated`: the Program's own kernels, built into `kernel_cache`)
    and its per-linear weight formats. Without, both use the torch backend with dense weights.

    `fast_path` (default: `cuda_fast_path`) loads torch-backend models with q/k/v and gate/up
    fused and the backend's fused kernels: compiled op by op, or as whole layers, as the
    Program's kernels.fast_path says (op by op without a Program); SPECPILOT_FAST_OPS overrides
    it ("ops", "layers", or "0" for none; runtime/fast_ops.py).

    Where the Program's kernels.drafter_kernels is "fused", the drafter runs in the fused layer
    kernels (a FusedForward around the loaded model, its kernels built into `kernel_cache`); a
    drafter they cannot run is refused with the reason (SpecPilotError). Where its
    kernels.attention_kernels is "generated", both models' torch backends run attention by the
    generated kernel (runtime/generated_attention.py), built into `kernel_cache` too.
    """
    device = device or default_device()
    fast = cuda_fast_path(device, program) if fast_path is None else fast_path
    if program is not None:
        check_runnable(program)
        if dtype != program.models.target.dtype:
            raise SpecPilotError(f"dtype {dtype} disagrees with the Program's dtype "
                                 f"{program.models.target.dtype}")

    def model(folder: str, role: str) -> Transformer:
        if program is not None and program.kernels.backend != "torch":
            spec = getattr(program.models, role)
            return Transformer.from_checkpoint(folder, spec.dtype, device,
                                               backend=generated_backend(program, role,
                                                                         kernel_cache),
                                               weight_formats=spec.formats())
        wanted = program.kernels.fast_path if program is not None else OPS
        attention = program.kernels.attention_kernels if program is not None else "model"
        backend = TorchBackend(fast_ops=fast_ops_mode(wanted) if fast else OFF,
                               attention_kernels=attention, kernel_cache=kernel_cache)
        if program is None:
            return Transformer.from_checkpoint(folder, dtype, device, backend=backend,
                                               fuse_projections=fast)
        spec = getattr(program.models, role)
        built = Transformer.from_checkpoint(folder, spec.dtype, device, backend=backend,
                                            weight_formats=spec.formats(), fuse_projections=fast)
        # Refused on loading, not at its first forward; a drafter never run needs no kernel.
        if attention == "generated" and (role == "target" or program.draft.speculates):
            check_generated_attention(built, role)
        return built

    target = model(target_dir, "target")
    tokenizer = load_tokenizer(target_dir)
    drafter = None
    if drafter_dir is not None:
        drafter = model(drafter_dir, "drafter")
        check_same_vocabulary(target.config, drafter.config, tokenizer, load_tokenizer(drafter_dir),
                              target_dir, drafter_dir)
    pair = ModelPair(target, drafter, tokenizer, tuple(target.config.eos_token_ids))
    if drafter is not None and program is not None and program.kernels.drafter_kernels == "fused":
        pair = with_fused_drafter(pair, kernel_cache)
    return pair


def with_fused_drafter(pair: "ModelPair", kernel_cache=None) -> "ModelPair":
    """`pair` (sharing its models) with its drafter run by the fused layer kernels, as a
    Program whose kernels.drafter_kernels is "fused" runs it; a SpecPilotError saying why the
    drafter cannot be."""
    if pair.drafter is None:
        raise SpecPilotError("the pair has no drafter")
    # Imported here: only a Program that asks for fused drafter kernels needs them.
    from .fused_forward import FusedForward
    return replace(pair, drafter=FusedForward(pair.drafter, kernel_cache))


def with_generated_attention(pair: "ModelPair", kernel_cache=None) -> "ModelPair":
    """`pair` (sharing its weights) with both models' attention run by the generated kernel, as
    a Program whose kernels.attention_kernels is "generated" runs it; a fused drafter keeps its
    own kernels (its unfused model, for long prefills, gets the generated attention too). A
    SpecPilotError says why a model cannot be."""
    def backend_for(model, role: str) -> TorchBackend:
        backend = getattr(model, "backend", None)
        if not isinstance(backend, TorchBackend):
            raise SpecPilotError(f"the generated attention replaces the torch backend's; this "
                                 f"model runs the {getattr(backend, 'name', backend)} backend")
        check_generated_attention(model, role)
        return backend.with_generated_attention(kernel_cache)

    return _with_backends(pair, backend_for)


def with_fast_path(pair: "ModelPair", fast_path: str) -> "ModelPair":
    """`pair` (sharing its weights) with its torch-backend models on `fast_path` ("ops" or
    "layers"), as a Program whose kernels.fast_path says so loads them; each model keeps its
    attention kernels, and a fused drafter its kernels (its unfused model, for long prefills,
    changes path). The models must have been loaded on the fast path (projections fused)."""
    if fast_path not in (OPS, LAYERS):
        raise SpecPilotError(f"fast_path must be {OPS!r} or {LAYERS!r}, got {fast_path!r}")

    def backend_for(model, role: str) -> TorchBackend:
        backend = getattr(model, "backend", None)
        if not isinstance(backend, TorchBackend) or not backend.fast_ops:
            raise SpecPilotError(f"the {role} is not a torch-backend model on the fast path: "
                                 f"load the pair with the fast path first")
        return TorchBackend(fast_ops=fast_path, attention_kernels=backend.attention_kernels,
                            kernel_cache=backend.attention_kernel_cache)

    return _with_backends(pair, backend_for)


def _with_backends(pair: "ModelPair", backend_for) -> "ModelPair":
    """`pair` with each model a weight-sharing copy that runs `backend_for(model, role)`
    (`Transformer.with_backend`: on compiled layers, blocks of its own). A fused drafter keeps
    its fused kernels and weights; only its unfused model (long prefills) changes."""
    from .fused_forward import FusedForward

    def rebuilt(model, role: str):
        if model is None:
            return None
        if isinstance(model, FusedForward):
            out = copy.copy(model)
            out.model = rebuilt(model.model, role)
            return out
        return model.with_backend(backend_for(model, role))

    return replace(pair, target=rebuilt(pair.target, "target"),
                   drafter=rebuilt(pair.drafter, "drafter"))


def check_generated_attention(model, role: str) -> None:
    """Refuse, when it is loaded rather than at its first forward, a model the generated
    attention cannot run (runtime/generated_attention.py says why)."""
    from .generated_attention import generated_attention_refusal
    why = generated_attention_refusal(model.device, model.dtype, model.config.head_dim)
    if why is not None:
        raise SpecPilotError(f"the generated attention cannot run the {role}: {why}")


def needs_own_pair(program: Program) -> bool:
    """Whether `program`'s models must be built for it: another backend, non-dense weight
    formats, kernel overrides, another fast path, other drafter or attention kernels than a pair
    loaded without a Program has."""
    dense = all(fmt in DENSE_FORMATS for role in ("target", "drafter")
                for _, fmt in getattr(program.models, role).weight_formats)
    k = program.kernels
    return (k.backend != "torch" or not dense or bool(k.overrides)
            or k.fast_path != KernelsSpec.fast_path
            or k.drafter_kernels != KernelsSpec.drafter_kernels
            or k.attention_kernels != KernelsSpec.attention_kernels)


def cuda_fast_path(device, program: Optional[Program] = None) -> bool:
    """Whether models load with the CUDA fast path: on a CUDA device with the torch backend.
    (On the CPU the stock decoder is compared with HF bit for bit in float32, so it keeps the
    reference ops and unfused projections.)"""
    return (torch.device(device).type == "cuda"
            and (program is None or program.kernels.backend == "torch"))


def generated_backend(program: Program, role: str, kernel_cache=None):
    """The generated backend that runs `role`'s model of `program` (kernels.backend
    "generated"; `load_pair` builds torch backends itself, with the Program's fast path and
    attention kernels)."""
    if program.kernels.backend != "generated":
        raise SpecPilotError(f"kernels.backend {program.kernels.backend!r} is not the generated "
                             f"backend")
    # Lowering and the kernel builders are only needed, and only imported, for generated kernels.
    from specpilot.codegen.lower import lower_program

    from .generated_backend import GeneratedBackend
    return GeneratedBackend(lower_program(program), kernel_cache, role=role)


def check_runnable(program: Program) -> None:
    """Refuse, with the reason, Programs whose mechanisms this runtime does not execute."""
    backend = program.kernels.backend
    if backend not in ("torch", "generated"):
        raise UnsupportedProgram(f"kernels.backend {backend!r}: this runtime executes the 'torch' "
                                 f"and 'generated' backends")
    if isinstance(program.verify.prune, LowPrecisionPrune) and backend == "generated":
        raise UnsupportedProgram("verify.prune low_precision casts dense torch weights: it runs with "
                                 "kernels.backend 'torch' only")
    if program.verify.acceptance != "greedy":
        raise UnsupportedProgram(f"verify.acceptance {program.verify.acceptance!r}: only 'greedy'")
    for role in ("target", "drafter"):
        spec = getattr(program.models, role)
        for linear, fmt in spec.weight_formats:
            if fmt in DENSE_FORMATS:
                continue
            if fmt != "lossless12" or backend != "generated":
                raise UnsupportedProgram(
                    f"models.{role}.weight_formats[{linear}] = {fmt!r}: the {backend} backend runs "
                    "dense formats only; packed formats need kernels.backend 'generated'")
            if spec.dtype != "bfloat16":
                raise UnsupportedProgram(f"models.{role}.weight_formats[{linear}] = 'lossless12' "
                                         f"packs bfloat16 weights, but the {role} computes in {spec.dtype}")


def check_pair_runs(program: Program, pair: ModelPair) -> None:
    """Refuse a pair whose models were built for another backend, another fast path, other
    drafter or attention kernels than the Program's."""
    from .fused_forward import FusedForward

    fused = isinstance(pair.drafter, FusedForward)
    if pair.drafter is not None and fused != (program.kernels.drafter_kernels == "fused"):
        built = "fused" if fused else "model"
        raise UnsupportedProgram(
            f"the drafter was loaded with {built!r} drafter kernels but the Program runs "
            f"kernels.drafter_kernels {program.kernels.drafter_kernels!r}: load the pair with "
            "load_pair(..., program=program)")
    wanted = fast_ops_mode(program.kernels.fast_path)
    for role, model in (("target", pair.target), ("drafter", pair.drafter)):
        if model is None:
            continue
        backend = getattr(model, "backend", None)
        built = getattr(backend, "name", None)
        if built is not None and built != program.kernels.backend:
            raise UnsupportedProgram(
                f"the {role} was loaded with the {built} backend but the Program runs "
                f"kernels.backend {program.kernels.backend!r}: load the pair with "
                "load_pair(..., program=program)")
        # A fast-path model built op by op where the Program compiles whole layers (or the
        # reverse) would be timed as another decoder than the Program's.
        mode = getattr(backend, "fast_ops_mode", OFF)
        if mode != OFF and wanted != OFF and mode != wanted and (
                wanted == OPS or compile_refusal() is None):
            raise UnsupportedProgram(
                f"the {role} was loaded with the {mode!r} fast path but the Program runs "
                f"kernels.fast_path {program.kernels.fast_path!r}: load the pair with "
                "load_pair(..., program=program)")
        # Attention by another kernel would time (and force) another decoder than the Program's.
        attention = getattr(backend, "attention_kernels", None)
        if built == "torch" and attention != program.kernels.attention_kernels:
            raise UnsupportedProgram(
                f"the {role} was loaded with {attention!r} attention kernels but the Program "
                f"runs kernels.attention_kernels {program.kernels.attention_kernels!r}: load the "
                "pair with load_pair(..., program=program)")


def acceptance_rule(program: Program, pair: ModelPair):
    """The Program's greedy acceptance: the generated kernel where the target runs generated
    kernels, else the torch rule."""
    if program.kernels.backend == "generated":
        return pair.target.backend.accept_greedy
    return greedy_accept


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
    """Decode with the Program's topology and batching mechanisms (runtime/mechanisms.py), or,
    where `kernels.capture_graphs` is on and the GPU can replay its rounds, with the graphed
    runtime (runtime/graphed_program.py; capture happens before the clock starts). A Program
    that does not speculate decodes with greedy AR of the target (graphed steps where capture
    is on, otherwise `generate_ar`, or the refill loop run eagerly with continuous refill) and
    needs no drafter in `pair`."""
    check_runnable(program)
    if pair.drafter is None and program.draft.speculates:
        raise SpecPilotError("this Program speculates: give a drafter checkpoint")
    check_pair_runs(program, pair)
    if graph_refusal(program, pair.target.device) is None:
        prompts = list(prompts)
        decoder_for(program, pair, prompts, max_new_tokens)
        _sync(pair.target.device)
        start = time.perf_counter()
        r = run_graphed(program, pair, prompts, max_new_tokens)
        _sync(pair.target.device)
        return TimedRun(r.tokens, time.perf_counter() - start, r.target_forwards, r.mean_accepted)
    accept = acceptance_rule(program, pair)
    _sync(pair.target.device)
    start = time.perf_counter()
    r: SpecResult = run_program_decode(program, pair.target, pair.drafter, list(prompts),
                                       max_new_tokens, pair.eos_ids, acceptance=accept)
    _sync(pair.target.device)
    return TimedRun(r.tokens, time.perf_counter() - start, r.target_forwards, r.mean_accepted)


def force_program(program: Program, pair: ModelPair, prompts, reference: ARResult,
                  tolerance: Optional[float] = None) -> ForcingReport:
    """Token-force the Program against `reference` (see runtime/forcing.py)."""
    check_runnable(program)
    check_pair_runs(program, pair)
    if graph_refusal(program, pair.target.device) is None:
        return force_graphed(program, pair, list(prompts), reference, tolerance)
    accept = acceptance_rule(program, pair)
    return force_program_decode(program, pair.target, pair.drafter, list(prompts), reference,
                                tolerance, acceptance=accept)


