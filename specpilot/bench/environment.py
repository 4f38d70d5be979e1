"""Where and how a benchmark ran: device, library versions, date and command line."""
from __future__ import annotations

import datetime
import platform
import shlex
import sys
from typing import Optional, Sequence


def _version(module: str) -> Optional[str]:
    try:
        return __import__(module).__version__
    except Exception:  # an absent or broken optional library is recorded as None
        return None


def environment(device: str, argv: Optional[Sequence[str]] = None) -> dict:
    """A JSON-ready record of the run: GPU name (or "cpu"), library versions, UTC date, command."""
    import torch

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    argv = list(sys.argv if argv is None else argv)
    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu",
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(argv),
    }
