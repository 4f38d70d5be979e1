"""KernelSpec validation: canonical values, clear errors, nothing unvalidated gets through."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.codegen.errors import KernelSpecError
from specpilot.codegen.kernel_spec import (KernelSpec, get_family, kernel_spec, known_families,
                                           register_family)
from specpilot.codegen.params import BoolParam, EnumParam, FamilySchema, IdentParam, IntParam
from specpilot.ir.errors import SpecPilotError


def test_defaults_are_filled_and_order_does_not_matter():
    a = KernelSpec("linear", (("BLOCK_K", 32), ("BLOCK_N", 128)))
    b = kernel_spec("linear", BLOCK_N=128, BLOCK_K=32)
    assert a == b and hash(a) == hash(b)
    assert [name for name, _ in a.params] == [p.name for p in get_family("linear").params]
    assert a.get("SPLIT_K") == 1 and a.get("HAS_BIAS") is False and a.get("DTYPE") == "bf16"
    assert kernel_spec("linear") == kernel_spec("linear", HAS_BIAS=False)
    assert kernel_spec("linear") != kernel_spec("linear", HAS_BIAS=True)


def test_dict_and_json_round_trip():
    spec = kernel_spec("attention", DTYPE="fp32", HEAD_DIM=96, BLOCK_S=32)
    text = json.dumps(spec.as_dict(), sort_keys=True)
    assert KernelSpec.from_dict(json.loads(text)) == spec
    with pytest.raises(KernelSpecError, match="family"):
        KernelSpec.from_dict({"params": {}})


def test_every_dense_family_is_registered():
    for name in ("linear", "gate_up_silu", "rmsnorm", "rope", "attention", "greedy_accept",
                 "kv_compact", "gemv_bf16"):
        assert name in known_families()
        assert kernel_spec(name).family == name


@pytest.mark.parametrize("family,params,message", [
    ("linear", dict(BLOCK_N=512), r"BLOCK_N: 512 is outside the allowed range 8\.\.256"),
    ("linear", dict(BLOCK_N=48), "not a power of two"),
    ("linear", dict(BLOCK_N=True), "expected an integer"),
    ("linear", dict(BLOCK_N=64.0), "expected an integer"),
    ("linear", dict(HAS_BIAS=1), "expected True or False"),
    ("linear", dict(DTYPE="float32"), "not one of bf16, fp16, fp32"),
    ("linear", dict(DTYPE="bf16\nimport os"), "not one of"),
    ("linear", dict(BLOCKN=64), "has no parameter 'BLOCKN'"),
    ("linear", dict(USE_DOT=True, BLOCK_M=8), "USE_DOT needs"),
    ("linear", dict(USE_DOT=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64), "tile"),
    ("rope", dict(HEAD_DIM=7), "HEAD_DIM must be even"),
    ("attention", dict(BLOCK_R=128, BLOCK_S=256), "BLOCK_R\\*BLOCK_S"),
    ("gemv_bf16", dict(M_MAX=9), "outside the allowed range 1..8"),
])
def test_bad_parameters_are_refused_with_the_reason(family, params, message):
    with pytest.raises(KernelSpecError, match=message):
        kernel_spec(family, **params)


def test_unknown_family_names_the_known_ones():
    with pytest.raises(KernelSpecError, match="unknown kernel family 'matmul'.*linear") as info:
        kernel_spec("matmul")
    assert isinstance(info.value, SpecPilotError)
    with pytest.raises(KernelSpecError, match="unknown kernel family"):
        KernelSpec(None)


def test_malformed_param_tuples_are_refused():
    with pytest.raises(KernelSpecError, match="given twice"):
        KernelSpec("linear", (("BLOCK_N", 32), ("BLOCK_N", 64)))
    with pytest.raises(KernelSpecError, match="pairs"):
        KernelSpec("linear", ("BLOCK_N",))


def test_identifier_params_and_registration():
    schema = FamilySchema(
        name="test_named_kernel", backend="triton", summary="test", launcher="launch()",
        params=(IdentParam("KERNEL_NAME", "kernel"), EnumParam("MODE", ("a", "b"), "a"),
                BoolParam("FLAG", False), IntParam("N", 1, 4, 2)))
    register_family(schema)
    register_family(schema)  # idempotent
    assert kernel_spec("test_named_kernel", KERNEL_NAME="_layer3_mlp").get("KERNEL_NAME") == "_layer3_mlp"
    for bad in ("3kernel", "a-b", "a b", "x;import os", "", "k" * 65):
        with pytest.raises(KernelSpecError, match="not an identifier"):
            kernel_spec("test_named_kernel", KERNEL_NAME=bad)
    clash = FamilySchema(name="test_named_kernel", backend="triton", summary="other", launcher="launch()",
                         params=())
    with pytest.raises(KernelSpecError, match="already registered"):
        register_family(clash)


def test_schema_declarations_are_checked():
    with pytest.raises(KernelSpecError, match="outside the allowed range"):
        FamilySchema(name="bad_default", backend="triton", summary="", launcher="launch()",
                     params=(IntParam("N", 1, 4, 9),))
    with pytest.raises(KernelSpecError, match="backend"):
        FamilySchema(name="bad_backend", backend="opencl", summary="", launcher="launch()", params=())
    with pytest.raises(KernelSpecError, match="not an identifier"):
        FamilySchema(name="bad-name", backend="triton", summary="", launcher="launch()", params=())


@settings(max_examples=200, deadline=None)
@given(block_n=st.integers(-4, 600), block_k=st.integers(-4, 2000), split_k=st.integers(-2, 20),
       use_dot=st.one_of(st.booleans(), st.integers(0, 1)))
def test_any_value_is_either_accepted_exactly_or_refused_clearly(block_n, block_k, split_k, use_dot):
    valid = (8 <= block_n <= 256 and block_n & (block_n - 1) == 0
             and 16 <= block_k <= 1024 and block_k & (block_k - 1) == 0
             and 1 <= split_k <= 16 and isinstance(use_dot, bool)
             and (block_n >= 16 if use_dot else 16 * block_n * block_k <= 32768))
    try:
        spec = kernel_spec("linear", BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, USE_DOT=use_dot)
    except KernelSpecError:
        assert not valid
    else:
        assert valid
        assert (spec.get("BLOCK_N"), spec.get("BLOCK_K"), spec.get("SPLIT_K")) == (block_n, block_k, split_k)


def test_with_params_changes_some_parameters_and_validates_the_result():
    spec = kernel_spec("fused_linear", DTYPE="bf16", NORM=True, BLOCK_N=32)
    argmax = spec.with_params(ARGMAX=True, num_warps=8)
    assert argmax.get("ARGMAX") is True and argmax.get("num_warps") == 8
    assert argmax.get("NORM") is True and argmax.get("BLOCK_N") == 32     # the rest kept
    assert spec.get("ARGMAX") is False                                   # the original unchanged
    assert argmax == kernel_spec("fused_linear", DTYPE="bf16", NORM=True, BLOCK_N=32,
                                 ARGMAX=True, num_warps=8)
    with pytest.raises(KernelSpecError):
        spec.with_params(BLOCK_N=3)                                      # not a power of two
    with pytest.raises(KernelSpecError):
        spec.with_params(NO_SUCH_PARAM=1)
