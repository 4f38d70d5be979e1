"""Content-addressed kernel cache and the Triton module builder.

A built kernel is stored under a key that is the sha256 of its rendered source plus the
toolchain that will compile it (python, torch, triton, and nvcc for CUDA), so any change to the
template, the spec or the toolchain gives a new entry and nothing is ever invalidated by hand.
Files are written to a temporary name and renamed into place (os.replace), so a reader never
sees half a file; a build that fails removes what it wrote, so the cache only ever holds
kernels that built.

Root: the `cache_dir` argument, else $SPECPILOT_CACHE/kernels, else ~/.cache/specpilot/kernels.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import platform
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .errors import BuildError
from .kernel_spec import KernelSpec
from .render import render_kernel

_module_counter = itertools.count()


def default_cache_dir() -> Path:
    base = os.environ.get("SPECPILOT_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "specpilot"
    return root / "kernels"


def python_toolchain() -> Dict[str, str]:
    """Versions that decide what a generated Triton module compiles to."""
    import torch
    import triton
    return {"python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__}


def triton_interpreting() -> bool:
    """Whether kernels decorated now run in Triton's CPU interpreter."""
    import triton
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_refusal(device) -> Optional[str]:
    """Why Triton kernels cannot run on `device` here (None when they can): off a CUDA device
    they need Triton's interpreter."""
    import torch
    device = torch.device(device)
    if device.type != "cuda" and not triton_interpreting():
        return (f"Triton kernels need a CUDA device or Triton's interpreter (TRITON_INTERPRET=1); "
                f"this is {device}")
    return None


@dataclass
class CacheStats:
    """What a KernelCache did; tests use it to prove a second build does no work."""
    memory_hits: int = 0   # module handed back from this cache object's memo
    disk_hits: int = 0     # source or binary already on disk, nothing written or compiled
    writes: int = 0        # entries written into the cache
    compiles: int = 0      # compiler runs (nvcc)
    failures: int = 0      # builds that raised BuildError


@dataclass
class KernelCache:
    """A folder of built kernels plus the modules this process has already loaded from it."""
    cache_dir: Optional[os.PathLike] = None
    stats: CacheStats = field(default_factory=CacheStats)
    failures: List[BuildError] = field(default_factory=list)
    _modules: Dict[Tuple[str, bool], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.root = Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir()

    def key(self, source: str, toolchain: Mapping[str, str]) -> str:
        """sha256 of the source and the toolchain that builds it."""
        blob = json.dumps({"source": source, "toolchain": dict(toolchain)}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Write `data` at `path` through a temporary file in the same folder and a rename."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.stats.writes += 1

    def record_failure(self, error: BuildError) -> BuildError:
        self.stats.failures += 1
        self.failures.append(error)
        return error

    def render(self, spec: KernelSpec, template_dir, backend_ok: bool, kind: str) -> str:
        """The rendered source of `spec` for a `kind` ("Triton" or "CUDA") build; a family of
        another backend, or a failed render, is recorded here and raised as a BuildError."""
        if not backend_ok:
            raise self.record_failure(BuildError(str(spec), "render",
                                                 f"family {spec.family!r} is not a {kind} family"))
        try:
            return render_kernel(spec, template_dir)
        except BuildError as exc:
            raise self.record_failure(exc) from None

    def remembered(self, key: str, interpreted: bool) -> Any:
        return self._modules.get((key, interpreted))

    def remember(self, key: str, interpreted: bool, module: Any) -> None:
        self._modules[(key, interpreted)] = module

    def files(self) -> List[Path]:
        """Every file under the cache root (for inspection and tests)."""
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.rglob("*") if p.is_file())


def _import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def build_triton_module(spec: KernelSpec, cache: Optional[KernelCache] = None,
                        template_dir: Optional[os.PathLike] = None) -> ModuleType:
    """Render `spec`, store the source in `cache`, import it, and return the module.

    The module exposes `launch(...)` (contract in codegen/families.py). A second build of the
    same spec with the same cache returns the same module without writing anything. A failure
    (render, syntax, import, no `launch`) raises BuildError, recorded in `cache.failures`, and
    leaves no file of the kernel behind.
    """
    cache = cache if cache is not None else KernelCache()
    source = cache.render(spec, template_dir, spec.backend == "triton", "Triton")
    key = cache.key(source, python_toolchain())
    interpreted = triton_interpreting()
    module = cache.remembered(key, interpreted)
    if module is not None:
        cache.stats.memory_hits += 1
        return module

    path = cache.root / "triton" / f"{spec.family}-{key}.py"
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise cache.record_failure(BuildError(str(spec), "syntax", f"{exc.msg} at line {exc.lineno}: "
                                              f"{(exc.text or '').strip()}")) from None
    data = source.encode("utf-8")
    if path.is_file() and path.read_bytes() == data:
        cache.stats.disk_hits += 1
    else:
        cache.write_atomic(path, data)
    name = f"specpilot_kernel_{spec.family}_{key[:16]}_{next(_module_counter)}"
    try:
        module = _import_file(path, name)
        if not callable(getattr(module, "launch", None)):
            raise ImportError("the generated module defines no launch() function")
    except Exception:
        path.unlink(missing_ok=True)
        raise cache.record_failure(BuildError(str(spec), "import", traceback.format_exc(limit=-3))) from None
    cache.remember(key, interpreted, module)
    return module
