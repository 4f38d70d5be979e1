"""`verify(program)`: the well-formedness check of a Program, raising `IllFormed` with the path of
the offending attribute and the reason.

Only legality lives here (what the runtime and codegen can execute and still be lossless), never
preference: for example lossless12 is legal on any bfloat16 linear whatever its escape rate; that
a high escape rate makes it unprofitable is SetWeightFormat's precondition, not a rule of the IR.
"""
from __future__ import annotations

import re

from .errors import IllFormed
from .formats import DTYPE_BYTES, DTYPES, PPM, WEIGHT_FORMATS
from .model_spec import FAMILIES, LAYER_KINDS, ModelSpec
from .program import (ACCEPT_KERNELS, ACCEPTANCE_RULES, ATTENTION_KERNELS, BACKENDS, BATCH_LAYOUTS,
                      DRAFT_LENGTH_POLICIES, DRAFTER_KERNELS, DRAFTERS, FAST_PATHS, KV_COMMITS,
                      LENGTH_DRAINS, LENGTH_ESTIMATORS, MASKS, REFILL_POLICIES, SCHEMA_VERSION,
                      BatchSpec, CommitSpec, DraftSpec, KernelsSpec, Models, Program, VerifySpec)
from .prune import PRUNES, LayerSkipPrune
from .topology import TOPOLOGIES, TOPOLOGY_NAMES, Chain
from .transforms import TRANSFORMATIONS, Transformation

# Kernel override keys and string values reach generated source, so they are restricted to
# identifiers (node names may be dotted paths such as `target.layers.3.mlp`).
_NODE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*(\[[0-9]+\])?\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _require(cond: bool, path: str, reason: str) -> None:
    if not cond:
        raise IllFormed(f"{path}: {reason}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_choice(value, path: str, choices) -> None:
    _require(isinstance(value, str) and value in choices, path,
             f"expected one of {', '.join(choices)}, got {value!r}")


def _require_pairs(pairs, path: str, value_ok, value_desc: str) -> dict:
    _require(isinstance(pairs, tuple), path, f"expected a tuple of (name, value) pairs, got {pairs!r}")
    out = {}
    for pair in pairs:
        _require(isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str), path,
                 f"expected (name, value) pairs, got {pair!r}")
        name, value = pair
        _require(name not in out, f"{path}[{name}]", "listed twice")
        _require(value_ok(value), f"{path}[{name}]", f"expected {value_desc}, got {value!r}")
        out[name] = value
    return out


