"""Errors the runtime raises for input the user can fix."""
from specpilot.ir.errors import SpecPilotError


class CheckpointError(SpecPilotError):
    """A checkpoint folder is missing, incomplete, corrupt or of an unsupported architecture."""


class UnsupportedModel(CheckpointError):
    """The checkpoint's model_type or a config feature is not supported."""


class TokenizerMismatch(SpecPilotError):
    """Target and drafter do not share a vocabulary."""


class CapacityError(SpecPilotError):
    """A prompt plus the requested new tokens does not fit the cache or the model's context."""
