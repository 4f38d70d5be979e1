"""`export_program`: a Program's generated kernels as a self-contained folder.

    program.json         the Program (canonical JSON)
    plan.json            its KernelPlan: every compute node and the kernel that runs it
    kernels/<key>.py     each Triton kernel module (exposes `launch(...)`)
    kernels/<key>.cu     each CUDA kernel source (built by the loader with nvcc on first use)
    __init__.py, loader.py   `load(node_name)` returns the module running that node
    _cuda_launchers.py, _support.py   host launchers of the CUDA kernels (only when there are any)
    README.md            every kernel: what it computes, its launch contract, the nodes using it

The folder needs torch and triton (nvcc and pybind11 for CUDA kernels), not SpecPilot: every
shipped Python module has its imports rewritten with libcst so that a `specpilot` support import
becomes a relative import of a module shipped alongside, and an import the export cannot satisfy
is an ExportError. The same Program always gives the same bytes (nothing depends on the time or
the destination), and the folder appears atomically: it is written beside `out` and renamed.
"""
from __future__ import annotations

import importlib.resources
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

import libcst as cst
import libcst.helpers

from specpilot.ir import Program, program_id, program_to_json
from specpilot.ir.errors import SpecPilotError

from .errors import BuildError
from .lower import lower_program
from .plan import PLAN_FILE, KernelPlan, PlanBuildError, PlanNode, plan_to_json
from .render import render_kernel

CUDA_LAUNCHERS_MODULE = "specpilot.codegen.cuda_launchers"
# specpilot modules that shipped code may import, and the module of the export replacing each.
SUPPORT_MODULES = {"specpilot.codegen.errors": "_support",
                   CUDA_LAUNCHERS_MODULE: "_cuda_launchers"}

SUPPORT_SOURCE = '''"""Support definitions shared by the exported host launchers."""


class KernelArgumentError(ValueError):
    """Tensors handed to a kernel launcher that do not fit its specialisation."""
'''

INIT_SOURCE = '''"""Generated kernels of one SpecPilot Program (README.md); `load(node)` gives a node's kernel."""
from .loader import PLAN, kernel_of, load, nodes, spec

__all__ = ["PLAN", "kernel_of", "load", "nodes", "spec"]
'''

KERNELS_INIT_SOURCE = '"""The generated kernel modules, one per distinct kernel of plan.json."""\n'

LOADER_SOURCE = '''"""Load this folder's kernels by plan node name (see README.md); needs torch and triton only.

    kernel = load("target.layers.0.self_attn.attention")   # or a kernel key from plan.json
    kernel.launch(q, k_cache, v_cache, mask, out)

Triton kernels are the modules in kernels/. A CUDA kernel (kernels/*.cu) is compiled with nvcc
on first load into $SPECPILOT_EXPORT_BUILD (default: a folder in the system temp dir) for
$SPECPILOT_CUDA_ARCH (default sm_90); compiling needs nvcc and pybind11, launching a GPU.
"""
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sysconfig
import tempfile
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "plan.json"), encoding="utf-8") as _file:
    PLAN = json.load(_file)
_NODES = {node["name"]: node for node in PLAN["nodes"]}
_LOADED = {}


def nodes():
    """Every plan node name, in execution order."""
    return [node["name"] for node in PLAN["nodes"]]


def kernel_of(name):
    """The kernel key running plan node `name` (a kernel key is returned as it is)."""
    if name in PLAN["kernels"]:
        return name
    if name not in _NODES:
        raise KeyError(f"no plan node or kernel named {name!r}; see nodes() or README.md")
    return _NODES[name]["kernel"]


def spec(name):
    """{"family": ..., "params": {...}} of the kernel running node (or kernel key) `name`."""
    return PLAN["kernels"][kernel_of(name)]


def load(name):
    """The module running plan node (or kernel key) `name`; it exposes `launch(...)`."""
    key = kernel_of(name)
    if key not in _LOADED:
        triton_file = os.path.join(_HERE, "kernels", key + ".py")
        _LOADED[key] = _load_triton(key, triton_file) if os.path.exists(triton_file) else _load_cuda(key)
    return _LOADED[key]


def _load_triton(key, path):
    if __package__:
        return importlib.import_module(f"{__package__}.kernels.{key}")
    module_spec = importlib.util.spec_from_file_location(f"exported_kernel_{key}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


class _Spec:
    def __init__(self, kernel):
        self.family, self.params = kernel["family"], kernel["params"]

    def get(self, name):
        return self.params[name]


def _load_cuda(key):
    from . import _cuda_launchers

    import pybind11

    source = os.path.join(_HERE, "kernels", key + ".cu")
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    arch = os.environ.get("SPECPILOT_CUDA_ARCH", "sm_90")
    name = f"{key}_{digest}_{arch}"
    build = (os.environ.get("SPECPILOT_EXPORT_BUILD")
             or os.path.join(tempfile.gettempdir(), "specpilot-export-build"))
    os.makedirs(build, exist_ok=True)
    binary = os.path.join(build, name + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(binary):
        partial = f"{binary}.{os.getpid()}.tmp"
        subprocess.run([os.environ.get("NVCC", "nvcc"), "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                        "-gencode", f"arch=compute_{arch[3:]},code={arch}",
                        f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
                        f"-DSPECPILOT_MODULE_NAME={name}", "-shared", source, "-o", partial], check=True)
        os.replace(partial, binary)
    loader = importlib.machinery.ExtensionFileLoader(name, binary)
    module_spec = importlib.util.spec_from_file_location(name, binary, loader=loader)
    extension = importlib.util.module_from_spec(module_spec)
    loader.exec_module(extension)
    kernel = PLAN["kernels"][key]
    launcher = getattr(_cuda_launchers, "launch_" + kernel["family"])
    return types.SimpleNamespace(launch=functools.partial(launcher, extension, _Spec(kernel)),
                                 extension=extension)
'''


