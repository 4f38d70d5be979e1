"""Malformed Program JSON: every case is an IRError whose message names the field by path."""
import json

import pytest

from specpilot.ir import IRError, SetTopology, Tree, apply, program_from_json, program_to_json
from specpilot.ir.errors import SpecPilotError


def _set(path, value):
    def edit(obj):
        node = obj
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _delete(path):
    def edit(obj):
        node = obj
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


CASES = [
    # (edit of the decoded stock+tree Program, the exact start of the error message)
    (_set(("draft", "topology"), {"kind": "chain", "k": "4"}),
     "draft.topology.k: expected int, got str '4'"),
    (_set(("draft", "topology"), {"kind": "chain", "k": 4.5}),
     "draft.topology.k: expected int, got float 4.5"),
    (_set(("draft", "topology"), {"kind": "chain", "k": 0}),
     "draft.topology: chain length must be an integer in 1..64"),
    (_set(("draft", "topology"), {"kind": "chain"}), "draft.topology.k: missing field"),
    (_set(("draft", "topology"), {"kind": "chain", "k": 4, "width": 2}),
     "draft.topology.width: unknown field"),
    (_set(("draft", "topology"), {"kind": "ring", "k": 4}),
     "draft.topology.kind: expected one of chain, tree, sparse_tree, dynamic_tree, got 'ring'"),
    (_set(("draft", "topology"), {"k": 4}), "draft.topology.kind: missing field"),
    (_set(("draft", "topology"), {"kind": "tree", "branching": [2, True]}),
     "draft.topology.branching[1]: expected int, got bool True"),
    (_set(("draft", "topology"), {"kind": "tree", "branching": 2}),
     "draft.topology.branching: expected list, got int"),
    (_set(("draft", "topology"), {"kind": "tree", "branching": []}),
     "draft.topology: tree branching must be a non-empty tuple"),
    (_set(("draft", "topology"), [4]), "draft.topology: expected object, got list"),
    (_delete(("gpu",)), "gpu: missing field"),
    (_set(("gpu",), 7), "gpu: expected str, got int 7"),
    (_set(("colour",), "blue"), "colour: unknown field"),
    (_set(("schema_version",), 2), "schema_version: unsupported version 2 (this build reads 1)"),
    (_set(("schema_version",), "1"), "schema_version: expected int, got str '1'"),
    (_delete(("models", "drafter")), "models.drafter: missing field"),
    (_set(("models", "target", "num_layers"), None),
     "models.target.num_layers: expected int, got null None"),
    (_set(("models", "target", "num_heads"), float("nan")),
     "models.target.num_heads: expected int, got float nan"),
    (_set(("models", "target", "qk_norm"), 0), "models.target.qk_norm: expected bool, got int 0"),
    (_set(("models", "drafter", "layer_kinds"), "attention"),
     "models.drafter.layer_kinds: expected list, got str"),
    (_set(("models", "drafter", "layer_kinds"), [3]),
     "models.drafter.layer_kinds[0]: expected str, got int 3"),
    (_set(("models", "target", "weight_formats"), ["bf16"]),
     "models.target.weight_formats: expected object, got list"),
    (_set(("models", "target", "weight_formats", "lm_head"), 16),
     "models.target.weight_formats[lm_head]: expected str, got int 16"),
    (_set(("models", "target", "lossless12_escape_ppm"), {"lm_head": "low"}),
     "models.target.lossless12_escape_ppm[lm_head]: expected int, got str 'low'"),
    (_delete(("models", "target", "tie_embeddings")),
     "models.target.tie_embeddings: missing field"),
    (_set(("verify", "mask"), None), "verify.mask: expected str, got null"),
    (_set(("commit",), "compact"), "commit: expected object, got str"),
    (_set(("batch", "max_batch_size"), "8"), "batch.max_batch_size: expected int, got str '8'"),
    (_set(("kernels", "capture_graphs"), "yes"),
     "kernels.capture_graphs: expected bool, got str 'yes'"),
    (_set(("kernels", "overrides"), {"target.lm_head": {"BLOCK_N": 1.5}}),
     "kernels.overrides[target.lm_head][BLOCK_N]: expected int, str or bool, got float 1.5"),
    (_set(("kernels", "overrides"), {"target.lm_head": 64}),
     "kernels.overrides[target.lm_head]: expected object, got int"),
    (_set(("history",), {}), "history: expected list, got object"),
    (_set(("history", 0), {"name": "Teleport", "params": {}}),
     "history[0].name: unknown transformation 'Teleport' (known: CaptureGraphs, "
     "SetAcceptKernels, SetAttentionKernels, SetBackend"),
    (_set(("history", 0), {"name": "SetTopology"}), "history[0].params: missing field"),
    (_set(("history", 0), {"name": "SetDraftLength", "params": {"k": "4"}}),
     "history[0].params.k: expected int, got str '4'"),
    (_set(("history", 0), {"name": "SetDraftLength", "params": {"k": 4, "why": "speed"}}),
     "history[0].params.why: unknown field"),
    (_set(("history", 0), {"name": "SetTopology", "params": {"topology": {"kind": "tree"}}}),
     "history[0].params.topology.branching: missing field"),
    # Well-typed but inconsistent: decoding runs verify, which names the attribute too.
    (_set(("verify", "mask"), "causal"), "verify.mask: tree([2, 2]) needs the tree mask"),
    (_set(("models", "drafter", "vocab_size"), 17),
     "models.drafter.vocab_size: drafter vocabulary (17) differs from the target's (16)"),
]


@pytest.fixture
def tree_obj(stock):
    return json.loads(program_to_json(apply(stock, SetTopology(Tree((2, 2))))))


@pytest.mark.parametrize("edit,message", CASES, ids=[m.split(":")[0] + "|" + str(i)
                                                     for i, (_, m) in enumerate(CASES)])
def test_malformed_field_names_its_path(tree_obj, edit, message):
    edit(tree_obj)
    with pytest.raises(IRError) as info:
        program_from_json(json.dumps(tree_obj))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("text,message", [
    ("", "program: not valid JSON"),
    ("{\"gpu\": ", "program: not valid JSON"),
    ("[1, 2]", "program: expected object, got list"),
    ("null", "program: expected object, got null"),
    (b"\xff\xfe{", "program: not valid JSON"),
])
def test_not_a_program_at_all(text, message):
    with pytest.raises(IRError) as info:
        program_from_json(text)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, SpecPilotError)
