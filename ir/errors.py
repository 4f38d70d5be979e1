"""Typed errors shared by every layer. `ir` imports nothing of ours, so the base lives here.

A `SpecPilotError` is a user-facing problem with a message naming what to fix; the CLI prints it
without a traceback and exits non-zero.
"""


class SpecPilotError(Exception):
    """Base of every error the user can cause and fix (bad input, illegal request)."""


class IRError(SpecPilotError):
    """Malformed or ill-formed IR (bad JSON, a field out of range, inconsistent attributes)."""


class TransformRefused(SpecPilotError):
    """A transformation that cannot apply to a Program; `reason` says why."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"transformation {name} refused: {reason}")
        self.name = name
        self.reason = reason


class IllFormed(IRError):
    """A Program whose attributes are individually typed but inconsistent or out of range
    (raised by `verify`); the message starts with the path of the offending attribute."""