class ExportError(SpecPilotError):
    """An export that cannot be written (a non-empty --out, code that cannot ship)."""


# ---------------------------------------------------------------------------- imports

class _ImportRewriter(cst.CSTTransformer):
    """Rewrites `specpilot` imports of one module (named `module`) to the export's own modules."""

    def __init__(self, module: str, mapping: Mapping[str, str]):
        self.module, self.mapping = module, mapping

    def _absolute(self, node: cst.ImportFrom) -> str:
        name = cst.helpers.get_full_name_for_node(node.module) if node.module is not None else ""
        if not node.relative:
            return name
        base = self.module.rsplit(".", len(node.relative))[0]
        return f"{base}.{name}" if name else base

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        if original.relative and not self.module.startswith("specpilot."):
            return updated  # a module of the export importing another one shipped beside it
        target = self._absolute(original)
        if not (target == "specpilot" or target.startswith("specpilot.")):
            return updated
        if target not in self.mapping:
            raise ExportError(f"{self.module} imports {target}, which an export does not ship")
        return updated.with_changes(relative=[cst.Dot()], module=cst.Name(self.mapping[target]))

    def leave_Import(self, original: cst.Import, updated: cst.Import) -> cst.Import:
        for alias in original.names:
            name = cst.helpers.get_full_name_for_node(alias.name)
            if name == "specpilot" or name.startswith("specpilot."):
                raise ExportError(f"{self.module}: `import {name}` cannot be made local; "
                                  "import the names it needs with `from ... import`")
        return updated


def rewrite_imports(source: str, module: str, mapping: Mapping[str, str] = SUPPORT_MODULES) -> str:
    """`source` (of module `module`) with each `specpilot` import replaced by a relative import
    of the export module `mapping` names for it; ExportError for one it cannot replace."""
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise ExportError(f"{module}: not valid Python: {exc}") from None
    return tree.visit(_ImportRewriter(module, mapping)).code


# ---------------------------------------------------------------------------- README

_NORM_PLACES = {"input_norm": "before attention", "post_attention_norm": "before the MLP",
                "q_norm": "of each query head", "k_norm": "of each key head",
                "final_norm": "before the LM head"}


