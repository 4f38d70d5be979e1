"""The `generated` backend: a Program's own kernels (its KernelPlan, built) behind the backend
interface of `TorchBackend`, so the model and the decode loops run unchanged.

One backend serves one model of the pair (`role`). Linears are bound to their plan node when
the model prepares them (`prepare_linear` gets the checkpoint name): a dense linear runs its
`linear` (or CUDA `gemv_bf16`) kernel, a lossless12 linear is packed here and runs
`linear_lossless12` (or CUDA `gemv_lossless12`), and a layer whose gate and up projections the
plan fused runs `gate_up_silu` from `mlp_gate_up`. The other calls carry no node name, so their
kernels are chosen by what the call can see: RMSNorm by the row width (hidden size or head_dim),
RoPE and attention one kernel per model; the plan must therefore give those nodes one kernel
each, which lowering does unless an override singles out one layer (refused here, with why).

`silu_mul` of an unfused MLP stays in torch (no kernel family computes it on its own). The
target's backend also runs the step's greedy acceptance (`accept_greedy`, an acceptance rule for
the decode loops). On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.formats import DENSE_FORMATS

from .acceptance import AcceptedPath


class GeneratedBackendError(SpecPilotError):
    """The plan and the model disagree, or the plan asks for something this backend cannot run."""


@dataclass(frozen=True)
class PreparedLinear:
    """A checkpoint linear bound to its plan node: the kernel's launch and its operands.

    `launch` is None for one half of a fused gate/up pair, which only `mlp_gate_up` runs (with
    `fused`, the gate_up_silu launch). `max_rows` caps the rows of one launch (the CUDA GEMVs' M_MAX).
    """
    node: str
    launch: Optional[Callable[..., None]]
    weight: Any
    bias: Optional[torch.Tensor]
    out_features: int
    max_rows: Optional[int] = None
    fused: Optional[Callable[..., None]] = None


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as a 2-D [M, K] view (a copy only if its last dimension is strided)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


class GeneratedBackend:
    name = "generated"

    def __init__(self, plan, cache=None, role: str = "target", template_dir=None):
        """Build the kernels of `role`'s nodes (and the step's, for the target) from `plan`
        (a KernelPlan) into `cache` (a KernelCache; the default cache folder when None).
        A kernel that fails to build raises its PlanBuildError, which names the nodes."""
        from specpilot.codegen.plan import build_plan

        if role not in ("target", "drafter"):
            raise GeneratedBackendError(f"role must be 'target' or 'drafter', got {role!r}")
        nodes = plan.nodes_of(role) + (plan.nodes_of("step") if role == "target" else ())
        if not plan.nodes_of(role):
            raise GeneratedBackendError(f"the plan has no node of the {role}")
        self.plan, self.role = plan, role
        self.built = build_plan(plan, cache, template_dir, tuple(n.name for n in nodes)).raise_first_error()
        self._linear_nodes = {linear: n for n in nodes for linear in n.linears}
        self._norms = self._one_kernel_per(nodes, "rmsnorm", key=lambda n: n.attr("width"))
        self._rope = self._one_kernel_per(nodes, "rope").get(None)
        self._attention = self._one_kernel_per(nodes, "attention").get(None)
        self._varlen_attention = self._one_kernel_per(nodes, "varlen_attention").get(None)
        accept = [n for n in nodes if n.op == "greedy_accept"]
        self._accept = self.built.module_of(accept[0].name).launch if accept else None

    def _one_kernel_per(self, nodes, op: str, key=lambda n: None) -> Dict[Any, Callable]:
        """{key: launch} for the nodes of `op`; nodes with one key must share one kernel."""
        chosen: Dict[Any, Any] = {}
        for n in nodes:
            if n.op != op:
                continue
            first = chosen.setdefault(key(n), n)
            if first.kernel != n.kernel:
                raise GeneratedBackendError(
                    f"{first.name} and {n.name} run different {op} kernels ({first.kernel}, "
                    f"{n.kernel}), but a model's {op} calls do not say which layer they serve: "
                    f"override {op} for every layer of the {self.role} alike")
        return {k: self.built.module_of(n.name).launch for k, n in chosen.items()}

    # ------------------------------------------------------------------------- linears

    def prepare_linear(self, name: str, weight: torch.Tensor, bias: Optional[torch.Tensor], fmt: str):
        """Bind checkpoint linear `name` to its plan node; pack it if its format asks."""
        from specpilot.codegen.cache import triton_interpreting

        node = self._linear_nodes.get(name)
        if node is None:
            raise GeneratedBackendError(f"the plan has no node for the {self.role}'s linear {name}")
        planned = node.attr("format")
        if fmt != planned and not (fmt == "dense" and planned in DENSE_FORMATS):
            raise GeneratedBackendError(f"{node.name} was lowered for {planned} weights, but the "
                                        f"model stores {name} as {fmt}")
        if (bias is not None) != bool(node.attr("bias", False)):
            planned_bias = "with" if node.attr("bias") else "without"
            raise GeneratedBackendError(f"{node.name} was lowered {planned_bias} a bias, but the "
                                        f"checkpoint's {name} has {'one' if bias is not None else 'none'}")
        if weight.device.type == "cpu" and not triton_interpreting():
            raise GeneratedBackendError("generated kernels run on the CPU only in Triton's interpreter: "
                                        "set TRITON_INTERPRET=1 before anything imports triton")
        launch = self.built.module_of(node.name).launch
        out_features = int(weight.shape[0])
        if planned == "lossless12":
            from specpilot.codegen.formats.lossless12 import pack_lossless12
            weight = pack_lossless12(weight).to(weight.device)
        if node.op == "gate_up_silu":
            return PreparedLinear(node.name, None, weight, bias, out_features, fused=launch)
        params = dict(self.plan.spec(node.kernel).params)
        max_rows = params.get("M_MAX")  # the CUDA GEMVs take at most M_MAX rows per launch
        return PreparedLinear(node.name, launch, weight, bias, out_features, max_rows)

    def linear(self, x: torch.Tensor, packed: PreparedLinear) -> torch.Tensor:
        if packed.launch is None:
            raise GeneratedBackendError(f"{packed.node} fuses this projection with its pair: "
                                        "run it through mlp_gate_up")
        x2 = _rows(x)
        out = torch.empty((x2.shape[0], packed.out_features), dtype=x.dtype, device=x.device)
        step = packed.max_rows or max(x2.shape[0], 1)
        for start in range(0, x2.shape[0], step):  # a GEMV takes at most max_rows rows a launch
            packed.launch(x2[start:start + step], packed.weight, out[start:start + step], packed.bias)
        return out.view(*x.shape[:-1], packed.out_features)

    def mlp_gate_up(self, y: torch.Tensor, gate: PreparedLinear, up: PreparedLinear) -> torch.Tensor:
        """silu(y @ gate.T) * (y @ up.T): one fused kernel when the plan fused the pair."""
        if gate.fused is None or gate.node != up.node:
            return self.silu_mul(self.linear(y, gate), self.linear(y, up))
        y2 = _rows(y)
        out = torch.empty((y2.shape[0], gate.out_features), dtype=y.dtype, device=y.device)
        gate.fused(y2, gate.weight, up.weight, out)
        return out.view(*y.shape[:-1], gate.out_features)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    # ------------------------------------------------------------------------- other ops

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        launch = self._norms.get(x.shape[-1])
        if launch is None:
            raise GeneratedBackendError(f"the plan has no rmsnorm kernel of width {x.shape[-1]} "
                                        f"for the {self.role}")
        x2 = _rows(x)
        out = torch.empty_like(x2)
        launch(x2, weight.contiguous(), out, float(eps))
        return out.view(x.shape)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D]; cos/sin [B, T, D], read as a table with one row per token."""
        b, t, h, d = x.shape
        x3 = x.reshape(b * t, h, d).contiguous()
        out = torch.empty_like(x3)
        positions = torch.arange(b * t, device=x.device)
        # The kernel rotates q and k in one launch; the model rotates them one at a time, so
        # the k operand is an empty head dimension that its programs skip.
        none = x3[:, :0]
        self._rope(x3, none, positions, out, none, cos=cos.reshape(b * t, d).contiguous(),
                   sin=sin.reshape(b * t, d).contiguous())
        return out.view(b, t, h, d)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, T, H, D] over cache [B, S, Hkv, D] with visibility mask [B, T, S] → [B, T, H*D]."""
        b, t, h, d = q.shape
        q = q.contiguous()
        mask = mask.to(torch.bool)
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
        out = torch.empty_like(q)
        self._attention(q, k_cache, v_cache, mask, out, scale=scale)
        return out.view(b, t, h * d)

    @property
    def has_varlen_attention(self) -> bool:
        """Whether the plan has a varlen attention kernel (a ragged Program's)."""
        return self._varlen_attention is not None

    def varlen_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cu_seqlens: torch.Tensor, cache_rows: torch.Tensor,
                         kv_limits: torch.Tensor, window_bits: torch.Tensor, scale: float,
                         max_seqlen: Optional[int] = None) -> torch.Tensor:
        """Packed q [N, H, D] of requests cu_seqlens [R+1] over their cache rows cache_rows [R]
        of [B, S, Hkv, D], visibility (kv_limits, window_bits) as the varlen_attention family
        says (codegen/families.py) → [N, H*D]."""
        if self._varlen_attention is None:
            raise GeneratedBackendError(f"the plan has no varlen_attention kernel for the "
                                        f"{self.role}: lower a Program with batch.layout ragged")
        n, h, d = q.shape
        q = q.contiguous()
        out = torch.empty_like(q)
        self._varlen_attention(q, k_cache, v_cache, cu_seqlens, cache_rows, kv_limits,
                               window_bits.contiguous(), out, scale=scale, max_seqlen=max_seqlen)
        return out.view(n, h * d)

    # ------------------------------------------------------------------------- the step

    def accept_greedy(self, tree_plan, node_tokens: Sequence[int],
                      target_logits: torch.Tensor) -> AcceptedPath:
        """An acceptance rule (see runtime/acceptance.py) run by the plan's greedy_accept kernel."""
        if self._accept is None:
            raise GeneratedBackendError("only the target's backend runs the step's greedy acceptance")
        device = target_logits.device
        n = len(node_tokens)
        logits = target_logits.reshape(1, n + 1, -1).contiguous()
        drafts = torch.tensor([list(node_tokens)], dtype=torch.int64, device=device)
        parents = torch.tensor(tree_plan.shape.parents, dtype=torch.int64, device=device)
        pred = torch.empty((1, n + 1), dtype=torch.int64, device=device)
        count = torch.empty((1,), dtype=torch.int64, device=device)
        path = torch.empty((1, n), dtype=torch.int64, device=device)
        bonus = torch.empty((1,), dtype=torch.int64, device=device)
        self._accept(logits, drafts, parents, pred, count, path, bonus)
        accepted: Tuple[int, ...] = tuple(path[0, :int(count[0])].tolist())
        return AcceptedPath(accepted, int(bonus[0]))
