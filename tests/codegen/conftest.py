"""Codegen tests: Triton kernels run in the CPU interpreter unless a GPU is present.

TRITON_INTERPRET must be set before triton is first imported (triton.language's own helpers
are decorated at import time), so it is set here, when pytest loads this file, and only on a
machine without CUDA; with a GPU the same tests run the kernels natively.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel_cache(tmp_path):
    """A KernelCache in a fresh folder, so every test starts from an empty cache."""
    from specpilot.codegen.cache import KernelCache
    return KernelCache(tmp_path / "kernels")


@pytest.fixture
def device():
    """Where kernel tests put their tensors: the GPU when kernels run natively, else the CPU."""
    from specpilot.codegen.cache import triton_interpreting
    return "cpu" if triton_interpreting() else "cuda"


@pytest.fixture
def require_nvcc():
    """The CUDA templates must compile on every machine that runs this suite (the project's
    machines carry nvcc 13.0 even without a GPU), so a missing nvcc is a failure, not a skip."""
    from specpilot.codegen.cuda_build import find_nvcc
    if find_nvcc() is None:
        pytest.fail("nvcc (CUDA toolkit) is not on PATH: install it to compile the CUDA templates")