def describe_node(node: PlanNode) -> str:
    """One line saying what a plan node computes."""
    a = dict(node.attrs)
    if node.op == "rmsnorm":
        place = _NORM_PLACES.get(node.name.rsplit(".", 1)[-1], "")
        return f"RMSNorm {place} over rows of {a['width']}".replace("  ", " ")
    if node.op == "linear":
        bias = " + b" if a["bias"] else ""
        return (f"y = x @ W.T{bias}, W [{a['out_features']}, {a['in_features']}] stored "
                f"{a['format']} (checkpoint `{node.linears[0]}`)")
    if node.op == "gate_up_silu":
        return (f"silu(x @ Wg.T) * (x @ Wu.T), Wg and Wu [{a['out_features']}, {a['in_features']}] "
                f"stored {a['format']} (`{node.linears[0]}`, `{node.linears[1]}`)")
    if node.op == "rope":
        return (f"rotary embedding of {a['num_heads']} query / {a['num_kv_heads']} key heads "
                f"of {a['head_dim']}")
    if node.op == "attention":
        return (f"attention of {a['num_heads']} query heads over {a['num_kv_heads']} cached KV "
                f"heads of {a['head_dim']}: prefill, and {a['queries']} new tokens per step "
                f"with the {a['mask']} mask")
    if node.op == "varlen_attention":
        return (f"attention of {a['num_heads']} query heads over {a['num_kv_heads']} cached KV "
                f"heads of {a['head_dim']} for every request's tokens packed without padding "
                f"(ragged layout; the tree given as per-token limits and ancestor bits)")
    if node.op == "greedy_accept":
        return (f"argmax over {a['vocab_size']} logits at the root and {a['draft_nodes']} draft "
                "nodes, and the longest accepted path")
    if node.op == "kv_compact":
        return (f"copy the accepted draft nodes' K/V ({a['row']} values per slot, {a['layers']} "
                "layers) into place")
    if node.op == "chain_commit":
        return {"round": "a graphed chain round's end: acceptance, commit, who stops, the log",
                "row": "a refilled chain round's end, each row logged by its own round counter",
                "row_plain": "a refilled batch's plain step's end (row counters only)"}[a["log"]]
    if node.op == "length_policy":
        objective = ("the batch's makespan" if a["objective"] == "makespan"
                     else "the time per token")
        return (f"the adaptive chain length's update after a round ({a['estimator']} estimate, "
                f"by {objective}{', turning speculation off' if a['turn_off'] else ''})")
    if node.op == "length_admit":
        return f"a refilled newcomer's adaptive-length estimates ({a['estimator']} estimate)"
    if node.op == "row_start":
        return "a refilled newcomer's row started: its first token, output, log and counters"
    return node.op


def _model_line(program: Program, role: str) -> str:
    m = getattr(program.models, role)
    formats = sorted(set(dict(m.weight_formats).values()))
    return (f"- {role}: {m.family}, {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} "
            f"heads / {m.num_kv_heads} KV heads of {m.head_dim}, vocabulary {m.vocab_size}, "
            f"{m.dtype}, weights {', '.join(formats)}")


def render_readme(program: Program, plan: KernelPlan, files: Mapping[str, bytes]) -> str:
    """README.md of an export: the Program, how to load, every kernel and node."""
    lines = ["# Generated decoder kernels", "",
             f"Program `{program_id(program)}` (`program.json`), draft {program.draft.describe()}, "
             f"{program.verify.mask} verification mask, {program.commit.kv} KV commit:", "",
             _model_line(program, "target"), _model_line(program, "drafter"), "",
             "This folder is self-contained: it needs torch and triton (nvcc and pybind11 for "
             "CUDA kernels), not SpecPilot. `plan.json` lists every compute node of the decoder "
             "and the kernel that runs it.", "", "## Loading", "",
             "With this folder's parent on `PYTHONPATH`, import the folder by its name:", "",
             "```python", "import exported_kernels as kernels  # the folder's own name",
             'attention = kernels.load("target.layers.0.self_attn.attention")',
             "attention.launch(q, k_cache, v_cache, mask, out)", "```", "",
             "A folder whose name is not a Python identifier loads the same way through importlib:",
             "", "```python", "import importlib.util, os",
             'spec = importlib.util.spec_from_file_location("kernels", os.path.join(folder, '
             '"__init__.py"), submodule_search_locations=[folder])',
             "kernels = importlib.util.module_from_spec(spec); spec.loader.exec_module(kernels)",
             "```", "", "## Kernels", ""]
    for key, spec in plan.kernels:
        schema = spec.schema
        path = f"kernels/{key}.py" if f"kernels/{key}.py" in files else f"kernels/{key}.cu"
        users = [plan.node(n) for n in plan.nodes_using(key)]
        lines += [f"### `{key}` ({path})", "",
                  f"{schema.name} ({schema.backend}): {schema.summary}.", "",
                  f"`{schema.launcher}`", "",
                  "Parameters: " + ", ".join(f"{k}={v}" for k, v in spec.params) + ".", "",
                  f"Runs {len(users)} node{'s' if len(users) != 1 else ''}:"]
        lines += [f"- `{n.name}`: {describe_node(n)}" for n in users]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- files

