"""Canonical JSON: byte-identical round trips, the canonical text form, atomic load/save."""
import json
import os
from dataclasses import replace

import pytest

from specpilot.ir import (CaptureGraphs, Chain, IllFormed, IRError, SetBackend, SetBatchLayout,
                          SetMaxBatchSize, SetTopology, SetWeightFormat, Tree, apply, load_program,
                          program_from_json, program_to_json, record_escape_rates, replay,
                          save_program)


def _transformed(stock):
    p = record_escape_rates(stock, "target", {"layers.0.mlp.down_proj": 1234,
                                              "layers.1.mlp.down_proj": 20000,
                                              "layers.0.self_attn.q_proj": 17})
    return replay(p, [SetTopology(Tree((3, 2, 1))), SetWeightFormat("target.mlp.down_proj",
                                                                      "lossless12"),
                      SetBatchLayout("ragged"), SetMaxBatchSize(8), SetBackend("generated"),
                      CaptureGraphs(True)])


def test_stock_round_trip_is_byte_identical(stock):
    text = program_to_json(stock)
    again = program_from_json(text)
    assert again == stock
    assert program_to_json(again) == text


@pytest.mark.parametrize("topology", [Chain(1), Chain(7), Tree((4, 2, 2, 1)), Tree((2,)),
                                      Tree((1, 3))])
def test_transformed_round_trip_is_byte_identical(stock, topology):
    p = _transformed(stock)
    if p.draft.topology != topology:
        p = apply(p, SetTopology(topology))
    text = program_to_json(p)
    again = program_from_json(text)
    assert again == p
    assert again.history == p.history and len(p.history) >= 6
    assert program_to_json(again) == text


def test_canonical_text_form(stock):
    """Sorted keys, no whitespace between tokens, one trailing newline: exactly what the
    standard library writes for these options, from the decoded object."""
    text = program_to_json(_transformed(stock))
    assert text.endswith("}\n") and not text.endswith("\n\n")
    reference = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False) + "\n"
    assert text == reference
    obj = json.loads(text)
    assert obj["draft"]["topology"] == {"kind": "tree", "branching": [3, 2, 1]}
    assert obj["models"]["target"]["weight_formats"]["layers.1.mlp.down_proj"] == "lossless12"
    assert obj["history"][0] == {"name": "SetTopology",
                                 "params": {"topology": {"kind": "tree", "branching": [3, 2, 1]}}}


def test_integral_floats_decode_as_ints_and_encode_canonically(stock):
    obj = json.loads(program_to_json(stock))
    obj["batch"]["max_batch_size"] = 1.0
    obj["models"]["target"]["hidden_size"] = 8.0
    obj["draft"]["topology"]["k"] = 4.0
    text = json.dumps(obj, indent=2)  # non-canonical spacing as well
    p = program_from_json(text)
    assert p == stock
    assert type(p.draft.topology.k) is int and type(p.batch.max_batch_size) is int
    assert program_to_json(p) == program_to_json(stock)


def test_save_then_load(tmp_path, stock):
    p = _transformed(stock)
    path = tmp_path / "p.json"
    save_program(p, path)
    assert path.read_text(encoding="utf-8") == program_to_json(p)
    assert load_program(path) == p
    assert os.listdir(tmp_path) == ["p.json"]  # no temporary file left behind


def test_load_accepts_a_folder_with_program_json(tmp_path, stock):
    save_program(stock, tmp_path / "program.json")
    assert load_program(tmp_path) == stock


def test_failed_save_leaves_the_old_file_untouched(tmp_path, stock):
    path = tmp_path / "p.json"
    save_program(stock, path)
    before = path.read_bytes()
    bad = apply(stock, SetBatchLayout("ragged"))
    object.__setattr__(bad.batch, "max_batch_size", 0)  # corrupt the frozen value on purpose
    with pytest.raises(IllFormed, match="batch.max_batch_size"):
        save_program(bad, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["p.json"]


def test_save_into_a_missing_folder_is_an_ir_error(tmp_path, stock):
    with pytest.raises(IRError, match="cannot write program file"):
        save_program(stock, tmp_path / "nowhere" / "p.json")
    assert os.listdir(tmp_path) == []


def test_load_missing_file_names_it(tmp_path):
    missing = tmp_path / "absent.json"
    with pytest.raises(IRError, match="absent.json"):
        load_program(missing)


def test_load_malformed_file_names_file_and_field(tmp_path, stock):
    obj = json.loads(program_to_json(stock))
    obj["draft"]["topology"]["k"] = "4"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(IRError) as info:
        load_program(path)
    assert "bad.json" in str(info.value) and "draft.topology.k: expected int" in str(info.value)


def test_overrides_and_model_flags_round_trip(make_stock):
    p = make_stock(family="qwen3", qk_norm=True, tie_embeddings=True, qkv_bias=True)
    p = replace(p, kernels=replace(p.kernels, overrides={
        "target.layers.1.mlp": {"num_warps": 4, "BLOCK_N": 64, "EVEN_K": False},
        "target.lm_head": {"dtype": "float32"}}))
    text = program_to_json(p)
    obj = json.loads(text)
    assert obj["kernels"]["overrides"] == {
        "target.layers.1.mlp": {"BLOCK_N": 64, "EVEN_K": False, "num_warps": 4},
        "target.lm_head": {"dtype": "float32"}}
    again = program_from_json(text)
    assert again == p and again.kernels.overrides == p.kernels.overrides
    assert again.kernels.overrides[0] == ("target.layers.1.mlp", (("BLOCK_N", 64),
                                                                   ("EVEN_K", False),
                                                                   ("num_warps", 4)))
    assert program_to_json(again) == text
    assert (again.models.target.qk_norm, again.models.target.tie_embeddings,
            again.models.target.qkv_bias) == (True, True, True)
