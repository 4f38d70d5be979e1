"""Compile recorded Triton launches (codegen/launch_record.py) for a GPU without having one.

Triton's compiler needs no GPU to turn a kernel into a cubin: only its target (compute
capability, warp size). Here the active driver is replaced, for the whole process, by one that
names the target and launches nothing, and each record is compiled through the kernel's own
`warmup` (the path a launch takes, without the launch). What a launch on that GPU would then
refuse is checked too: shared memory past the target's per-block limit, more threads than a
block may have. Registers and the stack frame per thread (where spilled registers go) come
from the cubin (cuobjdump) where the tool is found.

The compiler cannot run in a process whose kernels are interpreted (TRITON_INTERPRET=1 is read
when triton is imported), so `compile_in_subprocess` runs this module as a worker:

    python -m specpilot.codegen.target_compile LAUNCHES.jsonl... --arch sm_90 [--json RESULT.json]

prints one line per distinct record (only the failures with --quiet), then a table by kernel
module, and exits 1 when any fails to compile or would not launch. The Triton that compiles is
the worker's: to compile with the GPU machine's version, run the worker from an environment that
holds it (`compile_in_subprocess(..., python=...)`, or that environment's `python -m ...`).
The test suite records every launch it interprets when SPECPILOT_RECORD_LAUNCHES=FILE is set
(tests/conftest.py; one FILE.<worker>.jsonl per pytest worker).
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from specpilot.ir.errors import SpecPilotError

from .launch_record import LaunchRecord, Launches, module_name


@dataclass(frozen=True)
class Target:
    """What the compiler and the launch checks need of a GPU."""
    capability: int
    warp_size: int
    max_shared_bytes: int      # per block, opted in (what a kernel may use)
    max_threads: int = 1024


# Hopper (H100/H200): compute capability 9.0; 227 KB of shared memory per block when opted in.
TARGETS = {"sm_90": Target(90, 32, 232448)}


class TargetCompileError(SpecPilotError):
    """A target this module does not know, or a worker that did not answer."""


@dataclass(frozen=True)
class CompileResult:
    """One record compiled: `error` is None when it compiled and would launch."""
    label: str
    error: Optional[str] = None
    shared_bytes: Optional[int] = None
    num_warps: Optional[int] = None
    registers: Optional[int] = None
    stack_bytes: Optional[int] = None       # per thread: stack frame and local memory

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        if not self.ok:
            return f"FAIL {self.label}: {self.error}"
        usage = f"shared {self.shared_bytes} B, {self.num_warps} warps"
        if self.registers is not None:
            usage += f", {self.registers} registers, {self.stack_bytes} B stack"
        return f"ok   {self.label}: {usage}"


def target_of(arch: str) -> Target:
    if arch not in TARGETS:
        raise TargetCompileError(f"unknown GPU architecture {arch!r}; known: {sorted(TARGETS)}")
    return TARGETS[arch]


# ---------------------------------------------------------------------------- the worker side

class _TargetDriver:
    """The driver Triton asks for the current target, device and stream; it launches nothing."""

    def __init__(self, target: Target):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", target.capability, target.warp_size)

    def is_active(self) -> bool:
        return True

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0


class _Pointer:
    """A tensor argument as the compiler specialises on it: its dtype and its alignment."""

    def __init__(self, dtype, aligned: bool):
        self.dtype, self._address = dtype, 0 if aligned else 4

    def data_ptr(self) -> int:
        return self._address


def _argument(desc: Dict[str, Any]) -> Any:
    import torch

    if "tensor" in desc:
        return _Pointer(getattr(torch, desc["tensor"]), desc["aligned"])
    if "value" in desc:
        return desc["value"]
    if "none" in desc:
        return None
    if "interpreter_flag" in desc:     # True only where the kernel is interpreted
        return False
    raise TypeError(f"an argument of type {desc.get('unsupported')} cannot be rebuilt")


_modules: Dict[str, Any] = {}
_counter = itertools.count()


def _source_file(folder: Path, record: LaunchRecord) -> Path:
    return folder / f"{Path(record.source).stem}_{record.digest}.py"


def _kernel(record: LaunchRecord, sources: Path):
    """The record's kernel, from its module's text as recorded (written to `sources`)."""
    if record.digest not in _modules:
        path = _source_file(sources, record)
        spec = importlib.util.spec_from_file_location(f"target_compiled_{next(_counter)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[record.digest] = module
    fn = getattr(_modules[record.digest], record.kernel)
    if not hasattr(fn, "warmup"):
        raise TypeError(f"{record.kernel} is not a compiled Triton kernel here "
                        "(is TRITON_INTERPRET set in the worker?)")
    return fn


_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) .*?LOCAL:(\d+)")


def _resources(cubin: bytes) -> Optional[tuple]:
    """(registers, stack and local bytes per thread) from cuobjdump, or None without it."""
    try:
        from triton import knobs

        tool = knobs.nvidia.cuobjdump.path
    except Exception:   # a Triton without the knob or the bundled tool
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                                  check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    found = _USAGE.search(text)
    return (int(found.group(1)), int(found.group(2)) + int(found.group(3))) if found else None


def compile_one(record: LaunchRecord, target: Target, sources: Path) -> CompileResult:
    try:
        fn = _kernel(record, sources)
        args = [_argument(dict(a)) for a in record.args]
        kwargs = {name: _argument(dict(v)) for name, v in record.kwargs}
        compiled = fn.warmup(*args, grid=(1,), **kwargs)
    except Exception as exc:   # the compiler's own errors are many types; each is this record's
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        return CompileResult(record.label, error=message[:2000])
    shared, warps = int(compiled.metadata.shared), int(compiled.metadata.num_warps)
    usage = _resources(compiled.asm["cubin"]) if "cubin" in compiled.asm else None
    registers, stack = usage if usage else (None, None)
    error = None
    if shared > target.max_shared_bytes:
        error = (f"needs {shared} B of shared memory, the GPU has {target.max_shared_bytes} "
                 "per block")
    elif warps * target.warp_size > target.max_threads:
        error = f"{warps} warps exceed {target.max_threads} threads per block"
    return CompileResult(record.label, error, shared, warps, registers, stack)


def compile_records(launches: Launches, arch: str, progress=None) -> List[CompileResult]:
    """Compile every record for `arch` in this process, which must not interpret kernels. The
    process's Triton driver is replaced for good: run this in a process of its own."""
    from triton import knobs
    from triton.runtime.driver import driver

    if knobs.runtime.interpret:
        raise TargetCompileError("kernels are interpreted in this process (TRITON_INTERPRET); "
                                 "use compile_in_subprocess")
    target = target_of(arch)
    driver.set_active(_TargetDriver(target))
    results, records = [], launches.records
    with tempfile.TemporaryDirectory(prefix="specpilot-kernel-sources-") as tmp:
        for record in records:
            path = _source_file(Path(tmp), record)
            if not path.exists():
                path.write_text(launches.sources[record.digest], encoding="utf-8")
        for i, record in enumerate(records, 1):
            results.append(compile_one(record, target, Path(tmp)))
            if progress:
                progress(f"[{i}/{len(records)}] {results[-1].line()}")
    return results