def _render(plan: KernelPlan, key: str, template_dir) -> str:
    try:
        return render_kernel(plan.spec(key), template_dir)
    except BuildError as exc:
        raise PlanBuildError(key, plan.nodes_using(key), exc) from None


def export_files(program: Program, template_dir: Optional[os.PathLike] = None) -> Dict[str, bytes]:
    """Every file of the export of `program`, by relative path (a pure function of the Program).

    Raises LoweringError for a Program that cannot be lowered (an unknown override family or
    parameter included) and PlanBuildError, naming the nodes, for a kernel that fails to render.
    """
    return _plan_files(program, lower_program(program), template_dir)


def _plan_files(program: Program, plan: KernelPlan, template_dir) -> Dict[str, bytes]:
    text: Dict[str, str] = {"program.json": program_to_json(program), PLAN_FILE: plan_to_json(plan),
                            "kernels/__init__.py": KERNELS_INIT_SOURCE}
    cuda = False
    for key, spec in plan.kernels:
        source = _render(plan, key, template_dir)
        if spec.backend == "triton":
            text[f"kernels/{key}.py"] = rewrite_imports(source, f"kernels.{key}")
            continue
        cuda = True
        launcher = spec.schema.host_launcher
        if launcher.__module__ != CUDA_LAUNCHERS_MODULE or launcher.__name__ != f"launch_{spec.family}":
            raise ExportError(f"kernel {key}: its host launcher {launcher.__module__}."
                              f"{launcher.__name__} cannot be shipped")
        text[f"kernels/{key}.cu"] = source
    if cuda:
        launchers = importlib.resources.files("specpilot.codegen").joinpath("cuda_launchers.py")
        text["_cuda_launchers.py"] = rewrite_imports(launchers.read_text("utf-8"), CUDA_LAUNCHERS_MODULE)
        text["_support.py"] = SUPPORT_SOURCE
    text["loader.py"] = rewrite_imports(LOADER_SOURCE, "loader")
    text["__init__.py"] = rewrite_imports(INIT_SOURCE, "__init__")
    files = {path: body.encode("utf-8") for path, body in text.items()}
    files["README.md"] = render_readme(program, plan, files).encode("utf-8")
    return dict(sorted(files.items()))


@dataclass(frozen=True)
class ExportResult:
    path: Path
    plan: KernelPlan
    files: Tuple[str, ...]


def _check_destination(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder: choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} is not empty: choose another --out, or pass --force to replace it")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_folder(files: Mapping[str, bytes], out: os.PathLike, force: bool = False) -> Path:
    """Write `files` as folder `out`, atomically: into a temporary sibling, then renamed. An
    existing non-empty `out` is refused unless `force`, which replaces it whole."""
    out = Path(out).absolute()
    _check_destination(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    old: Optional[Path] = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the export is a normal folder
        for rel, data in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if out.exists():
            old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
            os.rename(out, old)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def export_program(program: Program, out: os.PathLike, force: bool = False,
                   template_dir: Optional[os.PathLike] = None) -> ExportResult:
    """Export `program` to folder `out` (see the module docstring); errors leave `out` as it was."""
    _check_destination(Path(out).absolute(), force)
    plan = lower_program(program)
    files = _plan_files(program, plan, template_dir)
    return ExportResult(path=write_folder(files, out, force), plan=plan, files=tuple(files))
