"""Kernel agent: CUDA-graph capture, the torch backend's whole-layer fast path, the drafter in
fused layer kernels, the torch backend's attention by the generated kernel, the Program's own
generated kernels, and per-node tuning (`TuneKernel`) of the kernels the cost report puts
furthest from their bandwidth limit.

On a CPU it proposes nothing: generated kernels run there in Triton's interpreter, a
correctness tool whose timings say nothing about a GPU.

Tuning names the nodes lowering produces for this Program, by their layer-less key
(`target.mlp.down_proj`), so that one override tunes every layer alike (the generated backend
requires that of attention, whose calls do not say which layer they serve). The cost report's
nodes (`target.layers.3.mlp`, kind mlp) map to lowered nodes by kind; without a usable report
the largest linears come first. Each proposed value is legal for the node's kernel family (its
parameter schema, and the family's own checks through a KernelSpec), and each proposal lowers.
"""
from __future__ import annotations

from itertools import zip_longest
from typing import Dict, Iterator, List, Optional, Tuple

from specpilot.ir import (CaptureGraphs, Chain, Program, SetAcceptKernels, SetAttentionKernels,
                          SetBackend, SetDrafterKernels, SetFastPath, Transformation, TuneKernel,
                          apply)
from specpilot.ir.errors import SpecPilotError

from .base import Agent, Budget, Refusal

# The parameters worth a try per family, most promising first (preference; which values are
# legal is the family schema's answer). Everything else follows from the Program or is a
# correctness bound (M_MAX).
TUNABLE: Dict[str, Tuple[str, ...]] = {
    "linear": ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"),
    "linear_lossless12": ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages"),
    "gate_up_silu": ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages"),
    "attention": ("BLOCK_S", "BLOCK_R", "num_warps", "num_stages"),
    "gemv_bf16": ("UNROLL", "WARPS_PER_BLOCK", "COLS_PER_WARP"),
    "gemv_lossless12": ("MATH", "UNROLL", "WARPS_PER_BLOCK", "ROWS_PER_WARP"),
}
TUNED_OPS = ("linear", "gate_up_silu", "attention")
# Rows up to which a CUDA GEMV measured faster than the Triton family it would replace, on every
# Llama-3.1-8B linear (bench/results/kernels.md, H200): the bf16 GEMV up to 4 rows, the fused
# lossless12 decode (mma) up to 8, its M_MAX (past that it re-reads the weights per 8 rows).
GEMV_MAX_ROWS = {"gemv_bf16": 4, "gemv_lossless12": 8}
# How many node groups get proposals (the report's top ones, or the largest linears).
MAX_GROUPS = 6


def _in_report_kind(kind: str, key: str, role: str) -> bool:
    """Whether lowered node group `key` (layer-less) computes part of a cost-report node of
    `kind` (ir.dataflow_graph kinds)."""
    part = key.split(".", 1)[1] if "." in key else ""
    if kind == "attention":
        return role == "target" and part.startswith("self_attn.")
    if kind == "mlp":
        return role == "target" and part.startswith("mlp.")
    if kind == "lm_head":
        return key == "target.lm_head"
    return kind == "drafter_forward" and role == "drafter"


class _Group:
    """The lowered nodes one layer-less key tunes: their family, params and size."""

    def __init__(self, key: str, nodes, plan):
        self.key, self.nodes = key, nodes
        self.spec = plan.spec_of(nodes[0].name)
        self.uniform = all(plan.spec_of(n.name) == self.spec for n in nodes)
        self.role, self.op = nodes[0].role, nodes[0].op
        self.rows = max(int(n.attr("rows", 0) or 0) for n in nodes)
        # a fused gate_up node reads both of its linears, each out_features x in_features
        self.weights = sum(len(n.linears) * int(n.attr("out_features", 0) or 0)
                           * int(n.attr("in_features", 0) or 0) for n in nodes)


def node_groups(plan) -> Dict[str, _Group]:
    """The plan's tunable nodes (linears, fused MLP inputs, attention) of target and drafter,
    grouped by layer-less key, in plan order."""
    from specpilot.codegen.lower import layerless

    by_key: Dict[str, list] = {}
    for node in plan.nodes:
        if node.op in TUNED_OPS and node.role in ("target", "drafter"):
            by_key.setdefault(layerless(node.name), []).append(node)
    return {key: _Group(key, nodes, plan) for key, nodes in by_key.items()}


def rank_groups(groups: Dict[str, _Group], cost_report) -> Tuple[List[_Group], str]:
    """Groups to tune, best first, and how they were chosen: by the report's nodes furthest
    from their bandwidth limit (mapped by kind), else the largest linears."""
    by_size = sorted(groups.values(), key=lambda g: -g.weights)
    chosen: List[_Group] = []
    for summary in getattr(cost_report, "nodes", None) or []:
        for g in by_size:
            if g not in chosen and _in_report_kind(summary.kind, g.key, g.role):
                chosen.append(g)
    if chosen:
        return chosen[:MAX_GROUPS], "the cost report's nodes furthest from their bandwidth limit"
    linears = [g for g in by_size if g.op != "attention"]
    return linears[:MAX_GROUPS], "the largest linears (no cost report node maps to a kernel)"


