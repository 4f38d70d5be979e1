"""The content-addressed kernel cache: one write per kernel, reuse, atomic writes, failed builds
leave nothing behind and are recorded."""
import os
from pathlib import Path

import pytest
import torch

from kernel_checks import assert_matches, poisoned, randn
from specpilot.codegen import cache as cache_module
from specpilot.codegen.build import build_kernel, try_build_kernel
from specpilot.codegen.cache import KernelCache, build_triton_module, default_cache_dir
from specpilot.codegen.errors import BuildError
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import linear_ref

SPEC = kernel_spec("linear", DTYPE="fp32", BLOCK_N=16, BLOCK_K=16)


def check_linear_module(module, device):
    x, w = randn(2, 20, dtype=torch.float32, device=device), randn(5, 20, dtype=torch.float32, device=device)
    out = poisoned((2, 5), torch.float32, device)
    module.launch(x, w, out)
    assert_matches(out, linear_ref(x, w), "fp32")


def test_second_build_writes_nothing_and_reuses_the_module(tmp_path, device):
    cache = KernelCache(tmp_path)
    module = build_triton_module(SPEC, cache)
    assert cache.stats.writes == 1 and len(cache.files()) == 1
    assert build_triton_module(SPEC, cache) is module
    assert cache.stats.writes == 1 and cache.stats.memory_hits == 1
    # A new process (a new cache object on the same folder) finds the file and writes nothing.
    again = KernelCache(tmp_path)
    module2 = build_triton_module(SPEC, again)
    assert again.stats.writes == 0 and again.stats.disk_hits == 1
    check_linear_module(module2, device)


def test_different_specs_get_different_entries(kernel_cache):
    build_triton_module(SPEC, kernel_cache)
    build_triton_module(kernel_spec("linear", DTYPE="fp32", BLOCK_N=32, BLOCK_K=16), kernel_cache)
    names = [p.name for p in kernel_cache.files()]
    assert len(names) == 2 and all(n.startswith("linear-") and n.endswith(".py") for n in names)


def test_key_covers_source_and_toolchain(kernel_cache):
    toolchain = {"python": "3.11", "torch": "2.11", "triton": "3.6"}
    key = kernel_cache.key("src", toolchain)
    assert len(key) == 64
    assert kernel_cache.key("src", toolchain) == key
    assert kernel_cache.key("src2", toolchain) != key
    assert kernel_cache.key("src", {**toolchain, "triton": "3.9"}) != key


def test_cache_location_follows_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "env"))
    assert KernelCache().root == tmp_path / "env" / "kernels"
    assert KernelCache(tmp_path / "arg").root == tmp_path / "arg"
    monkeypatch.delenv("SPECPILOT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "specpilot" / "kernels"


def test_a_corrupted_entry_is_rewritten(tmp_path, device):
    build_triton_module(SPEC, KernelCache(tmp_path))
    (entry,) = KernelCache(tmp_path).files()
    entry.write_text("garbage")
    fresh = KernelCache(tmp_path)
    check_linear_module(build_triton_module(SPEC, fresh), device)
    assert fresh.stats.writes == 1 and "garbage" not in entry.read_text()


def test_an_interrupted_write_leaves_no_file(kernel_cache, monkeypatch):
    def fail(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(cache_module.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        build_triton_module(SPEC, kernel_cache)
    assert kernel_cache.files() == []


def broken_templates(tmp_path: Path, body: str) -> Path:
    (tmp_path / "templates" / "triton").mkdir(parents=True)
    (tmp_path / "templates" / "triton" / "linear.py.j2").write_text(body)
    return tmp_path / "templates"


@pytest.mark.parametrize("body,stage,message", [
    ("def launch(:\n    pass\n", "syntax", "line 1"),
    ("import triton\nVALUE = UNDEFINED_NAME + {{ BLOCK_N }}\ndef launch():\n    pass\n", "import",
     "UNDEFINED_NAME"),
    ("BLOCK_N = {{ BLOCK_N }}\n", "import", "no launch"),
    ("BLOCK_N = {{ BLOCK_N }}\n{{ MISSING }}\n", "render", "MISSING"),
])
def test_failed_builds_are_recorded_and_leave_nothing(tmp_path, body, stage, message):
    cache = KernelCache(tmp_path / "kernels")
    templates = broken_templates(tmp_path, body)
    with pytest.raises(BuildError, match=message) as info:
        build_triton_module(SPEC, cache, template_dir=templates)
    assert info.value.stage == stage
    assert cache.failures == [info.value] and cache.stats.failures == 1
    assert cache.files() == []
    # The search-facing variant returns the same reason instead of raising.
    outcome = try_build_kernel(SPEC, cache, template_dir=templates)
    assert not outcome.ok and outcome.module is None and outcome.error.stage == stage
    assert cache.files() == []


def test_build_kernel_dispatches_on_backend(kernel_cache):
    module = build_kernel(SPEC, kernel_cache)
    assert callable(module.launch)
    outcome = try_build_kernel(SPEC, kernel_cache)
    assert outcome.ok and outcome.module is module


def test_triton_kernels_are_refused_off_a_gpu_without_the_interpreter(monkeypatch):
    from specpilot.codegen import cache

    monkeypatch.setattr(cache, "triton_interpreting", lambda: False)
    assert "need a CUDA device or Triton's interpreter" in cache.triton_refusal("cpu")
    assert cache.triton_refusal("cuda:0") is None
    monkeypatch.setattr(cache, "triton_interpreting", lambda: True)
    assert cache.triton_refusal("cpu") is None
