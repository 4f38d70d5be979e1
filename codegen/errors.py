"""Typed errors of code generation: a bad kernel specification, a kernel that fails to build."""
from __future__ import annotations

from specpilot.ir.errors import SpecPilotError


class KernelSpecError(SpecPilotError):
    """A kernel specification that names an unknown family or parameter, or a value out of range."""


class BuildError(SpecPilotError):
    """A kernel that failed to render, compile or import; nothing of it is left in the cache.

    `stage` is one of "render", "syntax", "import", "compile"; `log` holds the compiler's or
    interpreter's own message so a failed candidate can be reported with its reason.
    """

    def __init__(self, what: str, stage: str, log: str):
        tail = log.strip()
        if len(tail) > 4000:
            tail = "...\n" + tail[-4000:]
        super().__init__(f"building {what} failed at {stage}: {tail}")
        self.what = what
        self.stage = stage
        self.log = log


class KernelArgumentError(SpecPilotError, ValueError):
    """Tensors handed to a kernel launcher that do not fit its specialisation (shape, dtype, layout).

    Also a ValueError, which is what the self-contained generated Triton launchers raise.
    """