def legal_values(family: str, param: str, current) -> List:
    """Neighbours of `current` that `param`'s schema allows: half and double a power of two,
    one less and one more otherwise, the other choices of an enum."""
    from specpilot.codegen.kernel_spec import get_family
    from specpilot.codegen.params import EnumParam, IntParam

    schema = get_family(family).param(param)
    if isinstance(schema, EnumParam):
        return [c for c in schema.choices if c != current]
    if not isinstance(schema, IntParam):
        return []
    near = (current // 2, current * 2) if schema.power_of_two else (current - 1, current + 1)
    return [v for v in near if schema.lo <= v <= schema.hi and v != current]


def _spec_accepts(group: _Group, param: str, value) -> bool:
    try:
        group.spec.with_params(**{param: value})
    except SpecPilotError:
        return False
    return True


def group_proposals(group: _Group) -> List[TuneKernel]:
    """TuneKernel records for one group, most promising first: another family that may run it
    (a CUDA GEMV, for the rows it is measured faster at), then each tunable parameter's legal
    neighbours."""
    from specpilot.codegen.lower import allowed_families

    if not group.uniform:       # a layer already tuned on its own: leave the group alone
        return []
    out = []
    if group.op == "linear":
        out += [TuneKernel(group.key, "family", f) for f in allowed_families(group.nodes[0])
                if f != group.spec.family and group.rows <= GEMV_MAX_ROWS.get(f, 0)]
    family = group.spec.family
    for param in TUNABLE.get(family, ()):
        current = group.spec.get(param)
        out += [TuneKernel(group.key, param, v) for v in legal_values(family, param, current)
                if _spec_accepts(group, param, v)]
    return out


def _interleave(lists: List[List[TuneKernel]]) -> Iterator[TuneKernel]:
    """One proposal of each group in turn, so a small budget still covers several nodes."""
    for row in zip_longest(*lists):
        yield from (t for t in row if t is not None)


def lowering_error(program: Program, t: Transformation) -> Optional[str]:
    """Why `program` with `t` applied does not lower, or None when it does."""
    from specpilot.codegen.lower import lower_program

    try:
        lower_program(apply(program, t))
    except SpecPilotError as exc:
        return str(exc)
    return None


class KernelAgent(Agent):
    direction = "kernels"
    categories = ("launch_sync", "attention_kv")

    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        self._reset()
        if program.gpu == "cpu":
            self.notes.append("kernel tuning is measured on a GPU only (on a CPU the generated "
                              "kernels run in Triton's interpreter)")
            return []
        proposals: List[Transformation] = []
        if not program.kernels.capture_graphs:
            proposals.append(CaptureGraphs(True))
        if program.kernels.backend == "torch" and program.kernels.fast_path != "layers":
            # Whole-layer compilation: 21-32 % off a graphed step or round of the zoo's 161M
            # pair, 10 % off an 8B step (BENCHMARKS.md); a small model's step is bound by its
            # kernel count, which this cuts.
            proposals.append(SetFastPath("layers"))
        if (program.kernels.backend == "torch" and program.draft.speculates
                and program.kernels.drafter_kernels == "model"):
            # The drafter in fused layer kernels (runtime/fused_forward.py): five launches a
            # layer (op by op, some 20 a layer: the zoo target's step launched 255), and a chain
            # round runs one drafter step per drafted token. Whether the drafter's shape has
            # fused kernels is load_pair's to say (a refusal is a failed candidate).
            proposals.append(SetDrafterKernels("fused"))
        if program.kernels.backend == "torch" and program.kernels.attention_kernels == "model":
            # The codegen attention kernel in place of grouped SDPA (runtime/
            # generated_attention.py): on an H200 at verification widths, 7-12 us a call
            # against SDPA's 17-39 for the zoo target's heads (BENCHMARKS.md): it stops at each
            # request's last visible slot and reads a tree's mask as given. Per op or inside
            # the layers path's compiled blocks (runtime/compiled_attention.py).
            proposals.append(SetAttentionKernels("generated"))
        if (program.draft.speculates and isinstance(program.draft.topology, Chain)
                and program.kernels.accept_kernels == "ops"):
            # A graphed chain round's end in one generated kernel (the chain_commit family)
            # rather than some forty small ones: 3-4 % off a captured round on an H200 at batch
            # 16 and 64 (BENCHMARKS.md, twenty-seventh set). Integers only: the output is the
            # same.
            proposals.append(SetAcceptKernels("fused"))
        if program.kernels.backend != "generated":
            proposals.append(SetBackend("generated"))
        out = self._legal(program, proposals, memory)[:budget.max_proposals]
        if program.kernels.backend != "generated":
            self.notes.append("per-node kernel tuning applies to the generated backend only")
            return out
        return out + self._tunings(program, cost_report, memory,
                                   budget.max_proposals - len(out))

    def _tunings(self, program: Program, cost_report, memory, room: int) -> List[Transformation]:
        from specpilot.codegen.lower import lower_program

        if room <= 0:
            return []
        try:
            plan = lower_program(program)
        except SpecPilotError as exc:
            self.notes.append(f"no kernel tuning: the Program does not lower ({exc})")
            return []
        groups, how = rank_groups(node_groups(plan), cost_report)
        self.notes.append(f"tuning {', '.join(g.key for g in groups)}: {how}")
        out: List[Transformation] = []
        for t in _interleave([group_proposals(g) for g in groups]):
            if len(out) >= room:
                break
            if not self._legal(program, [t], memory):
                continue
            reason = lowering_error(program, t)
            if reason is not None:
                self.refusals.append(Refusal(str(t), f"does not lower: {reason}"))
                continue
            out.append(t)
        return out
