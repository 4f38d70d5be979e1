"""Shared helpers of the kernel tests: dtype names, tolerances, poisoned outputs."""
import torch

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Kernel and reference both accumulate in float32 and round once; they may still land one ulp
# apart (different summation order; the CPU interpreter truncates float32 -> bf16 instead of
# rounding to nearest), so the tolerance is two ulps of the dtype plus a small absolute floor
# for outputs near zero.
TOLERANCES = {"bf16": dict(rtol=2 ** -6, atol=1e-2), "fp16": dict(rtol=2 ** -9, atol=1e-3),
              "fp32": dict(rtol=1e-5, atol=1e-4)}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: str, atol=None) -> None:
    """Elementwise closeness with the dtype's tolerance; NaN (an unwritten output) never passes.

    `atol` overrides the absolute floor where an output is a difference of rounded terms much
    larger than itself (RoPE), so its error scales with the terms, not with the result.
    """
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    tol = dict(TOLERANCES[dtype])
    if atol is not None:
        tol["atol"] = atol
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), equal_nan=False, **tol)


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An output buffer full of NaN (floats) or -7 (integers), so unwritten elements show."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -7, dtype=dtype, device=device)


def randn(*shape, dtype, device) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32).to(device=device, dtype=dtype)


def qkv_case(dtype, device, b, t, hq, hkv, d, hidden, capacity, vocab=None, far=0):
    """Random operands of norm_qkv_rope: distinct slots per row, positions apart from slots
    (a tree's nodes share a position) and `far` further on, caches already holding other
    values."""
    g = torch.Generator().manual_seed(b * 100 + t)
    slots = torch.stack([torch.randperm(capacity, generator=g)[:t] for _ in range(b)]).to(device)
    positions = (slots + far + torch.randint(0, 50, (b, 1), generator=g).to(device))
    inv_freq = (1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))).to(device)
    rows = vocab if vocab is not None else b * t
    return dict(x=randn(rows, hidden, dtype=dtype, device=device),
                norm_weight=randn(hidden, dtype=dtype, device=device),
                w_qkv=randn((hq + 2 * hkv) * d, hidden, dtype=dtype, device=device) / 4,
                positions=positions, slots=slots, inv_freq=inv_freq,
                k_cache=randn(b, capacity, hkv, d, dtype=dtype, device=device),
                v_cache=randn(b, capacity, hkv, d, dtype=dtype, device=device))
