"""The dataflow graph view: nodes, edges and weight bytes, checked against hand computation.

The default test spec (conftest): hidden 8, mlp 12, 2 heads / 1 kv head of dim 4, vocab 16.
Per linear (out x in elements):  q 8x8=64, k 4x8=32, v 32, o 8x8=64,
                                 gate 12x8=96, up 96, down 8x12=96, lm_head 16x8=128.
In bf16 (2 B): attention 2*(64+32+32+64) = 384 B, mlp 2*(96*3) = 576 B, lm_head 256 B.
"""
from specpilot.ir import (SetTopology, SetWeightFormat, Tree, apply, dataflow_graph,
                          record_escape_rates, weight_bytes)
from specpilot.ir.graph import linear_weight_bytes, total_weight_bytes


def test_chain_graph_nodes_edges_and_bytes(stock):
    g = dataflow_graph(stock)
    assert list(g.nodes) == [
        "draft.forward[1]", "draft.forward[2]", "draft.forward[3]", "draft.forward[4]",
        "draft.build", "target.embed",
        "target.layers.0.attention", "target.layers.0.mlp",
        "target.layers.1.attention", "target.layers.1.mlp",
        "target.lm_head", "verify.accept", "commit"]
    order = list(g.nodes)
    assert set(g.edges) == set(zip(order, order[1:])) | {("draft.build", "verify.accept")}
    assert g.graph == {"topology": "chain(4)", "draft_tokens": 4, "verify_tokens": 5}

    n = g.nodes
    # The 1-layer drafter reads all its weights every forward: 384 + 576 + 256.
    for d in range(1, 5):
        assert n[f"draft.forward[{d}]"]["weight_bytes"] == 1216
        assert n[f"draft.forward[{d}]"]["tokens"] == 1
        assert n[f"draft.forward[{d}]"]["role"] == "drafter"
    assert n["target.layers.1.attention"]["weight_bytes"] == 384
    assert n["target.layers.1.attention"]["linears"] == (
        "layers.1.self_attn.q_proj", "layers.1.self_attn.k_proj", "layers.1.self_attn.v_proj",
        "layers.1.self_attn.o_proj")
    assert n["target.layers.0.mlp"]["weight_bytes_by_format"] == {"bf16": 576}
    assert n["target.lm_head"]["weight_bytes"] == 256
    assert n["target.embed"]["weight_bytes"] == 5 * 8 * 2  # 5 rows of hidden 8 in bf16
    assert n["target.layers.0.mlp"]["tokens"] == 5
    for name in ("draft.build", "verify.accept", "commit"):
        assert n[name]["weight_bytes"] == 0 and n[name]["role"] is None
    assert (n["verify.accept"]["rule"], n["commit"]["kv"]) == ("greedy", "in_place")
    assert total_weight_bytes(g, "drafter") == 4 * 1216
    assert total_weight_bytes(g, "target") == 80 + 2 * (384 + 576) + 256
    assert total_weight_bytes(g) == 4 * 1216 + 80 + 2 * (384 + 576) + 256
    kinds = [n[x]["kind"] for x in order]
    assert kinds == ["drafter_forward"] * 4 + ["build_draft", "embed", "attention", "mlp",
                                               "attention", "mlp", "lm_head", "accept", "commit"]


def test_tree_graph_widths(stock):
    # tree([2, 3]): 2 nodes at depth 1, 6 at depth 2, so 8 drafted, 9 verified with the root.
    g = dataflow_graph(apply(stock, SetTopology(Tree((2, 3)))))
    assert [x for x in g.nodes if x.startswith("draft.forward")] == ["draft.forward[1]",
                                                                      "draft.forward[2]"]
    assert g.nodes["draft.forward[1]"]["tokens"] == 1
    assert g.nodes["draft.forward[2]"]["tokens"] == 2
    assert g.graph == {"topology": "tree([2, 3])", "draft_tokens": 8, "verify_tokens": 9}
    assert g.nodes["target.layers.0.attention"]["mask"] == "tree"
    assert g.nodes["target.embed"]["weight_bytes"] == 9 * 8 * 2
    assert g.nodes["commit"]["kv"] == "compact"


