"""The torch backend's attention as the codegen attention kernel (kernels.attention_kernels
"generated").

On the CUDA fast path the backend's attention is one grouped SDPA call (runtime/fast_ops.py):
the query heads of a kv head become extra rows, and the [B, T, S] mask is expanded and copied
for them each call. cuDNN then walks every slot of the cache. At verification widths on an H200
(bench/masked_attention_sweep.py, the zoo target's heads over 456 slots, 256 of them the
prefix) that call took 17-39 us at 1 and 5 tokens a request, the generated kernel 7-12 us:
it reads the mask as given (any tree), processes a kv head's query heads together, and stops
at each request's last visible slot. With an odd slot count cuDNN was slower still (457 slots:
+30-60 %); the kernel was not.

The bound is found once a forward, not once a layer: `bounded_masks` (called by the model's
per-op forward with every layer's mask) pairs each distinct mask with its bound, two launches
(a multiply and a max), and `attention` reads the pair. A plain mask gets its bound where it
is used: the ragged layout's per-request attention (runtime/ragged.py) passes plain masks, so
there the bound is found per request and layer (two more launches each).

Numerics: float32 scores and softmax, probabilities rounded to the model's dtype before the
value product, as SDPA's fused kernels do; the roundings differ in order, so a target's logits
differ from the SDPA path's by rounding, which token forcing tolerates as near-ties and reports.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# Slots a program walks per step and its warps, as timed on the H200 for the target's heads
# (bench/masked_attention_sweep.py, the "generated" variant).
BLOCK_S, NUM_WARPS = 64, 4


class BoundedMask(NamedTuple):
    """A layer's mask [B, T, S] with one past each request's last visible slot [B] (int32)."""
    mask: torch.Tensor
    kv_len: torch.Tensor


def visible_end(mask: torch.Tensor, ends: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per request, one past the last cache slot any of its queries sees (0 where none does).
    `ends` is arange(1, S + 1) in int32 where the caller keeps one."""
    b, t, s = mask.shape
    if b * t == 0:
        return torch.zeros(b, dtype=torch.int32, device=mask.device)
    if ends is None:
        ends = torch.arange(1, s + 1, dtype=torch.int32, device=mask.device)
    # int32: what the kernel reads, and half the bytes of the [B, T, S] product
    return (mask * ends).amax(dim=(1, 2))


class SlotEnds:
    """`visible_end` of masks, with arange(1, S + 1) kept per (S, device) so that a step does
    not rebuild it: one multiply and one max a call."""

    def __init__(self):
        self._ends: Dict[Tuple[int, torch.device], torch.Tensor] = {}

    def __call__(self, mask: torch.Tensor) -> torch.Tensor:
        key = (mask.shape[2], mask.device)
        ends = self._ends.get(key)
        if ends is None:
            ends = torch.arange(1, key[0] + 1, dtype=torch.int32, device=mask.device)
            # A capture only records the arange: kept, it would hold nothing until a replay.
            if not (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
                self._ends[key] = ends
        return visible_end(mask, ends)


def attention_head_dims() -> Tuple[int, int]:
    """The head sizes the codegen attention kernel takes, as its family declares them
    (codegen/families.py, HEAD_DIM)."""
    from specpilot.codegen.families import ATTENTION

    head_dim = ATTENTION.param("HEAD_DIM")
    return head_dim.lo, head_dim.hi


def generated_attention_refusal(device: torch.device, dtype: torch.dtype,
                                head_dim: int) -> Optional[str]:
    """Why the generated attention cannot run a model on `device` in `dtype` with heads of
    `head_dim` (None when it can)."""
    from specpilot.codegen.cache import triton_refusal

    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype} has no generated attention kernel"
    low, high = attention_head_dims()
    if not low <= head_dim <= high:
        return f"head_dim {head_dim} is outside the attention kernel's {low}..{high}"
    return triton_refusal(device)


class GeneratedAttention:
    """The backend's attention op, (q [B, T, H, D], caches [B, S, Hkv, D], mask [B, T, S] or a
    BoundedMask, scale) -> [B, T, H*D], by the codegen attention kernel. Kernels are built on
    first use, one per (dtype, head_dim), into `kernel_cache`."""

    def __init__(self, kernel_cache=None):
        self.kernel_cache = kernel_cache
        self._kernels: Dict[Tuple[torch.dtype, int], object] = {}
        self.bound = SlotEnds()

    def kernel(self, dtype: torch.dtype, head_dim: int, device) -> object:
        key = (dtype, head_dim)
        if key not in self._kernels:
            why = generated_attention_refusal(device, dtype, head_dim)
            if why is not None:
                raise SpecPilotError(f"the generated attention cannot run: {why}")
            # Imported here: only a Program that asks for generated attention needs codegen.
            from specpilot.codegen.cache import KernelCache, build_triton_module
            from specpilot.codegen.kernel_spec import kernel_spec

            if self.kernel_cache is None:
                self.kernel_cache = KernelCache()
            spec = kernel_spec("attention", DTYPE=DTYPE_NAMES[dtype], HEAD_DIM=head_dim,
                               BLOCK_S=BLOCK_S, num_warps=NUM_WARPS)
            self._kernels[key] = build_triton_module(spec, self.kernel_cache)
        return self._kernels[key]

    def bounded_masks(self, masks: Sequence[torch.Tensor]) -> List[BoundedMask]:
        """Each of a forward's layer masks with its bound, computed once per distinct mask
        (layers that share a mask object share its bound)."""
        bounds: Dict[int, BoundedMask] = {}
        out = []
        for mask in masks:
            if id(mask) not in bounds:
                bounds[id(mask)] = BoundedMask(self._contiguous(mask), self.bound(mask))
            out.append(bounds[id(mask)])
        return out

    @staticmethod
    def _contiguous(mask: torch.Tensor) -> torch.Tensor:
        # The kernel takes row strides; only its last dimension must be dense.
        return mask if mask.stride(-1) == 1 else mask.contiguous()

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask,
                 scale: float) -> torch.Tensor:
        if not isinstance(mask, BoundedMask):
            mask = BoundedMask(self._contiguous(mask), self.bound(mask))
        b, t, h, d = q.shape
        out = torch.empty((b, t, h, d), dtype=q.dtype, device=q.device)
        kernel = self.kernel(q.dtype, d, q.device)
        kernel.launch(q.contiguous() if q.stride(-1) != 1 else q, k_cache, v_cache, mask.mask,
                      out, scale, kv_len=mask.kv_len)
        return out.view(b, t, h * d)
