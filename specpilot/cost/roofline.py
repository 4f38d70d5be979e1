"""Roofline cost of every node of one speculative step (the nodes of `ir.dataflow_graph`).

For each node: bytes moved (weights in their IR format, KV cache reads and writes, logits), FLOPs,
and kernel launches; its roofline time is max(bytes / bandwidth, FLOPs / matmul rate), and its
overhead launches x launch overhead. Next to what the Program does, each node carries what an
ideal decoder of the same pair and topology would do (the ceiling): weights at the smallest
lossless format, FLOPs only for the tokens that end up accepted, no launch overhead, no KV
compaction copy.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

from specpilot.ir import Program
from specpilot.ir.formats import DTYPE_BYTES, WEIGHT_FORMATS, weight_bytes
from specpilot.ir.model_spec import ModelSpec

from .gpu_specs import GpuSpec

# Ops one layer issues in eager decode: input norm, q/k/v, rope, attention, o_proj, residual add
# (attention part); post norm, gate, up, activation-multiply, down, residual add (MLP part).
ATTENTION_OPS = 8
QK_NORM_OPS = 2
MLP_OPS = 6
HEAD_OPS = 2          # final norm + lm_head
# A drafter in fused layer kernels (kernels.drafter_kernels "fused", runtime/fused_forward.py):
# five launches a layer (norm + q/k/v + RoPE + cache write, attention, o_proj + residual,
# norm + gate/up + SiLU, down_proj + residual) and one for the final norm with the LM head,
# which also finds each row's next token when drafting. The attention's bound (each request's
# last visible slot) costs no launch: the first layer's attention finds it in the mask, or, in
# a chain's rounds, each program from its rows' positions (no mask is built or read).
FUSED_LAYER_OPS = 5
FUSED_HEAD_OPS = 1
# Folded (codegen/fused_layer.py's FOLD_RESIDUAL): o_proj and down_proj add into a float32
# residual stream from the attention and the MLP, three launches a layer, and one fill a
# forward zeroes the stream's sums.
FOLDED_LAYER_OPS = 3
FOLDED_FORWARD_OPS = 1
# The torch backend's attention by the generated kernel (kernels.attention_kernels "generated",
# runtime/generated_attention.py): two launches a forward for its bound. Its attention launch
# is counted as SDPA's is (one in ATTENTION_OPS), its bytes as the context's either way: what it
# saves (cuDNN's walk past the last visible slot, the copies around grouped SDPA's call) is
# not in this model, which prices attention by the bytes a request must read; the search's
# measurements see it.
GENERATED_BOUND_OPS = 2
# Greedy acceptance reads the logits on the host: one argmax launch and one device-host sync.
ACCEPT_OPS = 2
# A graphed chain round's end on the device (runtime/graphed_chain.py, `_commit`): the accepted
# count, the committed tokens out, the rows' state, who stops, the round's log. As torch ops
# (kernels.accept_kernels "ops") the captured round launched 38-41 kernels more than with the
# one generated kernel of "fused" (H200, bench/round_variants.py, BENCHMARKS.md twenty-seventh
# set); the eager loop does this on the host, which ACCEPT_OPS's sync covers.
GRAPHED_COMMIT_OPS = {"ops": 39, "fused": 1}
# With adaptive lengths a graphed round also updates the length: compiled by Inductor, 7 kernels
# (with "ops"), or one generated kernel with "fused" (the length_policy family; H200, a batch-16
# chain(4) round counted with the torch profiler, bench/round_variants.py, BENCHMARKS.md
# thirty-first set).
GRAPHED_LENGTH_UPDATE_OPS = {"ops": 7, "fused": 1}
# Inside a CUDA graph a kernel still pays its scheduling gap on the GPU (a microsecond or two on
# Hopper) but not the host's dispatch (several microseconds per launch), and the decode loop's
# host syncs between steps disappear: a graphed step is modelled with this share of the eager
# per-launch overhead where the GPU's in-graph kernel cost was not measured (`graphed_share`).
# An assumption, refitted by calibration against measured runs.
GRAPHED_LAUNCH_SHARE = 0.25


def graphed_share(gpu) -> float:
    """The share of the eager per-launch overhead a kernel pays inside a CUDA graph: measured
    (`GpuSpec.graphed_launch_s` over `launch_overhead_s`) where known, else the assumption."""
    if gpu.graphed_launch_s is not None and gpu.launch_overhead_s > 0:
        return gpu.graphed_launch_s / gpu.launch_overhead_s
    return GRAPHED_LAUNCH_SHARE


@dataclass(frozen=True)
class NodeCost:
    """One node of the step. `weight_bytes`/`kv_bytes`/`other_bytes` split `bytes`; the
    `ideal_*` fields describe the ceiling decoder (see the module docstring)."""
    name: str
    kind: str
    role: str
    weight_bytes: float
    kv_bytes: float
    other_bytes: float
    flops: float
    launches: float         # kernel launches (a share of one inside a CUDA graph)
    ideal_weight_bytes: float
    ideal_kv_bytes: float
    ideal_flops: float
    flops_rate: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.other_bytes

    @property
    def ideal_bytes(self) -> float:
        return self.ideal_weight_bytes + self.ideal_kv_bytes + self.other_bytes

    def roofline_s(self, gpu: GpuSpec) -> float:
        return max(self.bytes / gpu.memory_bandwidth, self.flops / self.flops_rate)

    def ideal_s(self, gpu: GpuSpec) -> float:
        return max(self.ideal_bytes / gpu.memory_bandwidth, self.ideal_flops / self.flops_rate)

    def overhead_s(self, gpu: GpuSpec) -> float:
        return self.launches * gpu.launch_overhead_s

    def bound(self, gpu: GpuSpec) -> str:
        """"memory" or "compute": which side of the roofline the node sits on."""
        return ("memory" if self.bytes / gpu.memory_bandwidth >= self.flops / self.flops_rate
                else "compute")


def smallest_lossless_bytes(model: ModelSpec, linear: str) -> int:
    """Bytes of one linear in the smallest lossless format its dtype allows (measured escapes,
    or none when unmeasured: a ceiling may be optimistic, never pessimistic)."""
    out_features, in_features = model.linear_shape(linear)
    return min(weight_bytes(name, out_features, in_features, model.escape_ppm(linear) or 0)
               for name, fmt in WEIGHT_FORMATS.items()
               if fmt.lossless and fmt.dtype == model.dtype)


def _linear_params(model: ModelSpec, linears) -> int:
    total = 0
    for name in linears:
        out_features, in_features = model.linear_shape(name)
        total += out_features * in_features
    return total


def kv_row_bytes(model: ModelSpec) -> int:
    """K and V bytes of one token in one layer."""
    return 2 * model.num_kv_heads * model.head_dim * DTYPE_BYTES[model.dtype]


def fused_forward_launches(num_layers: int) -> int:
    """Launches of one forward in the fused layer kernels, folded or not as the codegen's
    default (`fold_default()`) has it."""
    from specpilot.codegen.fused_layer import fold_default

    if fold_default():
        return num_layers * FOLDED_LAYER_OPS + FUSED_HEAD_OPS + FOLDED_FORWARD_OPS
    return num_layers * FUSED_LAYER_OPS + FUSED_HEAD_OPS


def attention_flops(model: ModelSpec, rows: int, keys: int) -> float:
    """QK^T and PV of one layer: `rows` query tokens against `keys` positions each."""
    return 4.0 * rows * keys * model.num_heads * model.head_dim


def forward_cost(name: str, kind: str, model: ModelSpec, batch: int, tokens: float, context: float,
                 gpu: GpuSpec, fused: bool = False, generated_attention: bool = False) -> NodeCost:
    """A whole-model forward of `tokens` new tokens per request after `context` positions;
    `fused`: in the fused layer kernels (`fused_forward_launches`), not op by op;
    `generated_attention`: op by op with the generated attention kernel."""
    rows = batch * tokens
    keys = context + tokens
    dtype_bytes = DTYPE_BYTES[model.dtype]
    weights = sum(_weight_bytes(model, n) for n in model.linears)
    ideal = sum(smallest_lossless_bytes(model, n) for n in model.linears)
    kv = model.num_layers * batch * keys * kv_row_bytes(model)
    flops = (2.0 * rows * _linear_params(model, model.linears)
             + model.num_layers * attention_flops(model, rows, keys))
    if fused:
        launches = fused_forward_launches(model.num_layers)
    else:
        launches = (model.num_layers * (ATTENTION_OPS + MLP_OPS
                                        + (QK_NORM_OPS if model.qk_norm else 0))
                    + HEAD_OPS + 1)
        if generated_attention:
            launches += GENERATED_BOUND_OPS
    return NodeCost(name, kind, model.role, weights, kv, rows * model.hidden_size * dtype_bytes,
                    flops, launches, ideal, kv, flops, gpu.flops_for(model.dtype))


def _weight_bytes(model: ModelSpec, linear: str) -> int:
    out_features, in_features = model.linear_shape(linear)
    return weight_bytes(model.format_of(linear), out_features, in_features,
                        model.escape_ppm(linear))


def step_nodes(program: Program, gpu: GpuSpec, batch: int, context: int,
               mean_accepted: float) -> List[NodeCost]:
    """Every node of one steady-state speculative step of `batch` requests with `context`
    committed tokens each, when `mean_accepted` drafts are accepted per step on average. For a
    Program that does not speculate (give mean_accepted 0) the step is one greedy AR forward of
    the target: no drafter node, one token per request, the argmax and the commit."""
    from specpilot.ir import dataflow_graph

    target, drafter = program.models.target, program.models.drafter
    graph = dataflow_graph(program)
    # share of the verified tokens that are kept (all of them in a greedy AR step)
    useful = (mean_accepted + 1.0) / graph.graph["verify_tokens"]
    t_rate = gpu.flops_for(target.dtype)
    fused_drafter = program.kernels.drafter_kernels == "fused"
    generated_attention = program.kernels.attention_kernels == "generated"
    from specpilot.runtime.graphed_program import captures_rounds

    graphed = captures_rounds(program)
    if fused_drafter:
        # Imported here (it imports torch): a fused forward hands wider calls to the model's.
        from specpilot.runtime.fused_forward import MAX_FUSED_TOKENS
    out: List[NodeCost] = []
    for name, a in graph.nodes(data=True):
        kind, tokens = a["kind"], a["tokens"]
        rows = batch * tokens
        if kind == "drafter_forward":
            # The first forward re-feeds what the previous step committed (accepted + bonus).
            width = mean_accepted + 1.0 if a["depth"] == 1 else tokens
            node = forward_cost(name, kind, drafter, batch, width, context, gpu,
                                fused=fused_drafter and batch * width <= MAX_FUSED_TOKENS,
                                generated_attention=generated_attention)
        elif kind in ("attention", "mlp", "lm_head", "embed"):
            linears = a["linears"]
            ideal_w = sum(smallest_lossless_bytes(target, n) for n in linears)
            flops = 2.0 * rows * _linear_params(target, linears)
            kv = 0
            if kind == "attention":
                kv = batch * (context + tokens) * kv_row_bytes(target)
                flops += attention_flops(target, rows, context + tokens)
                launches = ATTENTION_OPS + (QK_NORM_OPS if target.qk_norm else 0)
            elif kind == "mlp":
                launches = MLP_OPS
            elif kind == "lm_head":
                launches = HEAD_OPS
            else:
                # The embedding opens the forward: the generated attention's bound goes with it.
                ideal_w = a["weight_bytes"]
                launches = 1 + (GENERATED_BOUND_OPS if generated_attention else 0)
            node = NodeCost(name, kind, "target", a["weight_bytes"], kv, 0, flops, launches,
                            ideal_w, kv, flops * useful, t_rate)
        elif kind == "accept":
            logits = rows * target.vocab_size * 4
            node = NodeCost(name, kind, "step", 0, 0, logits, rows * target.vocab_size,
                            ACCEPT_OPS, 0, 0, rows * target.vocab_size, t_rate)
        elif kind == "commit" and a.get("kv") == "compact":
            moved = 2 * target.num_layers * batch * mean_accepted * kv_row_bytes(target)
            node = NodeCost(name, kind, "step", 0, moved, 0, 0, target.num_layers, 0, 0, 0,
                            t_rate)
        elif kind == "commit" and graphed:      # a chain's round end on the device
            accept = program.kernels.accept_kernels
            adaptive = program.batch.draft_length_policy == "per_request_adaptive"
            node = NodeCost(name, kind, "step", 0, 0, 0, 0,
                            GRAPHED_COMMIT_OPS[accept]
                            + (GRAPHED_LENGTH_UPDATE_OPS[accept] if adaptive else 0),
                            0, 0, 0, t_rate)
        else:   # build_draft, eager in-place commit: bookkeeping on the host
            node = NodeCost(name, kind, "step", 0, 0, 0, 0, 0, 0, 0, 0, t_rate)
        out.append(node)
    if graphed:                         # the others run eagerly: every launch paid
        share = graphed_share(gpu)
        out = [replace(n, launches=n.launches * share) for n in out]
    return out


def summed_seconds(nodes, gpu: GpuSpec) -> Tuple[float, float]:
    """(roofline, overhead) seconds of `nodes` together, the two a calibration weighs."""
    return (sum(n.roofline_s(gpu) for n in nodes), sum(n.overhead_s(gpu) for n in nodes))


def gap_parts(node: NodeCost, gpu: GpuSpec, alpha: float, beta: float,
              ceiling_alpha: float) -> Dict[str, float]:
    """The node's predicted time (alpha x roofline + beta x overhead) above its ideal time
    (ceiling_alpha x ideal roofline), split by category (seconds; all parts >= 0):

    bytes above ideal        -> weight movement / attention & KV (drafting for drafter nodes)
    FLOPs above ideal        -> verification compute (drafting for drafter nodes)
    rate below the roofline  -> (alpha - ceiling_alpha) x ideal time, to the node's own kind
    launches                 -> launch/sync overhead
    """
    bw, rate = gpu.memory_bandwidth, node.flops_rate
    b, bi = node.bytes / bw, node.ideal_bytes / bw
    f, fi = node.flops / rate, node.ideal_flops / rate
    bytes_excess = alpha * (max(b, f) - max(bi, f))
    compute_excess = alpha * (max(bi, f) - max(bi, fi))
    slow = (alpha - ceiling_alpha) * max(bi, fi)
    parts = {"launch_sync": beta * node.overhead_s(gpu)}
    if node.role == "drafter":
        parts["drafting"] = bytes_excess + compute_excess + slow
        return parts
    parts["verification_compute"] = compute_excess
    extra_w = node.weight_bytes - node.ideal_weight_bytes
    extra_kv = node.kv_bytes - node.ideal_kv_bytes
    if extra_w + extra_kv > 0:
        parts["weight_movement"] = bytes_excess * extra_w / (extra_w + extra_kv)
        parts["attention_kv"] = bytes_excess * extra_kv / (extra_w + extra_kv)
    if slow > 0:
        if fi > bi:
            parts["verification_compute"] += slow
        elif node.ideal_bytes > 0:
            for category, share in (("weight_movement", node.ideal_weight_bytes),
                                    ("attention_kv", node.ideal_kv_bytes),
                                    ("verification_compute", node.other_bytes)):
                parts[category] = parts.get(category, 0.0) + slow * share / node.ideal_bytes
    return parts


def time_parts(node: NodeCost, gpu: GpuSpec, alpha: float, beta: float) -> Dict[str, float]:
    """Where the node's predicted time goes, by category (seconds): the memory time split by
    byte kind, compute beyond it, launches."""
    bw, rate = gpu.memory_bandwidth, node.flops_rate
    b, f = node.bytes / bw, node.flops / rate
    parts = {"launch_sync": beta * node.overhead_s(gpu)}
    if node.role == "drafter":
        parts["drafting"] = alpha * max(b, f)
        return parts
    if node.bytes > 0:
        for category, share in (("weight_movement", node.weight_bytes),
                                ("attention_kv", node.kv_bytes),
                                ("verification_compute", node.other_bytes)):
            parts[category] = parts.get(category, 0.0) + alpha * b * share / node.bytes
    parts["verification_compute"] = parts.get("verification_compute", 0.0) + alpha * max(0.0, f - b)
    return parts