def _verify_model(m, path: str, role: str) -> None:
    _require(isinstance(m, ModelSpec), path, f"expected a ModelSpec, got {type(m).__name__}")
    _require(m.role == role, f"{path}.role", f"expected {role!r}, got {m.role!r}")
    _require_choice(m.family, f"{path}.family", FAMILIES)
    _require(isinstance(m.checkpoint, str) and m.checkpoint != "", f"{path}.checkpoint",
             "expected a non-empty path")
    _require_choice(m.dtype, f"{path}.dtype", DTYPES)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
        value = getattr(m, name)
        _require(_is_int(value) and value > 0, f"{path}.{name}",
                 f"expected a positive int, got {value!r}")
    for name in ("qkv_bias", "qk_norm", "tie_embeddings"):
        _require(isinstance(getattr(m, name), bool), f"{path}.{name}",
                 f"expected bool, got {getattr(m, name)!r}")
    _require(m.num_heads % m.num_kv_heads == 0, f"{path}.num_kv_heads",
             f"num_heads ({m.num_heads}) is not a multiple of num_kv_heads ({m.num_kv_heads})")
    _require(len(m.layer_kinds) == m.num_layers, f"{path}.layer_kinds",
             f"{len(m.layer_kinds)} entries for {m.num_layers} layers")
    for i, kind in enumerate(m.layer_kinds):
        _require_choice(kind, f"{path}.layer_kinds[{i}]", LAYER_KINDS)

    fpath = f"{path}.weight_formats"
    formats = _require_pairs(m.weight_formats, fpath, lambda f: isinstance(f, str), "a format name")
    linears = set(m.linears)
    missing = sorted(linears - set(formats))
    extra = sorted(set(formats) - linears)
    _require(not missing, fpath, f"no format for {', '.join(missing[:3])}"
             + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    _require(not extra, f"{fpath}[{extra[0] if extra else ''}]",
             f"the model has no such linear ({m.num_layers} layers)")
    for name, fmt in formats.items():
        where = f"{fpath}[{name}]"
        _require_choice(fmt, where, tuple(WEIGHT_FORMATS))
        spec = WEIGHT_FORMATS[fmt]
        if spec.dense:
            _require(spec.dtype == m.dtype, where,
                     f"{fmt} is a dense {spec.dtype} format but the model computes in {m.dtype} "
                     "(a dense format must match the compute dtype)")
        else:
            _require(spec.dtype == m.dtype, where,
                     f"{fmt} packs {spec.dtype} weights but the model's dtype is {m.dtype}")

    rpath = f"{path}.lossless12_escape_ppm"
    rates = _require_pairs(m.lossless12_escape_ppm, rpath,
                           lambda v: _is_int(v) and 0 <= v <= PPM, f"an int in 0..{PPM}")
    for name in rates:
        _require(name in linears, f"{rpath}[{name}]", "the model has no such linear")


def _verify_models(models) -> None:
    _require(isinstance(models, Models), "models", f"expected Models, got {type(models).__name__}")
    _verify_model(models.target, "models.target", "target")
    _verify_model(models.drafter, "models.drafter", "drafter")
    t, d = models.target.vocab_size, models.drafter.vocab_size
    _require(t == d, "models.drafter.vocab_size",
             f"drafter vocabulary ({d}) differs from the target's ({t}); they must share a tokenizer")


def _verify_speculation(p: Program) -> None:
    _require(isinstance(p.draft, DraftSpec), "draft", "expected a DraftSpec")
    _require_choice(p.draft.drafter, "draft.drafter", DRAFTERS)
    topo = p.draft.topology
    _require(isinstance(topo, TOPOLOGIES), "draft.topology",
             f"expected {TOPOLOGY_NAMES}, got {topo!r}")

    _require(isinstance(p.verify, VerifySpec), "verify", "expected a VerifySpec")
    _require_choice(p.verify.mask, "verify.mask", MASKS)
    _require_choice(p.verify.acceptance, "verify.acceptance", ACCEPTANCE_RULES)
    needed = "causal" if isinstance(topo, Chain) else "tree"
    _require(p.verify.mask == needed, "verify.mask",
             f"{topo} needs the {needed} mask, got {p.verify.mask!r}")
    _verify_prune(p)

    _require(isinstance(p.commit, CommitSpec), "commit", "expected a CommitSpec")
    _require_choice(p.commit.kv, "commit.kv", KV_COMMITS)
    if not isinstance(topo, Chain):
        _require(p.commit.kv == "compact", "commit.kv",
                 f"{topo} needs 'compact' (the accepted path is scattered over the tree's slots), "
                 f"got {p.commit.kv!r}")


def _verify_no_speculation(p: Program) -> None:
    """Rules of a Program that does not speculate (greedy AR of the target).

    Its topology (with the mask and commit the topology implies) is kept, checked like any
    other, and unused, so that SetDrafter("model") restores the speculative decoder. Every
    attribute that only shapes drafts or a speculative batch must be at its default: the decoder
    is plain greedy AR in padded batches, so a pruned verifier, an adaptive draft length (with
    its token budget) or a ragged layout would describe a mechanism that does not run. Refusing
    them (rather than ignoring them) keeps one spelling, and one id, per AR decoder up to its
    topology, and says what a Program runs by reading it. Refill is the batch's own: greedy AR
    drains its batches or refills their slots (runtime/graphed_refill.py with chains of 0),
    two decoders, two spellings.
    """
    b = p.batch
    _require(p.verify.prune is None, "verify.prune",
             f"a Program without a drafter verifies no draft: expected None, got {p.verify.prune}")
    _require(p.kernels.drafter_kernels == KernelsSpec.drafter_kernels, "kernels.drafter_kernels",
             f"a Program without a drafter runs no drafter kernels: expected "
             f"{KernelsSpec.drafter_kernels!r}, got {p.kernels.drafter_kernels!r}")
    _require(p.kernels.accept_kernels == KernelsSpec.accept_kernels, "kernels.accept_kernels",
             f"a Program without a drafter accepts no drafts: expected "
             f"{KernelsSpec.accept_kernels!r}, got {p.kernels.accept_kernels!r}")
    for path, value, wanted in (("batch.draft_length_policy", b.draft_length_policy, "fixed"),
                                ("batch.layout", b.layout, "padded")):
        _require(value == wanted, path, f"a Program without a drafter decodes with greedy AR in "
                                        f"padded batches: expected {wanted!r}, got {value!r}")


def _verify_prune(p: Program) -> None:
    prune = p.verify.prune
    if prune is None:
        return
    _require(isinstance(prune, PRUNES), "verify.prune",
             f"expected None, LayerSkipPrune or LowPrecisionPrune, got {prune!r}")
    target = p.models.target
    if isinstance(prune, LayerSkipPrune):
        last = prune.keep_layers[-1]
        _require(last < target.num_layers, "verify.prune.keep_layers",
                 f"layer {last} does not exist (the target has {target.num_layers} layers)")
        _require(len(prune.keep_layers) < target.num_layers, "verify.prune.keep_layers",
                 "keeps every layer of the target: the pruning pass would cost a full "
                 "verification; skip at least one layer")
    else:
        _require_choice(prune.dtype, "verify.prune.dtype", DTYPES)
        _require(DTYPE_BYTES[prune.dtype] < DTYPE_BYTES[target.dtype], "verify.prune.dtype",
                 f"{prune.dtype} is not a lower precision than the target's {target.dtype}")


def _verify_batch_and_kernels(p: Program) -> None:
    b = p.batch
    _require(isinstance(b, BatchSpec), "batch", "expected a BatchSpec")
    _require_choice(b.layout, "batch.layout", BATCH_LAYOUTS)
    _require(_is_int(b.max_batch_size) and b.max_batch_size >= 1, "batch.max_batch_size",
             f"expected an int >= 1, got {b.max_batch_size!r}")
    _require_choice(b.draft_length_policy, "batch.draft_length_policy", DRAFT_LENGTH_POLICIES)
    if b.draft_length_policy == "per_request_adaptive":
        _require(isinstance(p.draft.topology, Chain), "batch.draft_length_policy",
                 f"per_request_adaptive adapts a chain's length; the draft is {p.draft.topology}")
        _require(_is_int(b.token_budget) and b.token_budget >= b.max_batch_size,
                 "batch.token_budget", f"expected an int >= max_batch_size ({b.max_batch_size}: "
                 f"every request verifies at least its last token), got {b.token_budget!r}")
    else:
        _require(b.token_budget is None, "batch.token_budget",
                 f"only per_request_adaptive takes a token budget, got {b.token_budget!r}")
    _require_choice(b.refill, "batch.refill", REFILL_POLICIES)
    _require_choice(b.length_estimator, "batch.length_estimator", LENGTH_ESTIMATORS)
    _require(b.length_estimator == BatchSpec.length_estimator
             or b.draft_length_policy == "per_request_adaptive", "batch.length_estimator",
             f"{b.length_estimator} estimates per_request_adaptive lengths; the policy is "
             f"{b.draft_length_policy}")
    _require_choice(b.length_drain, "batch.length_drain", LENGTH_DRAINS)
    _require(b.length_drain == BatchSpec.length_drain
             or (b.draft_length_policy == "per_request_adaptive" and b.refill == "continuous"),
             "batch.length_drain",
             f"the {b.length_drain} drain follows a continuous refill's queue with "
             f"per_request_adaptive lengths; the policy is {b.draft_length_policy}, the refill "
             f"{b.refill}")

    k = p.kernels
    _require(isinstance(k, KernelsSpec), "kernels", "expected a KernelsSpec")
    _require_choice(k.backend, "kernels.backend", BACKENDS)
    _require(isinstance(k.capture_graphs, bool), "kernels.capture_graphs",
             f"expected bool, got {k.capture_graphs!r}")
    _require_choice(k.fast_path, "kernels.fast_path", FAST_PATHS)
    _require(k.fast_path == KernelsSpec.fast_path or k.backend == "torch", "kernels.fast_path",
             f"the fast path is the torch backend's; the {k.backend} backend runs its own "
             f"kernels (expected {KernelsSpec.fast_path!r}, got {k.fast_path!r})")
    _require_choice(k.drafter_kernels, "kernels.drafter_kernels", DRAFTER_KERNELS)
    # The fused kernels read the drafter's dense torch weights (runtime/fused_forward.py).
    _require(k.drafter_kernels == KernelsSpec.drafter_kernels or k.backend == "torch",
             "kernels.drafter_kernels",
             f"the fused drafter kernels read the torch backend's dense weights; the {k.backend} "
             f"backend runs its own kernels (expected {KernelsSpec.drafter_kernels!r}, got "
             f"{k.drafter_kernels!r})")
    _require_choice(k.attention_kernels, "kernels.attention_kernels", ATTENTION_KERNELS)
    # The generated attention replaces the torch backend's op, per op or inside the compiled
    # blocks of the "layers" fast path (runtime/compiled_attention.py).
    _require(k.attention_kernels == KernelsSpec.attention_kernels or k.backend == "torch",
             "kernels.attention_kernels",
             f"the generated attention replaces the torch backend's; this Program runs backend "
             f"{k.backend!r} (expected {KernelsSpec.attention_kernels!r}, got "
             f"{k.attention_kernels!r})")
    _require_choice(k.accept_kernels, "kernels.accept_kernels", ACCEPT_KERNELS)
    # The fused round end is the graphed chain decoders' (runtime/graphed_chain.py); a tree's
    # round walks its nodes.
    _require(k.accept_kernels == KernelsSpec.accept_kernels
             or isinstance(p.draft.topology, Chain), "kernels.accept_kernels",
             f"the fused round end accepts chains; {p.draft.topology} is not one (expected "
             f"{KernelsSpec.accept_kernels!r}, got {k.accept_kernels!r})")
    nodes = _require_pairs(k.overrides, "kernels.overrides", lambda v: isinstance(v, tuple),
                           "a tuple of (param, value) pairs")
    for node, params in nodes.items():
        npath = f"kernels.overrides[{node}]"
        _require(bool(_NODE_NAME.match(node)), npath, "node names are dotted identifiers")
        _require(bool(params), npath, "an override needs at least one parameter")
        values = _require_pairs(params, npath,
                                lambda v: isinstance(v, (bool, str)) or _is_int(v),
                                "an int, str or bool")
        for param, value in values.items():
            _require(bool(_IDENTIFIER.match(param)), f"{npath}[{param}]",
                     "parameter names are identifiers")
            if isinstance(value, str):
                _require(bool(_IDENTIFIER.match(value)), f"{npath}[{param}]",
                         f"string values are identifiers, got {value!r}")


def _verify_history(p: Program) -> None:
    _require(isinstance(p.history, tuple), "history", "expected a tuple")
    for i, t in enumerate(p.history):
        _require(isinstance(t, Transformation) and TRANSFORMATIONS.get(t.name) is type(t),
                 f"history[{i}]", f"expected a registered Transformation, got {t!r}")


def verify(program: Program) -> Program:
    """Check that `program` is well formed; return it unchanged, or raise IllFormed naming the
    first offending attribute by path and saying why."""
    _require(isinstance(program, Program), "program",
             f"expected a Program, got {type(program).__name__}")
    _require(program.schema_version == SCHEMA_VERSION, "schema_version",
             f"expected {SCHEMA_VERSION}, got {program.schema_version!r}")
    _require(isinstance(program.gpu, str) and program.gpu != "", "gpu",
             "expected a non-empty GPU name (or 'cpu')")
    _verify_models(program.models)
    _verify_speculation(program)
    _verify_batch_and_kernels(program)
    if not program.draft.speculates:
        _verify_no_speculation(program)
    _verify_history(program)
    return program
