"""Build script: maps the top-level folders into the `specpilot` namespace and builds `specpilot._C`.

`ir/`, `codegen/`, `runtime/` and `templates/` sit at the top level so the tree shows the
architecture; `package_dir` makes them `specpilot.ir`, `specpilot.codegen`, ... when installed.
`csrc/*.cpp` (host-side hot loops, e.g. the 12-bit weight packer) become `specpilot._C` through
pybind11 as soon as the folder has sources.
"""
import glob
import os

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
MAPPED = {"specpilot": "specpilot", "specpilot.ir": "ir", "specpilot.codegen": "codegen",
          "specpilot.runtime": "runtime", "specpilot.templates": "templates"}


def _packages():
    """Every folder with an __init__.py under each mapped root, named in the specpilot namespace."""
    packages, package_dir = [], {}
    for name, root in MAPPED.items():
        for folder, _dirs, files in os.walk(os.path.join(HERE, root)):
            if "__init__.py" not in files or "__pycache__" in folder:
                continue
            rel = os.path.relpath(folder, HERE)
            sub = os.path.relpath(folder, os.path.join(HERE, root))
            pkg = name if sub == "." else name + "." + sub.replace(os.sep, ".")
            packages.append(pkg)
            package_dir[pkg] = rel
    return sorted(set(packages)), package_dir


def _extensions():
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    if not sources:
        return []
    from pybind11.setup_helpers import Pybind11Extension
    return [Pybind11Extension("specpilot._C", sources, cxx_std=17,
                              extra_compile_args=["-O3"])]


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"specpilot.templates": ["triton/*.j2", "cuda/*.j2"]},
    include_package_data=True,
    ext_modules=_extensions(),
)
