"""Building CUDA kernels with nvcc into the kernel cache.

The CUDA templates bind with pybind11 only (no torch headers): one translation unit compiles
in seconds and the module's name comes from -DSPECPILOT_MODULE_NAME, so it need not appear in
the hashed source. Builds happen in a temporary folder beside the final one and are renamed
into place, so a failed or interrupted nvcc run leaves nothing in the cache.

Target: sm_90 (Hopper) by default, `-gencode arch=compute_90,code=sm_90`.
"""
from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from .cache import KernelCache, python_toolchain
from .errors import BuildError
from .kernel_spec import KernelSpec

DEFAULT_ARCH = "sm_90"
NVCC_TIMEOUT_S = 600


def find_nvcc() -> Optional[str]:
    """Path of nvcc: $CUDA_HOME/bin/nvcc, else the first on PATH, else None."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown"


def gencode_flags(arch: str = DEFAULT_ARCH) -> List[str]:
    number = arch.removeprefix("sm_")
    if not number.isdigit():
        raise BuildError(arch, "compile", f"CUDA arch must look like sm_90, got {arch!r}")
    return ["-gencode", f"arch=compute_{number},code=sm_{number}"]


def nvcc_flags(arch: str = DEFAULT_ARCH) -> List[str]:
    import pybind11
    return ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", *gencode_flags(arch),
            f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]


def cuda_toolchain(nvcc: str, arch: str) -> dict:
    import pybind11
    return {**python_toolchain(), "nvcc": nvcc_version(nvcc), "arch": arch,
            "pybind11": pybind11.__version__}


def _require_nvcc(what: str, cache: KernelCache) -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise cache.record_failure(BuildError(what, "compile", "nvcc not found: install the CUDA "
                                              "toolkit or set CUDA_HOME"))
    return nvcc


def _run_nvcc(nvcc: str, args: Sequence[str], what: str, cache: KernelCache) -> None:
    cache.stats.compiles += 1
    try:
        proc = subprocess.run([nvcc, *args], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise cache.record_failure(BuildError(what, "compile", f"nvcc ran past {NVCC_TIMEOUT_S} s")) from None
    if proc.returncode != 0:
        raise cache.record_failure(BuildError(what, "compile", proc.stderr + proc.stdout))


def _build_into_cache(cache: KernelCache, final: Path, what: str,
                      build: Callable[[Path], None]) -> bool:
    """Run `build(tmp_dir)` and rename tmp_dir to `final`; False if `final` already existed."""
    if final.is_dir():
        cache.stats.disk_hits += 1
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race with another builder: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    cache.stats.writes += 1
    return True


def compile_cuda_object(source: str, cache: Optional[KernelCache] = None, arch: str = DEFAULT_ARCH,
                        module_name: str = "specpilot_cuda_object") -> Path:
    """`nvcc -c` of `source` for `arch`; returns the cached object file's path.

    Proves a CUDA template compiles without a GPU. A compile error raises BuildError(stage
    "compile") carrying nvcc's output, and leaves nothing in the cache.
    """
    cache = cache if cache is not None else KernelCache()
    what = f"CUDA object {module_name}"
    nvcc = _require_nvcc(what, cache)
    flags = nvcc_flags(arch) + [f"-DSPECPILOT_MODULE_NAME={module_name}"]
    key = cache.key(source, {**cuda_toolchain(nvcc, arch), "flags": " ".join(flags), "kind": "object"})
    final = cache.root / "cuda" / f"object-{key}"

    def build(tmp: Path) -> None:
        (tmp / "kernel.cu").write_text(source, encoding="utf-8")
        _run_nvcc(nvcc, [*flags, "-c", str(tmp / "kernel.cu"), "-o", str(tmp / "kernel.o")], what, cache)

    _build_into_cache(cache, final, what, build)
    return final / "kernel.o"


@dataclass
class CudaKernelModule:
    """A built CUDA family: `launch(...)` per the family contract, plus the raw extension."""
    spec: KernelSpec
    extension: Any
    path: Path
    launch: Callable[..., None] = field(repr=False)


def build_cuda_module(spec: KernelSpec, cache: Optional[KernelCache] = None,
                      template_dir: Optional[os.PathLike] = None,
                      arch: str = DEFAULT_ARCH) -> CudaKernelModule:
    """Render `spec`, compile it with nvcc into a Python extension in `cache`, and load it.

    A second build of the same spec compiles nothing. Loading needs no GPU; launching does.
    Failures raise BuildError (recorded in `cache.failures`) and leave nothing in the cache.
    """
    cache = cache if cache is not None else KernelCache()
    source = cache.render(spec, template_dir,
                          spec.backend == "cuda" and spec.schema.host_launcher is not None, "CUDA")
    nvcc = _require_nvcc(str(spec), cache)
    flags = nvcc_flags(arch)
    key = cache.key(source, {**cuda_toolchain(nvcc, arch), "flags": " ".join(flags), "kind": "module"})
    cached = cache.remembered(key, False)
    if cached is not None:
        cache.stats.memory_hits += 1
        return cached
    name = f"specpilot_{spec.family}_{key[:16]}"
    filename = name + sysconfig.get_config_var("EXT_SUFFIX")
    final = cache.root / "cuda" / f"{spec.family}-{key}"

    def build(tmp: Path) -> None:
        (tmp / f"{spec.family}.cu").write_text(source, encoding="utf-8")
        _run_nvcc(nvcc, [*flags, f"-DSPECPILOT_MODULE_NAME={name}", "-shared",
                         str(tmp / f"{spec.family}.cu"), "-o", str(tmp / filename)], str(spec), cache)

    _build_into_cache(cache, final, str(spec), build)
    try:
        extension = sys.modules.get(name) or _load_extension(name, final / filename)
    except Exception as exc:  # a broken binary must not stay cached
        shutil.rmtree(final, ignore_errors=True)
        raise cache.record_failure(BuildError(str(spec), "import", f"{type(exc).__name__}: {exc}")) from None
    launch = functools.partial(spec.schema.host_launcher, extension, spec)
    module = CudaKernelModule(spec=spec, extension=extension, path=final / filename, launch=launch)
    cache.remember(key, False, module)
    return module


def _load_extension(name: str, path: Path):
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module
