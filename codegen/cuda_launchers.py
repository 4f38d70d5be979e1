"""Host-side launchers of the CUDA families: check tensors, then call the compiled binding.

The CUDA templates bind plain pointers and sizes with pybind11 (no torch headers), which keeps a
build to seconds and the extension independent of the torch ABI. Everything torch-specific —
dtype, shape, alignment checks, the current stream — is done here, once, in Python.
"""
from __future__ import annotations

from .errors import KernelArgumentError


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise KernelArgumentError(message)


def _aligned16(t) -> bool:
    return t.data_ptr() % 16 == 0


def launch_gemv_bf16(ext, spec, x, w, out, bias=None):
    """out[M, N] = x[M, K] @ w[N, K]^T (+ bias) in bf16 with float32 accumulation, M <= M_MAX."""
    import torch

    m_max, has_bias = spec.get("M_MAX"), spec.get("HAS_BIAS")
    _require(x.dim() == 2 and w.dim() == 2 and out.dim() == 2, "x, w and out must be 2-D")
    M, K = x.shape
    N = w.shape[0]
    _require(1 <= M <= m_max, f"x has {M} rows; this kernel takes 1..{m_max} (M_MAX)")
    _require(w.shape[1] == K and tuple(out.shape) == (M, N),
             f"shapes x {tuple(x.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)} do not match")
    for name, t in (("x", x), ("w", w), ("out", out)):
        _require(t.dtype == torch.bfloat16, f"{name} must be bfloat16, got {t.dtype}")
        _require(t.is_cuda, f"{name} must be a CUDA tensor")
        _require(t.stride(1) == 1, f"{name} must have a contiguous last dimension")
    # 16-byte vector loads: every row of x and w starts on a 16-byte boundary.
    _require(K % 8 == 0, f"K must be a multiple of 8 for 16-byte loads, got {K}")
    for name, t in (("x", x), ("w", w)):
        _require(_aligned16(t) and (t.stride(0) % 8 == 0 or t.shape[0] == 1),
                 f"{name} rows must be 16-byte aligned")
    _check_bias(bias, has_bias, N, x)
    _require(w.device == x.device == out.device, "x, w and out must be on one device")
    stream = torch.cuda.current_stream(x.device).cuda_stream
    ext.gemv_bf16(x.data_ptr(), w.data_ptr(), bias.data_ptr() if has_bias else 0, out.data_ptr(),
                  M, N, K, x.stride(0), w.stride(0), out.stride(0), stream)


def _check_bias(bias, has_bias: bool, n: int, x) -> None:
    """The bias a kernel was specialised for: a contiguous bf16 [N] on x's device, or none."""
    import torch

    if has_bias:
        _require(bias is not None and tuple(bias.shape) == (n,) and bias.dtype == torch.bfloat16
                 and bias.is_contiguous() and bias.device == x.device,
                 "bias must be a contiguous bfloat16 [N] tensor on x's device")
    else:
        _require(bias is None, "this kernel was specialised without bias (HAS_BIAS=False)")


def launch_gemv_lossless12(ext, spec, x, w, out, bias=None):
    """out[M, N] = x[M, K] @ W^T (+ bias) for bf16 x and a lossless12 weight `w` (a
    Lossless12Tensor, or any object with its fields) with one base per row or per tensor."""
    import torch

    m_max, has_bias = spec.get("M_MAX"), spec.get("HAS_BIAS")
    _require(x.dim() == 2 and out.dim() == 2, "x and out must be 2-D")
    N, K = (int(d) for d in w.shape)
    M = x.shape[0]
    _require(1 <= M <= m_max, f"x has {M} rows; this kernel takes 1..{m_max} (M_MAX)")
    _require(x.shape[1] == K and tuple(out.shape) == (M, N),
             f"shapes x {tuple(x.shape)}, W {(N, K)}, out {tuple(out.shape)} do not match")
    group_size = w.group_size
    _require(group_size is None or group_size >= K,
             f"this kernel takes one base per row or per tensor, but w has group_size={group_size} "
             f"for K={K}; use the Triton family linear_lossless12 with BASE=group")
    # 16 weights per vector load: 16 bytes of sign/mantissa, 8 of codes, 32 of x per row.
    _require(K % 16 == 0, f"K must be a multiple of 16 for the vector loads, got {K}")
    for name, t in (("x", x), ("out", out)):
        _require(t.dtype == torch.bfloat16, f"{name} must be bfloat16, got {t.dtype}")
        _require(t.is_cuda, f"{name} must be a CUDA tensor")
        _require(t.stride(1) == 1, f"{name} must have a contiguous last dimension")
    _require(_aligned16(x) and (x.stride(0) % 8 == 0 or M == 1), "x rows must be 16-byte aligned")
    planes = {"signmant": (torch.uint8, (N, K)), "expcode": (torch.uint8, (N, K // 2)),
              "base": (torch.uint8, () if group_size is None else (N, 1)),
              "escape_row_ptr": (torch.int32, (N + 1,)),
              "escape_col": (torch.int32, (w.num_escapes,)),
              "escape_bits": (torch.uint16, (w.num_escapes,))}
    for name, (dtype, shape) in planes.items():
        t = getattr(w, name)
        _require(t.dtype == dtype and tuple(t.shape) == shape and t.is_contiguous(),
                 f"w.{name} must be a contiguous {dtype} tensor of shape {shape}")
        _require(t.device == x.device, f"w.{name} is on {t.device}, x on {x.device}")
    _require(_aligned16(w.signmant) and w.expcode.data_ptr() % 8 == 0,
             "w.signmant must be 16-byte and w.expcode 8-byte aligned")
    _check_bias(bias, has_bias, N, x)
    _require(out.device == x.device, "x and out must be on one device")
    stream = torch.cuda.current_stream(x.device).cuda_stream
    ext.gemv_lossless12(x.data_ptr(), w.signmant.data_ptr(), w.expcode.data_ptr(), w.base.data_ptr(),
                        0 if group_size is None else 1, w.escape_row_ptr.data_ptr(),
                        w.escape_col.data_ptr(), w.escape_bits.data_ptr(),
                        bias.data_ptr() if has_bias else 0, out.data_ptr(),
                        M, N, K, x.stride(0), out.stride(0), stream)
