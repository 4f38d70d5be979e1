"""verify(): every ill-formed Program is refused with the offending path and the reason."""
from dataclasses import replace

import pytest

from specpilot.ir import (Chain, IllFormed, IRError, SetTopology, Tree, apply, dense_weight_formats,
                          verify)


def _model(p, which, **changes):
    m = replace(getattr(p.models, which), **changes)
    return replace(p, models=replace(p.models, **{which: m}))


def _formats(p, which, **updates):
    """Replace some linears' formats; keys use '__' for '.' (keyword-friendly)."""
    m = getattr(p.models, which)
    fmts = dict(m.weight_formats)
    fmts.update({k.replace("__", "."): v for k, v in updates.items()})
    return _model(p, which, weight_formats=tuple(fmts.items()))


def _tree(p):
    return apply(p, SetTopology(Tree((2, 2))))


CASES = [
    # (name, how to break the stock Program, the exact start of the message)
    ("schema", lambda p: replace(p, schema_version=2), "schema_version: expected 1, got 2"),
    ("gpu-empty", lambda p: replace(p, gpu=""), "gpu: expected a non-empty GPU name"),
    ("models-type", lambda p: replace(p, models=(p.models.target, p.models.drafter)),
     "models: expected Models, got tuple"),
    ("model-type", lambda p: replace(p, models=replace(p.models, drafter="small")),
     "models.drafter: expected a ModelSpec, got str"),
    ("role", lambda p: _model(p, "target", role="drafter"),
     "models.target.role: expected 'target', got 'drafter'"),
    ("family", lambda p: _model(p, "drafter", family="gpt2"),
     "models.drafter.family: expected one of llama, mistral, qwen2, qwen3, got 'gpt2'"),
    ("checkpoint", lambda p: _model(p, "target", checkpoint=""),
     "models.target.checkpoint: expected a non-empty path"),
    ("dtype", lambda p: _model(p, "target", dtype="float16"),
     "models.target.dtype: expected one of bfloat16, float32, got 'float16'"),
    ("vocab-zero", lambda p: _model(_model(p, "target", vocab_size=0), "drafter", vocab_size=0),
     "models.target.vocab_size: expected a positive int, got 0"),
    ("hidden-neg", lambda p: _model(p, "target", hidden_size=-8),
     "models.target.hidden_size: expected a positive int, got -8"),
    ("mlp-bool", lambda p: _model(p, "drafter", intermediate_size=True),
     "models.drafter.intermediate_size: expected a positive int, got True"),
    ("layers-zero", lambda p: _model(p, "drafter", num_layers=0),
     "models.drafter.num_layers: expected a positive int, got 0"),
    ("heads-float", lambda p: _model(p, "target", num_heads=2.0),
     "models.target.num_heads: expected a positive int, got 2.0"),
    ("kv-heads-zero", lambda p: _model(p, "target", num_kv_heads=0),
     "models.target.num_kv_heads: expected a positive int, got 0"),
    ("head-dim", lambda p: _model(p, "target", head_dim=0),
     "models.target.head_dim: expected a positive int, got 0"),
    ("bias-type", lambda p: _model(p, "target", qkv_bias=1),
     "models.target.qkv_bias: expected bool, got 1"),
    ("qk-norm-type", lambda p: _model(p, "drafter", qk_norm="no"),
     "models.drafter.qk_norm: expected bool, got 'no'"),
    ("tie-type", lambda p: _model(p, "drafter", tie_embeddings=None),
     "models.drafter.tie_embeddings: expected bool, got None"),
    ("gqa", lambda p: _model(p, "target", num_heads=3, num_kv_heads=2),
     "models.target.num_kv_heads: num_heads (3) is not a multiple of num_kv_heads (2)"),
    ("layer-kinds-len", lambda p: _model(p, "target", layer_kinds=("attention",)),
     "models.target.layer_kinds: 1 entries for 2 layers"),
    ("layer-kind", lambda p: _model(p, "target", layer_kinds=("attention", "mamba")),
     "models.target.layer_kinds[1]: expected one of attention, got 'mamba'"),
    ("formats-pair", lambda p: _model(p, "target", weight_formats=(("lm_head",),)),
     "models.target.weight_formats: expected (name, value) pairs, got ('lm_head',)"),
    ("formats-duplicate",
     lambda p: _model(p, "target", weight_formats=p.models.target.weight_formats
                      + (("lm_head", "bf16"),)),
     "models.target.weight_formats[lm_head]: listed twice"),
    ("formats-value", lambda p: _formats(p, "target", lm_head=16),
     "models.target.weight_formats[lm_head]: expected a format name, got 16"),
    ("formats-missing",
     lambda p: _model(p, "target", weight_formats=p.models.target.weight_formats[1:]),
     "models.target.weight_formats: no format for layers.0.mlp.down_proj"),
    ("formats-missing-many",
     lambda p: _model(p, "target", weight_formats=(("lm_head", "bf16"),)),
     "models.target.weight_formats: no format for layers.0.mlp.down_proj, layers.0.mlp.gate_proj,"
     " layers.0.mlp.up_proj and 11 more"),
    ("formats-extra", lambda p: _formats(p, "drafter", layers__1__mlp__up_proj="bf16"),
     "models.drafter.weight_formats[layers.1.mlp.up_proj]: the model has no such linear"),
    ("format-unknown", lambda p: _formats(p, "target", lm_head="int4"),
     "models.target.weight_formats[lm_head]: expected one of bf16, fp32, lossless12, got 'int4'"),
    ("dense-fp32-on-bf16", lambda p: _formats(p, "target", layers__0__mlp__up_proj="fp32"),
     "models.target.weight_formats[layers.0.mlp.up_proj]: fp32 is a dense float32 format but the "
     "model computes in bfloat16 (a dense format must match the compute dtype)"),
    ("dense-bf16-on-fp32",
     lambda p: _formats(_model(p, "drafter", dtype="float32",
                               weight_formats=dense_weight_formats(1, "float32")),
                        "drafter", lm_head="bf16"),
     "models.drafter.weight_formats[lm_head]: bf16 is a dense bfloat16 format but the model "
     "computes in float32"),
    ("lossless12-on-fp32",
     lambda p: _formats(_model(p, "drafter", dtype="float32",
                               weight_formats=dense_weight_formats(1, "float32")),
                        "drafter", lm_head="lossless12"),
     "models.drafter.weight_formats[lm_head]: lossless12 packs bfloat16 weights but the model's "
     "dtype is float32"),
    ("ppm-range", lambda p: _model(p, "target", lossless12_escape_ppm=(("lm_head", 1_000_001),)),
     "models.target.lossless12_escape_ppm[lm_head]: expected an int in 0..1000000, got 1000001"),
    ("ppm-negative", lambda p: _model(p, "target", lossless12_escape_ppm=(("lm_head", -1),)),
     "models.target.lossless12_escape_ppm[lm_head]: expected an int in 0..1000000, got -1"),
    ("ppm-float", lambda p: _model(p, "target", lossless12_escape_ppm=(("lm_head", 0.5),)),
     "models.target.lossless12_escape_ppm[lm_head]: expected an int in 0..1000000, got 0.5"),
    ("ppm-unknown-linear", lambda p: _model(p, "drafter", lossless12_escape_ppm=(("embed", 5),)),
     "models.drafter.lossless12_escape_ppm[embed]: the model has no such linear"),
    ("vocab", lambda p: _model(p, "drafter", vocab_size=32),
     "models.drafter.vocab_size: drafter vocabulary (32) differs from the target's (16)"),
    ("draft-type", lambda p: replace(p, draft=Chain(4)), "draft: expected a DraftSpec"),
    ("drafter-kind", lambda p: replace(p, draft=replace(p.draft, drafter="ngram")),
     "draft.drafter: expected one of model, none, got 'ngram'"),
    ("topology-type", lambda p: replace(p, draft=replace(p.draft, topology=(4,))),
     "draft.topology: expected Chain, Tree, SparseTree or DynamicTree, got (4,)"),
    ("verify-type", lambda p: replace(p, verify="causal"), "verify: expected a VerifySpec"),
    ("mask-unknown", lambda p: replace(p, verify=replace(p.verify, mask="sliding")),
     "verify.mask: expected one of causal, tree, got 'sliding'"),
    ("acceptance", lambda p: replace(p, verify=replace(p.verify, acceptance="typical")),
     "verify.acceptance: expected one of greedy, got 'typical'"),
    ("chain-tree-mask", lambda p: replace(p, verify=replace(p.verify, mask="tree")),
     "verify.mask: chain(4) needs the causal mask, got 'tree'"),
    ("tree-causal-mask", lambda p: replace(_tree(p), verify=replace(p.verify, mask="causal")),
     "verify.mask: tree([2, 2]) needs the tree mask, got 'causal'"),
    ("commit-type", lambda p: replace(p, commit="in_place"), "commit: expected a CommitSpec"),
    ("commit-unknown", lambda p: replace(p, commit=replace(p.commit, kv="copy")),
     "commit.kv: expected one of in_place, compact, got 'copy'"),
    ("tree-in-place", lambda p: replace(_tree(p), commit=replace(p.commit, kv="in_place")),
     "commit.kv: tree([2, 2]) needs 'compact'"),
    ("batch-type", lambda p: replace(p, batch=None), "batch: expected a BatchSpec"),
    ("layout", lambda p: replace(p, batch=replace(p.batch, layout="packed")),
     "batch.layout: expected one of padded, ragged, got 'packed'"),
    ("batch-zero", lambda p: replace(p, batch=replace(p.batch, max_batch_size=0)),
     "batch.max_batch_size: expected an int >= 1, got 0"),
    ("batch-bool", lambda p: replace(p, batch=replace(p.batch, max_batch_size=True)),
     "batch.max_batch_size: expected an int >= 1, got True"),
    ("draft-policy", lambda p: replace(p, batch=replace(p.batch, draft_length_policy="ema")),
     "batch.draft_length_policy: expected one of fixed, per_request_adaptive, got 'ema'"),
    ("kernels-type", lambda p: replace(p, kernels="torch"), "kernels: expected a KernelsSpec"),
    ("backend", lambda p: replace(p, kernels=replace(p.kernels, backend="cuda")),
     "kernels.backend: expected one of torch, generated, got 'cuda'"),
    ("graphs-type", lambda p: replace(p, kernels=replace(p.kernels, capture_graphs="on")),
     "kernels.capture_graphs: expected bool, got 'on'"),
    ("override-node", lambda p: replace(p, kernels=replace(
        p.kernels, overrides={"lm head; rm": {"BLOCK_N": 64}})),
     "kernels.overrides[lm head; rm]: node names are dotted identifiers"),
    ("override-empty", lambda p: replace(p, kernels=replace(p.kernels, overrides={"lm_head": {}})),
     "kernels.overrides[lm_head]: an override needs at least one parameter"),
    ("override-param", lambda p: replace(p, kernels=replace(
        p.kernels, overrides={"lm_head": {"BLOCK-N": 64}})),
     "kernels.overrides[lm_head][BLOCK-N]: parameter names are identifiers"),
    ("override-value", lambda p: replace(p, kernels=replace(
        p.kernels, overrides={"lm_head": {"BLOCK_N": 6.4}})),
     "kernels.overrides[lm_head][BLOCK_N]: expected an int, str or bool, got 6.4"),
    ("override-string", lambda p: replace(p, kernels=replace(
        p.kernels, overrides={"lm_head": {"dtype": "tl.float32); import os"}})),
     "kernels.overrides[lm_head][dtype]: string values are identifiers"),
    ("override-shape", lambda p: replace(p, kernels=replace(p.kernels, overrides=(("lm_head", 64),))),
     "kernels.overrides[lm_head]: expected a tuple of (param, value) pairs, got 64"),
    ("history-entry", lambda p: replace(p, history=({"name": "SetBackend"},)),
     "history[0]: expected a registered Transformation"),
]


