"""`specpilot export`: a self-contained folder of a Program's kernels, byte-identical for the same
Program, written atomically, runnable without SpecPilot installed."""
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specpilot.cli import main
from specpilot.codegen.export import ExportError, export_program, rewrite_imports
from specpilot.codegen.lower import LoweringError, lower_program
from specpilot.codegen.plan import PlanBuildError, plan_to_json
from specpilot.codegen.render import render_kernel
from specpilot.ir import program_to_json, save_program

from test_lower import tiny_program


def files_of(folder: Path):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def with_overrides(program, overrides):
    return replace(program, kernels=replace(program.kernels, overrides=overrides))


# Run in a fresh interpreter with only the export's parent on PYTHONPATH and SpecPilot made
# unimportable (it is installed here), so any import of it the export still had would fail.
BLOCK_SPECPILOT = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "specpilot" or name.startswith("specpilot."):
            raise ImportError("specpilot is not available to an export")
sys.meta_path.insert(0, _Block())
"""


def run_isolated(parent: Path, code: str):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(parent)
    env.setdefault("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "0"))
    proc = subprocess.run([sys.executable, "-c", BLOCK_SPECPILOT + code], cwd=parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_same_program_exports_the_same_bytes_anywhere(tmp_path):
    program = tiny_program(qk_norm=True)
    first = export_program(program, tmp_path / "a" / "exported").path
    files = files_of(first)
    export_program(program, first, force=True)
    assert files_of(first) == files
    assert files_of(export_program(program, tmp_path / "b" / "other_name").path) == files
    # Nothing but the export is left beside it (no temporary or replaced folders).
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["exported"]


def test_export_holds_the_program_the_plan_and_every_rendered_kernel(tmp_path):
    program = tiny_program()
    result = export_program(program, tmp_path / "out")
    files, plan = files_of(result.path), lower_program(program)
    assert files["program.json"].decode() == program_to_json(program)
    assert files["plan.json"].decode() == plan_to_json(plan)
    kernels = {name for name in files if name.startswith("kernels/") and name != "kernels/__init__.py"}
    assert kernels == {f"kernels/{key}.py" for key, _ in plan.kernels}
    for key, spec in plan.kernels:
        assert files[f"kernels/{key}.py"].decode() == render_kernel(spec)
    readme = files["README.md"].decode()
    for key, spec in plan.kernels:
        assert f"### `{key}`" in readme and spec.schema.launcher in readme
    for node in plan.nodes:
        assert f"- `{node.name}`: " in readme
    assert "- `target.layers.1.mlp.gate_up`: silu(x @ Wg.T) * (x @ Wu.T), Wg and Wu [128, 64]" in readme


def test_exported_loader_runs_kernels_without_specpilot(tmp_path):
    program = tiny_program(dtype="float32")
    export_program(program, tmp_path / "exported_kernels")
    out = run_isolated(tmp_path, """
import torch
import exported_kernels as kernels
assert not [m for m in sys.modules if m == "specpilot" or m.startswith("specpilot.")]
torch.manual_seed(1)
# A linear node against a float64 matmul.
x, w = torch.randn(3, 64), torch.randn(128, 64)
out = torch.full((3, 128), float("nan"))
kernels.load("target.layers.0.mlp.down_proj").launch(x, w, out)
err = (out.double() - x.double() @ w.double().T).abs().max().item()
# An RMSNorm node against float64.
h, g = torch.randn(5, 64), torch.rand(64) + 0.5
y = torch.full((5, 64), float("nan"))
kernels.load("target.final_norm").launch(h, g, y, 1e-6)
ref = h.double() * torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + 1e-6) * g.double()
print(json.dumps({"linear": err, "rmsnorm": (y.double() - ref).abs().max().item(),
                  "nodes": kernels.nodes(), "kernel": kernels.kernel_of("target.lm_head")}))
""".replace("print(json", "import json; print(json"))
    report = json.loads(out.strip().splitlines()[-1])
    assert report["linear"] < 1e-3 and report["rmsnorm"] < 1e-4
    plan = lower_program(program)
    assert report["nodes"] == [n.name for n in plan.nodes]
    assert report["kernel"] == plan.node("target.lm_head").kernel


def test_cuda_kernels_ship_with_their_host_launcher(tmp_path):
    program = with_overrides(tiny_program(), {"target.lm_head": {"family": "gemv_bf16"}})
    folder = export_program(program, tmp_path / "with_cuda").path
    plan = lower_program(program)
    spec = plan.spec_of("target.lm_head")
    key = plan.node("target.lm_head").kernel
    assert (folder / "kernels" / f"{key}.cu").read_text() == render_kernel(spec)
    launchers = (folder / "_cuda_launchers.py").read_text()
    original = importlib.resources.files("specpilot.codegen").joinpath("cuda_launchers.py").read_text()
    assert "from ._support import KernelArgumentError" in launchers
    assert "specpilot" not in launchers.replace("specpilot.codegen.cuda_launchers", "")
    # Only the import changed; the launchers are the ones SpecPilot uses.
    assert launchers.replace("from ._support import", "from .errors import") == original
    # The rewritten launchers import and check their arguments without SpecPilot (no GPU needed).
    run_isolated(tmp_path, """
