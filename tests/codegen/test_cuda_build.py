"""CUDA templates compile with nvcc for sm_90 here (no GPU needed); builds are cached once."""
import inspect

import pytest
import torch

from specpilot.codegen.cache import KernelCache
from specpilot.codegen.cuda_build import build_cuda_module, compile_cuda_object
from specpilot.codegen.errors import BuildError, KernelArgumentError
from specpilot.codegen.kernel_spec import get_family, kernel_spec, known_families
from specpilot.codegen.render import render_kernel

needs_nvcc = pytest.mark.usefixtures("require_nvcc")
CUDA_FAMILIES = [f for f in known_families() if get_family(f).backend == "cuda"]


@needs_nvcc
@pytest.mark.parametrize("family", CUDA_FAMILIES)
def test_every_cuda_template_compiles_for_sm90(family, tmp_path):
    cache = KernelCache(tmp_path)
    obj = compile_cuda_object(render_kernel(kernel_spec(family)), cache)
    assert obj.is_file() and obj.read_bytes()[:4] == b"\x7fELF"
    assert cache.stats.compiles == 1
    assert compile_cuda_object(render_kernel(kernel_spec(family)), cache) == obj
    assert cache.stats.compiles == 1 and cache.stats.disk_hits == 1


@needs_nvcc
def test_cuda_module_builds_once_and_checks_its_arguments(tmp_path):
    spec = kernel_spec("gemv_bf16", M_MAX=8, HAS_BIAS=True)
    cache = KernelCache(tmp_path)
    module = build_cuda_module(spec, cache)
    assert cache.stats.compiles == 1 and hasattr(module.extension, "gemv_bf16")
    assert "launch" + str(inspect.signature(module.launch)) == spec.schema.launcher
    assert build_cuda_module(spec, cache) is module
    fresh = KernelCache(tmp_path)
    build_cuda_module(spec, fresh)
    assert fresh.stats.compiles == 0 and fresh.stats.writes == 0 and fresh.stats.disk_hits == 1
    x = torch.randn(2, 64).bfloat16()
    w = torch.randn(16, 64).bfloat16()
    out = torch.empty(2, 16).bfloat16()
    with pytest.raises(KernelArgumentError, match="x must be a CUDA tensor"):
        module.launch(x, w, out, w[0])
    with pytest.raises(ValueError, match="rows"):
        module.launch(torch.randn(9, 64).bfloat16(), w, torch.empty(9, 16).bfloat16(), w[0])


@needs_nvcc
def test_a_cuda_kernel_that_does_not_compile_is_recorded_and_leaves_nothing(tmp_path):
    (tmp_path / "templates" / "cuda").mkdir(parents=True)
    (tmp_path / "templates" / "cuda" / "gemv_bf16.cu.j2").write_text(
        "// {{ SPEC }}\n__global__ void k(float* p) { p[threadIdx.x] = undefined_symbol; }\n")
    cache = KernelCache(tmp_path / "kernels")
    with pytest.raises(BuildError, match="undefined_symbol") as info:
        build_cuda_module(kernel_spec("gemv_bf16"), cache, template_dir=tmp_path / "templates")
    assert info.value.stage == "compile" and cache.failures == [info.value]
    assert cache.files() == []
    with pytest.raises(BuildError, match="compile"):
        compile_cuda_object("this is not C++;", cache)
    assert cache.files() == []
