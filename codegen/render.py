"""render_kernel: KernelSpec -> source text, through the family's Jinja template.

Templates live in the `specpilot.templates` package (templates/triton/<family>.py.j2,
templates/cuda/<family>.cu.j2) and are read with importlib.resources, which works for editable
and regular installs alike. The environment is strict: an undefined name is an error, not an
empty string. The template receives only the spec's validated parameters, the constants the
family derives from them in Python, and the spec's own description; rendering is a pure
function of the spec.
"""
from __future__ import annotations

import functools
import importlib.resources
import os
from typing import Dict, Optional

import jinja2

from .errors import BuildError
from .kernel_spec import KernelSpec
from .params import Value


def _package_loader(name: str):
    try:
        text = importlib.resources.files("specpilot.templates").joinpath(name).read_text("utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None  # jinja2 turns this into TemplateNotFound
    return text, None, lambda: True


def _make_environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                              autoescape=False)


@functools.lru_cache(maxsize=None)
def _environment(template_dir: Optional[str]) -> jinja2.Environment:
    if template_dir is None:
        return _make_environment(jinja2.FunctionLoader(_package_loader))
    return _make_environment(jinja2.FileSystemLoader(template_dir))


def template_context(spec: KernelSpec) -> Dict[str, Value]:
    """The exact set of names a template may use for `spec`."""
    schema = spec.schema
    context: Dict[str, Value] = dict(spec.params)
    if schema.derive is not None:
        derived = schema.derive(context)
        clash = set(derived) & set(context)
        if clash:
            raise BuildError(str(spec), "render", f"derived constants shadow parameters: {sorted(clash)}")
        context.update(derived)
    context["FAMILY"] = spec.family
    context["SPEC"] = str(spec)
    return context


def render_kernel(spec: KernelSpec, template_dir: Optional[os.PathLike] = None) -> str:
    """Render `spec` through its family's template; identical specs give identical text.

    `template_dir` replaces the packaged templates (a folder with triton/ and cuda/ inside);
    tests use it to render deliberately broken kernels. Raises BuildError(stage="render") if the
    template is missing or uses a name it was not given.
    """
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"render_kernel expects a KernelSpec, got {type(spec).__name__}")
    env = _environment(None if template_dir is None else os.fspath(template_dir))
    try:
        template = env.get_template(spec.schema.template_name)
        return template.render(**template_context(spec))
    except jinja2.TemplateNotFound as exc:
        raise BuildError(str(spec), "render", f"template {exc.name} not found") from None
    except jinja2.TemplateSyntaxError as exc:
        raise BuildError(str(spec), "render",
                         f"TemplateSyntaxError at {exc.name}:{exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise BuildError(str(spec), "render", f"{type(exc).__name__}: {exc}") from None
