"""`lower_program(program) -> KernelPlan`: a kernel for every compute node of a Program.

Lowering is a named list of pure passes over a tuple of `Site`s (one per compute node), read top
to bottom in `PASSES`:

    enumerate compute nodes       every node of the target, the drafter and the speculative step,
                                  in execution order, with the shapes and formats it works on
    fuse gate and up projections  a layer's gate_proj and up_proj become one gate_up_silu node when
                                  both are dense in one format (the model calls them together)
    choose default kernels        a family and parameters per node from its shapes, dtype and
                                  weight format (the heuristics below; legality is the schema's)
    apply kernel overrides        `program.kernels.overrides`, matched by node name or by the name
                                  without `layers.N.` (all layers); exact names win, both merge

then `assemble_plan` dedupes identical specs into the KernelPlan.

Node names: `<role>.layers.<i>.<part>` and `<role>.final_norm`, `<role>.lm_head` for role target
or drafter, where part is input_norm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm (Qwen3),
self_attn.rope, self_attn.attention, self_attn.varlen_attention (ragged batch layout only: the
packed verification and drafting forwards), post_attention_norm, mlp.gate_up (fused) or
mlp.{gate,up}_proj, mlp.down_proj; and `step.greedy_accept`, `step.kv_compact` (trees only),
and where the Program's graphed chain rounds end in generated kernels (`kernels.accept_kernels`
"fused"), `step.chain_commit`, `step.chain_commit_plain` (continuous refill),
`step.length_policy` (adaptive lengths) and `step.length_admit` (both): codegen/round_end.py.

An override is `{param: value}` for a node; the reserved param `family` picks another family the
node may run (a CUDA GEMV: `gemv_bf16` for a bf16 linear, `gemv_lossless12` for a lossless12 one).
Parameters that follow from the Program (dtype, head_dim, bias, lossless12 base layout, ...)
cannot be overridden.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from specpilot.ir import Program, verify
from specpilot.ir.model_spec import ModelSpec

from .errors import KernelSpecError
from .families import MAX_FMA_TILE, next_power_of_two
from .kernel_spec import KernelSpec, get_family, known_families
from .params import measured_linear_tiles
from .plan import KernelPlan, PlanNode, kernel_key
from .round_end import round_end_specs

KERNEL_DTYPE = {"bfloat16": "bf16", "float32": "fp32"}
FAMILY_OVERRIDE = "family"
_LAYER = re.compile(r"\.layers\.[0-9]+\.")


class LoweringError(KernelSpecError):
    """A Program that cannot be lowered (a shape no kernel family takes, a bad override)."""


@dataclass(frozen=True)
class Site:
    """A compute node while it is being lowered: what it computes (`op`, `attrs`), and once
    chosen, the kernel family and parameters that run it."""
    name: str
    op: str
    attrs: Tuple[Tuple[str, Any], ...]
    linears: Tuple[str, ...] = ()
    family: Optional[str] = None
    params: Tuple[Tuple[str, Any], ...] = ()

    def attr(self, name: str) -> Any:
        return dict(self.attrs)[name]


def _site(name: str, op: str, linears: Tuple[str, ...] = (), **attrs) -> Site:
    return Site(name, op, tuple(sorted(attrs.items())), linears)


def layerless(name: str) -> str:
    """`target.layers.3.mlp.down_proj` -> `target.mlp.down_proj` (the all-layers override key)."""
    return _LAYER.sub(".", name, count=1)


# ------------------------------------------------------------------- pass 1: enumerate nodes

def decode_queries(program: Program, role: str) -> int:
    """Tokens per request in one decode forward: root + every draft node for the target's
    verification; the widest drafted level for the drafter (1 for a chain)."""
    topology = program.draft.topology
    if role == "target":
        return topology.num_nodes + 1
    return max(topology.level_widths(), default=1)


def _model_sites(program: Program, role: str) -> Tuple[Site, ...]:
    m: ModelSpec = getattr(program.models, role)
    dtype = m.dtype
    queries = decode_queries(program, role)
    rows = program.batch.max_batch_size * queries

    def linear(layer: Optional[int], short: str, bias: bool = False) -> Site:
        ckpt = short if layer is None else f"layers.{layer}.{short}"
        out_features, in_features = m.linear_shape(ckpt)
        return _site(f"{role}.{ckpt}", "linear", (ckpt,), dtype=dtype, format=m.format_of(ckpt),
                     out_features=out_features, in_features=in_features, bias=bias, rows=rows)

    def norm(name: str, width: int) -> Site:
        return _site(name, "rmsnorm", dtype=dtype, width=width)

    heads = dict(num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim)
    sites = []
    for i in range(m.num_layers):
        p = f"{role}.layers.{i}"
        sites.append(norm(f"{p}.input_norm", m.hidden_size))
        sites += [linear(i, f"self_attn.{n}_proj", m.qkv_bias) for n in "qkv"]
        if m.qk_norm:
            sites += [norm(f"{p}.self_attn.q_norm", m.head_dim), norm(f"{p}.self_attn.k_norm", m.head_dim)]
        sites.append(_site(f"{p}.self_attn.rope", "rope", dtype=dtype, **heads))
        sites.append(_site(f"{p}.self_attn.attention", "attention", dtype=dtype, mask=program.verify.mask,
                           queries=queries, **heads))
        if program.batch.layout == "ragged":
            sites.append(_site(f"{p}.self_attn.varlen_attention", "varlen_attention", dtype=dtype,
                               queries=queries, **heads))
        sites.append(linear(i, "self_attn.o_proj"))
        sites.append(norm(f"{p}.post_attention_norm", m.hidden_size))
        sites += [linear(i, "mlp.gate_proj"), linear(i, "mlp.up_proj"), linear(i, "mlp.down_proj")]
    sites.append(norm(f"{role}.final_norm", m.hidden_size))
    sites.append(linear(None, "lm_head"))
    return tuple(sites)


def _step_sites(program: Program) -> Tuple[Site, ...]:
    t = program.models.target
    nodes = program.draft.topology.num_nodes
    sites = [_site("step.greedy_accept", "greedy_accept", vocab_size=t.vocab_size, draft_nodes=nodes)]
    if program.commit.kv == "compact":
        sites.append(_site("step.kv_compact", "kv_compact", layers=t.num_layers,
                           row=t.num_kv_heads * t.head_dim, draft_nodes=nodes))
    return tuple(sites) + _round_end_sites(program)


def _round_end_sites(program: Program) -> Tuple[Site, ...]:
    """The kernels that end the Program's graphed chain rounds (codegen/round_end.py), where
    they end in generated kernels and the rounds are captured; none otherwise."""
    if program.kernels.accept_kernels != "fused":
        return ()
    # Which decoder runs the rounds is the graphed runtime's to say (imported only here).
    from specpilot.runtime.graphed_program import captures_rounds, length_cap, refills

    if not captures_rounds(program):
        return ()
    adaptive = (program.batch.draft_length_policy == "per_request_adaptive"
                and bool(length_cap(program)))
    specs = round_end_specs(refills(program), adaptive, program.batch.length_estimator)
    return tuple(_site(name, spec.family, **{param.lower(): value for param, value in spec.params
                                             if param != "num_warps"})
                 for name, spec in specs.items())


def enumerate_sites(program: Program, _: Tuple[Site, ...] = ()) -> Tuple[Site, ...]:
    """Every compute node: target layers and head, drafter layers and head, the step."""
    return _model_sites(program, "target") + _model_sites(program, "drafter") + _step_sites(program)


# ------------------------------------------------------------------- pass 2: fuse gate and up

def _fusable(gate: Site, up: Site) -> bool:
    fmt = gate.attr("format")
    # gate_up_silu reads plain matrices; a packed format has its own linear family only.
    return fmt == up.attr("format") and fmt in ("bf16", "fp32")


def fuse_gate_up(program: Program, sites: Tuple[Site, ...]) -> Tuple[Site, ...]:
    """Replace each layer's gate_proj + up_proj pair by one `mlp.gate_up` gate_up_silu node."""
    out = []
    i = 0
    while i < len(sites):
        site = sites[i]
        nxt = sites[i + 1] if i + 1 < len(sites) else None
        if (site.name.endswith(".mlp.gate_proj") and nxt is not None
                and nxt.name == site.name[:-len("gate_proj")] + "up_proj" and _fusable(site, nxt)):
            a = dict(site.attrs)
            out.append(_site(site.name[:-len("gate_proj")] + "gate_up", "gate_up_silu",
                             site.linears + nxt.linears, dtype=a["dtype"], format=a["format"],
                             out_features=a["out_features"], in_features=a["in_features"],
                             rows=a["rows"]))
            i += 2
            continue
        out.append(site)
        i += 1
    return tuple(out)


