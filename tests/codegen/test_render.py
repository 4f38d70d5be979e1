"""render_kernel: strict, deterministic, template logic limited to what the spec says."""
import ast
import os
import subprocess
import sys

import pytest

from specpilot.codegen.errors import BuildError
from specpilot.codegen.kernel_spec import get_family, kernel_spec, known_families
from specpilot.codegen.render import render_kernel, template_context


@pytest.mark.parametrize("family", [f for f in known_families() if get_family(f).backend == "triton"
                                    and not f.startswith("test_")])
def test_every_triton_family_renders_to_valid_python_with_a_launcher(family):
    source = render_kernel(kernel_spec(family))
    tree = ast.parse(source)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "launch" in functions
    assert str(kernel_spec(family)) in source.splitlines()[0]


def test_cuda_family_renders_its_binding():
    source = render_kernel(kernel_spec("gemv_bf16", M_MAX=4))
    assert "PYBIND11_MODULE(SPECPILOT_MODULE_NAME, m)" in source
    assert "constexpr int kMaxRows = 4;" in source


def test_rendering_is_deterministic_across_processes():
    spec = kernel_spec("attention", HEAD_DIM=80, BLOCK_S=32)
    here = render_kernel(spec)
    assert render_kernel(spec) == here
    code = ("from specpilot.codegen.kernel_spec import kernel_spec; "
            "from specpilot.codegen.render import render_kernel; import sys; "
            "sys.stdout.write(render_kernel(kernel_spec('attention', HEAD_DIM=80, BLOCK_S=32)))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert other.stdout == here


def test_specialisation_flags_select_code():
    plain = render_kernel(kernel_spec("linear"))
    split = render_kernel(kernel_spec("linear", SPLIT_K=4, HAS_BIAS=True))
    fma = render_kernel(kernel_spec("linear", USE_DOT=False, BLOCK_M=1, BLOCK_N=32, BLOCK_K=128))
    assert "_linear_reduce" not in plain and "_linear_reduce" in split
    assert "bias_ptr + offs_n" not in plain and "bias_ptr + offs_n" in split
    assert "_dot(x" in plain and "_dot(x" not in fma and "tl.sum(x.to(tl.float32)" in fma


def test_derived_constants_are_computed_in_python():
    context = template_context(kernel_spec("rope", HEAD_DIM=12, DTYPE="fp16"))
    assert context["HALF_DIM"] == 6 and context["BLOCK_HALF"] == 8
    assert context["TORCH_DTYPE"] == "torch.float16"
    assert context["FAMILY"] == "rope"
    assert template_context(kernel_spec("attention", HEAD_DIM=80))["BLOCK_D"] == 128
    source = render_kernel(kernel_spec("rope", HEAD_DIM=12))
    assert "HALF_DIM=6, BLOCK_HALF=8" in source


def test_undefined_template_name_is_a_render_error(tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "linear.py.j2").write_text("BLOCK = {{ BLOCK_N }}\nOTHER = {{ NOT_GIVEN }}\n")
    with pytest.raises(BuildError, match="NOT_GIVEN") as info:
        render_kernel(kernel_spec("linear"), template_dir=tmp_path)
    assert info.value.stage == "render"


def test_missing_template_is_a_render_error(tmp_path):
    with pytest.raises(BuildError, match="triton/rmsnorm.py.j2 not found"):
        render_kernel(kernel_spec("rmsnorm"), template_dir=tmp_path)


def test_template_syntax_error_names_the_line(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "gemv_bf16.cu.j2").write_text("ok\n{% if HAS_BIAS %}\nno endif\n")
    with pytest.raises(BuildError, match="TemplateSyntaxError at cuda/gemv_bf16.cu.j2"):
        render_kernel(kernel_spec("gemv_bf16"), template_dir=tmp_path)
