"""Suite-wide settings: deterministic seeds and a private cache folder for every test run."""
import os
import sys

import pytest

# Generated Triton kernels run in the CPU interpreter on machines without CUDA. The variable must
# be set before triton is first imported anywhere in the run, hence here, at the root.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests/runtime/hf_factory.py builds tiny HF checkpoints; every test folder may use it.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "runtime"))


def pytest_configure(config):
    """SPECPILOT_RECORD_LAUNCHES=FILE: record every interpreted kernel launch of the run, for
    `python -m specpilot.codegen.target_compile FILE*` to compile for the GPU afterwards."""
    path = os.environ.get("SPECPILOT_RECORD_LAUNCHES")
    if not path or os.environ.get("TRITON_INTERPRET") != "1":
        return
    from specpilot.codegen.launch_record import recording_launches

    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    context = recording_launches()
    config._launch_recording = (context, context.__enter__(), f"{path}.{worker}.jsonl")


def pytest_unconfigure(config):
    recording = getattr(config, "_launch_recording", None)
    if recording is not None:
        context, recorded, path = recording
        context.__exit__(None, None, None)
        if recorded.records:   # xdist's controller runs no test: it writes nothing
            recorded.save(path)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # Kernel and zoo caches go to one temp folder per test run, so tests never read or pollute
    # the user's ~/.cache/specpilot (tests that need an empty cache make their own).
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path_factory.getbasetemp() / "specpilot-cache"))


@pytest.fixture
def cpu_only(monkeypatch):
    """Runs code as off a GPU (eager, float32) even on a GPU host: for checks that count
    uncaptured rounds or use the uncaptured cost model (`pytest.mark.usefixtures("cpu_only")`)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def _seed():
    import torch
    torch.manual_seed(0)
