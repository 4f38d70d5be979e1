"""The CUDA lossless12 GEMV compiles for sm_90 here, and its decoder (run on the host through the
built module) rebuilds exactly the bits of the format's reference decoder."""
import os
from pathlib import Path

import pytest
import torch

from specpilot.codegen.cache import KernelCache
from specpilot.codegen.cuda_build import build_cuda_module, compile_cuda_object, find_nvcc
from specpilot.codegen.errors import KernelArgumentError, KernelSpecError
from specpilot.codegen.formats.lossless12 import decode_main_planes, pack_lossless12
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.codegen.render import render_kernel

needs_nvcc = pytest.mark.usefixtures("require_nvcc")


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    assert find_nvcc() is not None, "nvcc (CUDA toolkit) is not on PATH"
    return build_cuda_module(kernel_spec("gemv_lossless12", M_MAX=2),
                             KernelCache(tmp_path_factory.mktemp("l12-cuda")))


@needs_nvcc
def test_tensor_core_variant_with_bias_compiles_for_sm90(tmp_path):
    spec = kernel_spec("gemv_lossless12", MATH="mma", HAS_BIAS=True, M_MAX=3, WARPS_PER_BLOCK=8)
    source = render_kernel(spec)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in source
    obj = compile_cuda_object(source, KernelCache(tmp_path))
    assert obj.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("name,params", [("gemv_lossless12_mma_bias.cu", dict(MATH="mma", HAS_BIAS=True)),
                                         ("gemv_lossless12_fma_rows2.cu", dict(ROWS_PER_WARP=2, M_MAX=4))])
def test_rendered_source_matches_golden(name, params):
    # Same convention as test_golden_kernels.py: SPECPILOT_UPDATE_GOLDEN=1 rewrites the file.
    path = Path(__file__).parent / "golden" / (name + ".golden")
    source = render_kernel(kernel_spec("gemv_lossless12", **params))
    if os.environ.get("SPECPILOT_UPDATE_GOLDEN") == "1":
        path.write_text(source, encoding="utf-8")
    assert path.is_file() and source == path.read_text(encoding="utf-8"), (
        f"{name} differs from its golden file; if intended, regenerate with SPECPILOT_UPDATE_GOLDEN=1")


def test_rows_per_warp_is_refused_with_tensor_cores():
    with pytest.raises(KernelSpecError, match="ROWS_PER_WARP applies to MATH=fma only"):
        kernel_spec("gemv_lossless12", MATH="mma", ROWS_PER_WARP=2)


def weight_with_specials(n: int, k: int) -> torch.Tensor:
    """normal(0, 0.02) weights with zeros, subnormals, huge values, infinities and NaNs sprinkled in,
    so every decode case (code 0, window codes, escapes read as +0.0) occurs."""
    w = torch.randn(n, k) * 0.02
    flat = w.view(-1)
    picks = torch.randperm(flat.numel())[: flat.numel() // 10]
    chunks = picks.chunk(5)
    flat[chunks[0]] = 0.0
    flat[chunks[1]] = torch.randn(chunks[1].numel()).sign() * 2.0 ** -130  # bf16 subnormals
    flat[chunks[2]] = torch.randn(chunks[2].numel()) * 1e20
    flat[chunks[3]] = float("inf")
    flat[chunks[4]] = float("nan")
    return w.bfloat16()


@pytest.mark.parametrize("group_size", ["row", None])
def test_host_decoder_matches_the_reference_bit_for_bit(module, group_size):
    n, k = 24, 96
    packed = pack_lossless12(weight_with_specials(n, k), group_size)
    assert packed.num_escapes > 0
    out = torch.full((n, k), -1, dtype=torch.int16)
    module.extension.decode_host(packed.signmant.data_ptr(), packed.expcode.data_ptr(),
                                 packed.base.data_ptr(), 0 if group_size is None else 1,
                                 out.data_ptr(), n, k)
    decoded = out.to(torch.int32) & 0xFFFF
    expected = decode_main_planes(packed)
    assert torch.equal(decoded, expected), (decoded != expected).nonzero()[:5]


def test_host_decoder_covers_every_exponent_window(module):
    # One row per base: windows at the bottom (base 1), the middle and the top (base 241).
    rows = []
    for top in (15, 130, 255):  # bases 1, 116, 241
        exponents = torch.randint(top - 14, top + 1, (64,))
        exponents[:2] = torch.tensor([top - 14, top])  # both ends present: the base is top - 14
        sign_mant = torch.randint(0, 256, (64,))
        bits = ((sign_mant & 0x80) << 8) | (exponents << 7) | (sign_mant & 0x7F)
        rows.append(torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16))
    w = torch.stack(rows).view(torch.bfloat16)
    packed = pack_lossless12(w, "row")
    assert packed.num_escapes == 0 and packed.base.flatten().tolist() == [1, 116, 241]
    out = torch.empty(w.shape, dtype=torch.int16)
    module.extension.decode_host(packed.signmant.data_ptr(), packed.expcode.data_ptr(),
                                 packed.base.data_ptr(), 1, out.data_ptr(), 3, 64)
    assert torch.equal(out, w.view(torch.int16))


def test_launcher_checks_its_arguments(module):
    packed = pack_lossless12(torch.randn(16, 32).bfloat16())
    x = torch.randn(1, 32).bfloat16()
    with pytest.raises(KernelArgumentError, match="x must be a CUDA tensor"):
        module.launch(x, packed, torch.empty(1, 16).bfloat16())
    with pytest.raises(KernelArgumentError, match="rows"):
        module.launch(torch.randn(3, 32).bfloat16(), packed, torch.empty(3, 16).bfloat16())
    grouped = pack_lossless12(torch.randn(16, 64).bfloat16(), 16)
    with pytest.raises(KernelArgumentError, match="one base per row or per tensor"):
        module.launch(torch.randn(1, 64).bfloat16(), grouped, torch.empty(1, 16).bfloat16())
