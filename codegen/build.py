"""One entry point to build any kernel spec, and a non-raising variant for the search.

A search tries many (family, parameters) candidates; one that fails to build is a recorded,
reasoned candidate failure, not an exception that unwinds the round.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from .cache import KernelCache, build_triton_module
from .errors import BuildError
from .kernel_spec import KernelSpec


def build_kernel(spec: KernelSpec, cache: Optional[KernelCache] = None,
                 template_dir: Optional[os.PathLike] = None) -> Any:
    """Build `spec` with its backend; the result exposes `launch(...)` (codegen/families.py)."""
    if spec.backend == "cuda":
        from .cuda_build import build_cuda_module  # nvcc only when a CUDA family is asked for
        return build_cuda_module(spec, cache, template_dir)
    return build_triton_module(spec, cache, template_dir)


@dataclass(frozen=True)
class BuildOutcome:
    """Either `module` (built) or `error` (why not), never both."""
    spec: KernelSpec
    module: Any = None
    error: Optional[BuildError] = None

    @property
    def ok(self) -> bool:
        return self.error is None


def try_build_kernel(spec: KernelSpec, cache: Optional[KernelCache] = None,
                     template_dir: Optional[os.PathLike] = None) -> BuildOutcome:
    """build_kernel that returns a BuildError instead of raising it."""
    try:
        return BuildOutcome(spec, module=build_kernel(spec, cache, template_dir))
    except BuildError as exc:
        return BuildOutcome(spec, error=exc)