def test_lossless12_bytes_include_escapes(stock):
    # down_proj [8, 12]: 96 sign/mantissa bytes + 8 rows x 6 code bytes + 8 x (1 base + 4 row
    # pointer) + 4 closing pointer + ceil(96 * 10000 / 1e6) = 1 escape of 6 B = 194 B.
    p = record_escape_rates(stock, "target", {"layers.1.mlp.down_proj": 10_000})
    p = apply(p, SetWeightFormat("target.layers.1.mlp.down_proj", "lossless12"))
    g = dataflow_graph(p)
    assert linear_weight_bytes(p.models.target, "layers.1.mlp.down_proj") == 194
    assert g.nodes["target.layers.1.mlp"]["weight_bytes_by_format"] == {"bf16": 384,
                                                                        "lossless12": 194}
    assert g.nodes["target.layers.1.mlp"]["weight_bytes"] == 578
    assert g.nodes["target.layers.0.mlp"]["weight_bytes"] == 576


def test_weight_bytes_by_format():
    assert weight_bytes("bf16", 10, 100) == 2000
    assert weight_bytes("fp32", 10, 100) == 4000
    # 1000 + 10 x 50 code bytes + 10 x 5 row bytes + 4 = 1554
    assert weight_bytes("lossless12", 10, 100, 0) == 1554
    assert weight_bytes("lossless12", 10, 101, 0) == 1010 + 10 * 51 + 54  # odd rows pad a nibble
    assert weight_bytes("lossless12", 10, 100, 1500) == 1554 + 2 * 6   # 1.5 escapes -> 2
    # unmeasured: counted at the 20000 ppm limit -> 20 escapes per 1000 weights
    assert weight_bytes("lossless12", 10, 100) == 1554 + 20 * 6


def test_lossless12_bytes_match_the_packer():
    """The IR's byte accounting equals the size of what the real packer produces."""
    import torch

    from specpilot.codegen.formats import pack_lossless12, packed_nbytes

    for n, k in ((8, 12), (37, 53), (64, 128)):
        # rows of very different scales, and a few outliers that must escape
        w = (torch.randn(n, k) * torch.exp(torch.randn(n, 1) * 3)).to(torch.bfloat16)
        w[torch.randint(0, n, (3,)), torch.randint(0, k, (3,))] = 1e30
        t = pack_lossless12(w)
        assert t.num_escapes >= 1
        # the measured rate in whole ppm, rounded down: below 1e6 weights the count is then exact
        ppm = t.num_escapes * 1_000_000 // (n * k)
        assert weight_bytes("lossless12", n, k, ppm) == packed_nbytes(t)


def test_fp32_and_uneven_heads(make_stock):
    # hidden 10, 4 heads / 2 kv heads of dim 3 (q = 12 wide, kv = 6), mlp 7, vocab 16, fp32:
    # q 12x10, k 6x10, v 6x10, o 10x12 -> 360 weights; mlp 3 * 7x10 = 210; lm_head 160.
    p = make_stock(dtype="float32", hidden_size=10, num_heads=4, num_kv_heads=2, head_dim=3,
                   intermediate_size=7)
    g = dataflow_graph(p)
    assert g.nodes["target.layers.0.attention"]["weight_bytes"] == 360 * 4
    assert g.nodes["target.layers.0.mlp"]["weight_bytes_by_format"] == {"fp32": 210 * 4}
    assert g.nodes["target.lm_head"]["weight_bytes"] == 160 * 4
    assert g.nodes["draft.forward[1]"]["weight_bytes"] == (360 + 210 + 160) * 4
    assert g.nodes["target.embed"]["weight_bytes"] == 5 * 10 * 4