import torch
from with_cuda import _cuda_launchers, _support, load, spec
assert spec("target.lm_head")["family"] == "gemv_bf16"
try:
    params = {"M_MAX": 1, "HAS_BIAS": False}
    _cuda_launchers.launch_gemv_bf16(None, type("Spec", (), {"get": staticmethod(params.get)}),
                                     torch.zeros(4), torch.zeros(2, 4), torch.zeros(1, 2))
except _support.KernelArgumentError as exc:
    assert "2-D" in str(exc)
else:
    raise AssertionError("no KernelArgumentError")
""")


@pytest.mark.parametrize("source,expected", [
    ("from specpilot.codegen.errors import KernelArgumentError\n",
     "from ._support import KernelArgumentError\n"),
    ("from .errors import KernelArgumentError as E  # why\n",
     "from ._support import KernelArgumentError as E  # why\n"),
    ("import torch\nfrom math import sqrt\nfrom . import sibling\n",
     "import torch\nfrom math import sqrt\nfrom . import sibling\n"),
])
def test_rewrite_imports_makes_support_imports_local(source, expected):
    module = "specpilot.codegen.cuda_launchers" if source.startswith("from .errors") else "kernels.k"
    if "sibling" in source:
        module = "loader"  # a module of the export importing one shipped beside it
    assert rewrite_imports(source, module) == expected


@pytest.mark.parametrize("source,message", [
    ("from specpilot.runtime.model import Transformer\n", "imports specpilot.runtime.model"),
    ("import specpilot.codegen.errors\n", "cannot be made local"),
    ("from ..ir import errors\n", "imports specpilot.ir"),
])
def test_imports_an_export_cannot_satisfy_are_refused(source, message):
    with pytest.raises(ExportError, match=message):
        rewrite_imports(source, "specpilot.codegen.cuda_launchers")


def test_a_non_empty_destination_is_refused_unless_forced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not empty.*--force"):
        export_program(tiny_program(), out)
    assert files_of(out) == {"notes.txt": b"keep me"}
    export_program(tiny_program(), out, force=True)
    assert "notes.txt" not in files_of(out) and "plan.json" in files_of(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "program.json" in files_of(export_program(tiny_program(), empty).path)


def test_a_failed_export_leaves_everything_as_it_was(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(Path(str(importlib.resources.files("specpilot.templates"))), templates)
    (templates / "triton" / "attention.py.j2").write_text("{{ NOT_A_PARAMETER }}\n")
    parent = tmp_path / "exports"
    with pytest.raises(PlanBuildError, match=r"for node target.layers.0.self_attn.attention.*render"):
        export_program(tiny_program(), parent / "new", template_dir=templates)
    assert not parent.exists() or list(parent.iterdir()) == []
    old = export_program(tiny_program(qk_norm=True), parent / "old").path
    before = files_of(old)
    with pytest.raises(PlanBuildError):
        export_program(tiny_program(), old, force=True, template_dir=templates)
    assert files_of(old) == before and sorted(p.name for p in parent.iterdir()) == ["old"]


def test_cli_exports_a_runs_folder(tmp_path, capsys):
    runs = tmp_path / "round-1"
    runs.mkdir()
    program = tiny_program()
    save_program(program, str(runs / "program.json"))
    assert main(["export", str(runs), "--out", str(tmp_path / "exported")]) == 0
    plan = lower_program(program)
    assert (f"exported {len(plan.kernels)} kernels for {len(plan.nodes)} nodes"
            in capsys.readouterr().out)
    assert (tmp_path / "exported" / "program.json").read_text() == program_to_json(program)
    assert main(["export", str(runs / "program.json"), "--out", str(tmp_path / "exported")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_cli_reports_a_bad_override_without_writing(tmp_path, capsys):
    program = with_overrides(tiny_program(), {"drafter.mlp.down_proj": {"family": "fancy_gemm"}})
    save_program(program, str(tmp_path / "p.json"))
    assert main(["export", str(tmp_path / "p.json"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "kernels.overrides[drafter.mlp.down_proj][family]" in err
    assert "unknown kernel family 'fancy_gemm'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(LoweringError):
        lower_program(program)


@pytest.mark.slow
@pytest.mark.usefixtures("require_nvcc")
def test_exported_loader_compiles_a_cuda_kernel_without_specpilot(tmp_path):
    program = with_overrides(tiny_program(), {"target.lm_head": {"family": "gemv_bf16"}})
    export_program(program, tmp_path / "with_cuda")
    out = run_isolated(tmp_path, f"""
import os, torch
os.environ["SPECPILOT_EXPORT_BUILD"] = {str(tmp_path / "build")!r}
from with_cuda import _support, load
kernel = load("target.lm_head")
assert hasattr(kernel.extension, "gemv_bf16")
x, w = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(97, 64, dtype=torch.bfloat16)
try:
    kernel.launch(x, w, torch.zeros(1, 97, dtype=torch.bfloat16))
except _support.KernelArgumentError as exc:
    print(exc)
""")
    assert "must be a CUDA tensor" in out
    assert len(list((tmp_path / "build").iterdir())) == 1