# ---------------------------------------------------------------------------- the caller side

def compile_in_subprocess(launches: Launches, arch: str, timeout: float = 1800,
                          python: Optional[str] = None) -> List[CompileResult]:
    """compile_records in a worker process with the interpreter off (this process may have it
    on). `python` is the worker's interpreter (this one by default): one whose environment
    holds another Triton compiles with that version, e.g. the GPU machine's. A worker that
    cannot start, crashes or runs past `timeout` seconds is a TargetCompileError."""
    target_of(arch)
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="specpilot-target-compile-") as tmp:
        path, result = Path(tmp) / "launches.jsonl", Path(tmp) / "result.json"
        launches.save(path)
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        try:
            done = subprocess.run([python, "-m", "specpilot.codegen.target_compile",
                                   str(path), "--arch", arch, "--json", str(result), "--quiet"],
                                  env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TargetCompileError(f"compiling {len(launches.records)} launches for {arch} took "
                                     f"longer than {timeout:.0f} s") from None
        except OSError as exc:
            raise TargetCompileError(f"the compile worker's interpreter {python!r} cannot be "
                                     f"started: {exc}") from None
        if not result.exists():
            raise TargetCompileError(f"the compile worker ({python}) exited with "
                                     f"{done.returncode} and no result:\n{done.stderr[-4000:]}")
        answer = json.loads(result.read_text(encoding="utf-8"))
        return [CompileResult(**r) for r in answer["results"]]


def summary(results: List[CompileResult]) -> str:
    """A Markdown table by kernel module (`module_name` of its label): launches, failures, and
    the most registers, stack bytes and shared memory any of its launches needs."""
    groups: Dict[str, List[CompileResult]] = {}
    for r in results:
        groups.setdefault(module_name(r.label), []).append(r)

    def most(rs, name):
        values = [getattr(r, name) for r in rs if getattr(r, name) is not None]
        return str(max(values)) if values else "–"

    lines = ["| kernels | launches | failed | registers (max) | stack B (max) | shared B (max) |",
             "|---|---|---|---|---|---|"]
    for name, rs in sorted(groups.items()):
        lines.append(f"| {name} | {len(rs)} | {sum(not r.ok for r in rs)} | "
                     f"{most(rs, 'registers')} | {most(rs, 'stack_bytes')} | "
                     f"{most(rs, 'shared_bytes')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import triton       # this process's Triton is the one that compiles (its version is reported)

    parser = argparse.ArgumentParser(
        prog="python -m specpilot.codegen.target_compile",
        description="Compile recorded Triton launches for a GPU (no GPU needed).")
    parser.add_argument("launches", nargs="+",
                        help="files of JSON lines written by codegen/launch_record.py")
    parser.add_argument("--arch", default="sm_90", choices=sorted(TARGETS))
    parser.add_argument("--json", metavar="FILE", help="write the results here as JSON")
    parser.add_argument("--quiet", action="store_true", help="print only the failures")
    args = parser.parse_args(argv)
    launches = Launches()
    try:
        for path in args.launches:
            launches.merge(Launches.load(path))
    except (OSError, SpecPilotError) as exc:
        print(f"target_compile: error: {exc}", file=sys.stderr)
        return 2
    show = None if args.quiet else (lambda line: print(line, flush=True))
    results = compile_records(launches, args.arch, progress=show)
    compiler = f"triton {triton.__version__}"
    if args.json:
        answer = {"arch": args.arch, "compiler": compiler,
                  "results": [asdict(r) for r in results]}
        partial = Path(f"{args.json}.partial")
        partial.write_text(json.dumps(answer, indent=1), encoding="utf-8")
        os.replace(partial, args.json)
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(r.line(), file=sys.stderr)
    print(summary(results))
    print(f"{len(results) - len(failed)} of {len(results)} launches compile for {args.arch} "
          f"({compiler})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
