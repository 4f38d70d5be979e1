"""Every Triton family's built module exposes exactly the launcher its schema documents."""
import inspect

import pytest

from specpilot.codegen import families
from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec

TRITON_FAMILIES = [f.name for f in families.DENSE_FAMILIES if f.backend == "triton"]


@pytest.mark.parametrize("family", TRITON_FAMILIES)
def test_launch_signature_is_the_documented_one(family, kernel_cache):
    spec = kernel_spec(family)
    module = build_triton_module(spec, kernel_cache)
    assert "launch" + str(inspect.signature(module.launch)) == spec.schema.launcher
    assert module.launch.__doc__
    # The module docstring of codegen/families.py documents every family's contract.
    assert f"\n{family} " in families.__doc__