@pytest.mark.parametrize("name,breaker,message", CASES, ids=[c[0] for c in CASES])
def test_ill_formed_program_is_refused_with_path_and_reason(stock, name, breaker, message):
    bad = breaker(stock)
    with pytest.raises(IllFormed) as info:
        verify(bad)
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, IRError)


def test_not_a_program():
    with pytest.raises(IllFormed, match="program: expected a Program, got dict"):
        verify({"gpu": "cpu"})


def test_well_formed_variants_pass(stock, make_stock):
    """Legal corners: a chain may also commit by compaction; float32 models with fp32 weights;
    lossless12 on bfloat16 whatever its escape rate (profitability is not legality)."""
    assert verify(stock) is stock
    verify(replace(stock, commit=replace(stock.commit, kv="compact")))
    fp32 = make_stock(dtype="float32")
    assert set(dict(fp32.models.target.weight_formats).values()) == {"fp32"}
    verify(fp32)
    verify(_formats(_model(stock, "target", lossless12_escape_ppm=(("lm_head", 900_000),)),
                    "target", lm_head="lossless12"))
    verify(_formats(stock, "target", lm_head="lossless12"))  # unmeasured is legal too
    verify(replace(stock, kernels=replace(stock.kernels, overrides={
        "target.layers.0.mlp": {"BLOCK_N": 64, "num_warps": 4, "EVEN_K": True,
                                "dtype": "float32"}})))
    verify(make_stock(num_heads=8, num_kv_heads=8, head_dim=2, family="qwen3", qk_norm=True))
