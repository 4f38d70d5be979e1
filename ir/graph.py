"""`dataflow_graph(program)`: a networkx view of one speculative step, derived from the Program.

Nodes, in dataflow order:

    draft.forward[1] → … → draft.forward[D]      drafter forwards, one per draft depth
    → draft.build                                lay the drafted tokens out as chain / tree
    → target.embed → target.layers.{i}.attention → target.layers.{i}.mlp (i = 0..L-1)
    → target.lm_head → verify.accept → commit    (draft.build → verify.accept as well)

Every node carries:
    kind:     drafter_forward | build_draft | embed | attention | mlp | lm_head | accept | commit
    role:     "target" | "drafter" | None (bookkeeping nodes)
    tokens:   tokens the node processes per sequence per step
    linears:  the linears whose weights it reads (full names, without the role)
    weight_bytes:           bytes of weights read, by each linear's format (formats.weight_bytes)
    weight_bytes_by_format: the same split per format, e.g. {"bf16": 384}

A Program that does not speculate (`draft.drafter` "none") has no draft nodes: its step is one
greedy AR forward of the target (one token per sequence), then accept (the argmax) and commit.

Weight bytes count the linear matrices, plus the embedding rows gathered by `target.embed` (in
the compute dtype). Norm weights and biases (O(hidden) per layer) are left out. The graph is a
view for the cost model, legality checks and drawing; the Program stays the source of truth.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import networkx as nx

from .formats import DTYPE_BYTES, weight_bytes
from .model_spec import ModelSpec, layer_linear_names
from .program import Program
from .topology import Chain, DynamicTree


def linear_weight_bytes(model: ModelSpec, linear: str) -> int:
    """Bytes of one linear's weight matrix in its format (lossless12 escapes included)."""
    out_features, in_features = model.linear_shape(linear)
    return weight_bytes(model.format_of(linear), out_features, in_features,
                        model.escape_ppm(linear))


def _weights(model: ModelSpec, linears: Iterable[str]) -> Tuple[int, Dict[str, int]]:
    by_format: Dict[str, int] = {}
    for name in linears:
        fmt = model.format_of(name)
        by_format[fmt] = by_format.get(fmt, 0) + linear_weight_bytes(model, name)
    return sum(by_format.values()), by_format


def _add(g: nx.DiGraph, name: str, kind: str, role: Optional[str], tokens: int,
         model: Optional[ModelSpec] = None, linears: Tuple[str, ...] = (), **extra) -> None:
    total, by_format = _weights(model, linears) if linears else (0, {})
    g.add_node(name, kind=kind, role=role, tokens=tokens, linears=linears, weight_bytes=total,
               weight_bytes_by_format=by_format, **extra)


def _structure(topo) -> str:
    if isinstance(topo, Chain):
        return "chain"
    return "dynamic_tree" if isinstance(topo, DynamicTree) else "tree"


def dataflow_graph(program: Program) -> nx.DiGraph:
    """The per-step dataflow of `program` as a DiGraph (see the module docstring for its nodes
    and attributes). Graph attributes: topology (str), draft_tokens, verify_tokens."""
    target, drafter = program.models.target, program.models.drafter
    topo = program.draft.topology
    speculates = program.draft.speculates
    # Greedy AR (no speculation) has no draft nodes: the target reads the last committed token
    # and commits one.
    widths: Tuple[int, ...] = topo.level_widths() if speculates else ()
    num_nodes = topo.num_nodes if speculates else 0
    # Forward d runs on the nodes of depth d-1 (the root first); a dynamic tree's levels hold
    # the kept candidates, of which `budget` reach the target.
    width_at = [1] + list(widths)
    verify_tokens = num_nodes + 1  # the drafted tokens plus the last committed one

    g = nx.DiGraph(topology=program.draft.describe(), draft_tokens=num_nodes,
                   verify_tokens=verify_tokens)
    order = []
    for depth in range(1, len(widths) + 1):
        name = f"draft.forward[{depth}]"
        # Forward `depth` runs on the tokens of depth-1 (the root first) to propose their children.
        _add(g, name, "drafter_forward", "drafter", width_at[depth - 1], drafter, drafter.linears,
             depth=depth)
        order.append(name)
    if speculates:
        _add(g, "draft.build", "build_draft", None, num_nodes, structure=_structure(topo))
        order.append("draft.build")

    embed_bytes = verify_tokens * target.hidden_size * DTYPE_BYTES[target.dtype]
    g.add_node("target.embed", kind="embed", role="target", tokens=verify_tokens, linears=(),
               weight_bytes=embed_bytes, weight_bytes_by_format={target.dtype: embed_bytes})
    order.append("target.embed")
    for i in range(target.num_layers):
        attention, mlp = layer_linear_names(i)[:4], layer_linear_names(i)[4:]
        _add(g, f"target.layers.{i}.attention", "attention", "target", verify_tokens, target,
             attention, layer=i, mask=program.verify.mask)
        _add(g, f"target.layers.{i}.mlp", "mlp", "target", verify_tokens, target, mlp, layer=i)
        order += [f"target.layers.{i}.attention", f"target.layers.{i}.mlp"]
    _add(g, "target.lm_head", "lm_head", "target", verify_tokens, target, ("lm_head",))
    _add(g, "verify.accept", "accept", None, verify_tokens, rule=program.verify.acceptance)
    _add(g, "commit", "commit", None, verify_tokens, kv=program.commit.kv)
    order += ["target.lm_head", "verify.accept", "commit"]

    nx.add_path(g, order)
    if speculates:
        g.add_edge("draft.build", "verify.accept")  # acceptance compares the drafted tokens
    return g


def total_weight_bytes(graph: nx.DiGraph, role: Optional[str] = None) -> int:
    """Sum of `weight_bytes` over the graph's nodes (of one role when given)."""
    return sum(attrs["weight_bytes"] for _, attrs in graph.nodes(data=True)
               if role is None or attrs["role"] == role)