# ------------------------------------------------------------------- pass 3: default kernels

def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def matmul_tiles(rows: int, n: int, k: int, block_n_max: int, dot_block_k_min: int = 16) -> Dict[str, Any]:
    """Tiles for x[rows, k] @ w[n, k]^T.

    Decode and verification multiply few rows by a large matrix: below 16 rows tensor cores
    would mostly multiply padding, so a multiply-add tile of exactly the rows is used, with K
    steps shrunk until the tile fits in registers. From 16 rows on, tl.dot tiles of 16 rows.
    """
    if rows >= 16:
        return dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=_clamp(next_power_of_two(n), 16, block_n_max),
                    BLOCK_K=_clamp(next_power_of_two(k), dot_block_k_min, 64))
    block_m = next_power_of_two(max(rows, 1))
    block_n = _clamp(next_power_of_two(n), 8, block_n_max)
    block_k = _clamp(next_power_of_two(k), 16, 128)
    while block_m * block_n * block_k > MAX_FMA_TILE and block_k > 16:
        block_k //= 2
    return dict(USE_DOT=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)


def measured_tiles(rows: int, n: int, k: int) -> Optional[Dict[str, Any]]:
    """The measured bf16 `linear` tiles for x[rows, k] @ w[n, k]^T (params.LINEAR_TILES),
    narrowed to a small matrix (no tile wider than the matrix, no K split without a K step for
    each part), or None when nothing was measured for that many rows."""
    tiles = measured_linear_tiles(rows, n, k)
    if tiles is None:
        return None
    tiles["BLOCK_N"] = min(tiles["BLOCK_N"], max(16, next_power_of_two(n)))
    tiles["BLOCK_K"] = min(tiles["BLOCK_K"], max(16, next_power_of_two(k)))
    tiles["SPLIT_K"] = max(1, min(tiles["SPLIT_K"], -(-k // tiles["BLOCK_K"])))
    return dict(USE_DOT=True, **tiles)


def _linear_params(s: Site) -> Dict[str, Any]:
    dtype = KERNEL_DTYPE[s.attr("dtype")]
    rows, n, k = dict(s.attrs).get("rows"), s.attr("out_features"), s.attr("in_features")
    # The table was measured in bf16; other dtypes (and a node whose rows are unknown) keep the
    # tiles derived from the shape alone.
    tiles = measured_tiles(rows, n, k) if dtype == "bf16" and rows else None
    return dict(DTYPE=dtype, HAS_BIAS=s.attr("bias"), **(tiles or matmul_tiles(rows, n, k, 64)))


def _lossless12_params(s: Site) -> Dict[str, Any]:
    # BASE=row: the generated backend packs with one base per row (the packer's default).
    return dict(BASE="row", HAS_BIAS=s.attr("bias"),
                **matmul_tiles(s.attr("rows"), s.attr("out_features"), s.attr("in_features"), 32,
                               dot_block_k_min=32))


def _gemv_params(s: Site) -> Dict[str, Any]:
    return dict(M_MAX=_clamp(s.attr("rows"), 1, 8), HAS_BIAS=s.attr("bias"))


def _gate_up_params(s: Site) -> Dict[str, Any]:
    return dict(DTYPE=KERNEL_DTYPE[s.attr("dtype")],
                **matmul_tiles(s.attr("rows"), s.attr("out_features"), s.attr("in_features"), 32))


def _rmsnorm_params(s: Site) -> Dict[str, Any]:
    # One pass over a row when it fits a block of 4096; wider rows loop. The model adds the
    # residual itself, so the kernel normalises without the fused add.
    block = _clamp(next_power_of_two(s.attr("width")), 16, 4096)
    return dict(DTYPE=KERNEL_DTYPE[s.attr("dtype")], BLOCK_H=block, HAS_RESIDUAL=False,
                num_warps=4 if block <= 1024 else 8)


def _rope_params(s: Site) -> Dict[str, Any]:
    # The model computes HF's cos/sin tables (with any RoPE scaling) once per forward; reading
    # them keeps the rotation bit-identical to the torch backend.
    return dict(DTYPE=KERNEL_DTYPE[s.attr("dtype")], HEAD_DIM=s.attr("head_dim"), COS_SIN="table")


def _attention_params(s: Site) -> Dict[str, Any]:
    group = s.attr("num_heads") // s.attr("num_kv_heads")
    return dict(DTYPE=KERNEL_DTYPE[s.attr("dtype")], HEAD_DIM=s.attr("head_dim"),
                BLOCK_R=_clamp(next_power_of_two(s.attr("queries") * group), 16, 64), BLOCK_S=64)


def _varlen_attention_params(s: Site) -> Dict[str, Any]:
    # One program per (request, kv head, block of rows): a request's queries times the group.
    return _attention_params(s)


def _greedy_accept_params(s: Site) -> Dict[str, Any]:
    return dict(BLOCK_V=_clamp(next_power_of_two(s.attr("vocab_size")), 64, 2048))


def _round_end_params(s: Site) -> Dict[str, Any]:
    # A round-end site's attributes are its spec's parameters, lower-cased (`_round_end_sites`).
    return {name.upper(): value for name, value in s.attrs}


def _kv_compact_params(s: Site) -> Dict[str, Any]:
    return dict(BLOCK=_clamp(next_power_of_two(s.attr("row")), 32, 1024))


# family -> (default parameters of a site, parameters that follow from the Program)
FAMILY_CHOICES: Dict[str, Tuple[Callable[[Site], Dict[str, Any]], Tuple[str, ...]]] = {
    "linear": (_linear_params, ("DTYPE", "HAS_BIAS")),
    "linear_lossless12": (_lossless12_params, ("BASE", "HAS_BIAS")),
    "gemv_bf16": (_gemv_params, ("HAS_BIAS",)),
    "gemv_lossless12": (_gemv_params, ("HAS_BIAS",)),
    "gate_up_silu": (_gate_up_params, ("DTYPE",)),
    "rmsnorm": (_rmsnorm_params, ("DTYPE", "HAS_RESIDUAL")),
    "rope": (_rope_params, ("DTYPE", "HEAD_DIM", "COS_SIN")),
    "attention": (_attention_params, ("DTYPE", "HEAD_DIM")),
    "varlen_attention": (_varlen_attention_params, ("DTYPE", "HEAD_DIM")),
    "greedy_accept": (_greedy_accept_params, ()),
    "kv_compact": (_kv_compact_params, ()),
    # The round's end: what each node computes is its whole specialisation (round_end.py).
    "chain_commit": (_round_end_params, ("LOG",)),
    "length_policy": (_round_end_params, ("ESTIMATOR", "OBJECTIVE", "TURN_OFF")),
    "length_admit": (_round_end_params, ("ESTIMATOR",)),
    "row_start": (_round_end_params, ()),
}


def allowed_families(site: Site) -> Tuple[str, ...]:
    """The families that can run `site`, its default first."""
    if site.op != "linear":
        return (site.op,)
    families = {"lossless12": ("linear_lossless12", "gemv_lossless12"),
                "bf16": ("linear", "gemv_bf16")}.get(site.attr("format"), ("linear",))
    return tuple(f for f in families if f in known_families())


def _spec(site: Site, family: str, params: Mapping[str, Any], context: str) -> KernelSpec:
    try:
        return KernelSpec(family, tuple(params.items()))
    except KernelSpecError as exc:
        raise LoweringError(f"{context}: {exc}") from None


def choose_kernels(program: Program, sites: Tuple[Site, ...]) -> Tuple[Site, ...]:
    """Give every site its default family and parameters (validated by the family schema)."""
    out = []
    for site in sites:
        family = allowed_families(site)[0]
        params = FAMILY_CHOICES[family][0](site)
        spec = _spec(site, family, params, f"{site.name}: no {family} kernel fits this node")
        out.append(replace(site, family=family, params=spec.params))
    return tuple(out)


# ------------------------------------------------------------------- pass 4: overrides

def _override_map(program: Program) -> Dict[str, Dict[str, Any]]:
    return {node: dict(params) for node, params in program.kernels.overrides}


def _unknown_override(key: str, sites: Tuple[Site, ...]) -> LoweringError:
    hint = ""
    if key.endswith((".mlp.gate_proj", ".mlp.up_proj")):
        hint = (" (this Program fuses gate_proj and up_proj into one node: override "
                f"{key.rsplit('.', 1)[0]}.gate_up)")
    examples = ", ".join(s.name for s in sites[:3])
    return LoweringError(f"kernels.overrides[{key}]: no node of this Program is named so{hint}; "
                         f"names look like {examples}, or without 'layers.N.' for every layer")


def _check_override(key: str, site: Site, params: Mapping[str, Any], family: str) -> None:
    schema = get_family(family)
    locked = FAMILY_CHOICES[family][1]
    for name in params:
        if name == FAMILY_OVERRIDE:
            continue
        where = f"kernels.overrides[{key}][{name}]"
        try:
            schema.param(name)
        except KernelSpecError as exc:
            raise LoweringError(f"{where}: {exc}") from None
        if name in locked:
            raise LoweringError(f"{where}: {name} follows from the Program ({site.name} needs "
                                f"{dict(site.params).get(name)!r}) and cannot be overridden")


def _override_family(key: str, site: Site, value: Any) -> str:
    where = f"kernels.overrides[{key}][{FAMILY_OVERRIDE}]"
    try:
        get_family(value)
    except KernelSpecError as exc:
        raise LoweringError(f"{where}: {exc}") from None
    allowed = allowed_families(site)
    if value not in allowed:
        raise LoweringError(f"{where}: {value} cannot run {site.name} (a {site.op} node"
                            + (f" in {site.attr('format')}" if site.op == "linear" else "")
                            + f"); allowed: {', '.join(allowed)}")
    return value


def apply_overrides(program: Program, sites: Tuple[Site, ...]) -> Tuple[Site, ...]:
    """Apply `program.kernels.overrides`: the layer-less key first, the exact node name on top."""
    overrides = _override_map(program)
    names = {s.name for s in sites} | {layerless(s.name) for s in sites}
    for key in sorted(overrides):
        if key not in names:
            raise _unknown_override(key, sites)
    out = []
    for site in sites:
        keys = [k for k in dict.fromkeys((layerless(site.name), site.name)) if k in overrides]
        if not keys:
            out.append(site)
            continue
        family = site.family
        for key in keys:
            if FAMILY_OVERRIDE in overrides[key]:
                family = _override_family(key, site, overrides[key][FAMILY_OVERRIDE])
        base = dict(site.params) if family == site.family else FAMILY_CHOICES[family][0](site)
        for key in keys:
            _check_override(key, replace(site, params=tuple(base.items())), overrides[key], family)
            base.update((k, v) for k, v in overrides[key].items() if k != FAMILY_OVERRIDE)
        spec = _spec(site, family, base, f"kernels.overrides[{keys[-1]}] for {site.name}")
        out.append(replace(site, family=family, params=spec.params))
    return tuple(out)


# ------------------------------------------------------------------- the pipeline

PASSES: Tuple[Tuple[str, Callable[[Program, Tuple[Site, ...]], Tuple[Site, ...]]], ...] = (
    ("enumerate compute nodes", enumerate_sites),
    ("fuse gate and up projections", fuse_gate_up),
    ("choose default kernels", choose_kernels),
    ("apply kernel overrides", apply_overrides),
)


def assemble_plan(sites: Tuple[Site, ...]) -> KernelPlan:
    """The KernelPlan of lowered sites: identical specs become one kernel entry."""
    kernels: Dict[str, KernelSpec] = {}
    nodes = []
    for site in sites:
        spec = KernelSpec(site.family, site.params)
        key = kernel_key(spec)
        kernels[key] = spec
        nodes.append(PlanNode(site.name, site.op, key, site.linears, site.attrs))
    return KernelPlan(nodes=tuple(nodes), kernels=tuple(kernels.items()))


def lower_program(program: Program) -> KernelPlan:
    """The KernelPlan of a well-formed Program: every compute node of target and drafter and
    of the speculative step gets a KernelSpec. Raises IllFormed for an ill-formed Program and
    LoweringError (naming the node or override) when no kernel can run a node as asked."""
    verify(program)
    sites: Tuple[Site, ...] = ()
    for _, run_pass in PASSES:
        sites = run_pass(program, sites)
    return assemble_plan(sites)
