"""Record the Triton launches made in Triton's CPU interpreter, so that each can later be compiled
for a real GPU (codegen/target_compile.py) on a machine that has none.

The interpreter runs a kernel without ever compiling it, so a kernel can pass every CPU test and
still fail to compile for the GPU (a construct only the compiler rejects, a tile that needs more
shared memory than the GPU has). A `LaunchRecord` keeps what the compiler specialises on: the
kernel's source file and name, and each argument as its kind (a tensor's dtype and 16-byte
alignment, a scalar's value, a constexpr), never the data. Records are JSON lines; equal
specialisations are kept once.

    with recording_launches() as recorder:
        module.launch(...)                 # interpreted as usual
    recorder.save("launches.jsonl")
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from specpilot.ir.errors import SpecPilotError

# Arguments of these kinds are recorded by value: the compiler specialises on them.
_SCALARS = (bool, int, float, str)


class LaunchRecordError(SpecPilotError):
    """Records that cannot be written or read (a malformed file)."""


def describe(value: Any) -> Dict[str, Any]:
    """What the compiler sees of one argument; {"unsupported": type} for a kind it cannot
    rebuild (the compile then fails with that reason rather than guessing)."""
    if value is None:
        return {"none": True}
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return {"tensor": str(value.dtype).replace("torch.", ""),
                "aligned": value.data_ptr() % 16 == 0}
    if isinstance(value, _SCALARS):
        return {"value": value}
    if type(value).__name__ == "constexpr" and isinstance(getattr(value, "value", None), _SCALARS):
        return {"value": value.value}
    return {"unsupported": type(value).__qualname__}


@dataclass(frozen=True)
class LaunchRecord:
    """One specialisation of one kernel: `source` (the module file), `kernel` (the function's
    name), positional `args` and keyword `kwargs` (constexprs and launch options such as
    num_warps) as `describe` gives them."""
    source: str
    kernel: str
    args: Tuple[Tuple[Tuple[str, Any], ...], ...]
    kwargs: Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...]

    def as_dict(self) -> Dict[str, Any]:
        return {"source": self.source, "kernel": self.kernel,
                "args": [dict(a) for a in self.args],
                "kwargs": {name: dict(v) for name, v in self.kwargs}}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LaunchRecord":
        try:
            return cls(str(d["source"]), str(d["kernel"]),
                       tuple(_frozen(a) for a in d["args"]),
                       tuple(sorted((k, _frozen(v)) for k, v in d["kwargs"].items())))
        except (KeyError, TypeError, AttributeError) as exc:
            raise LaunchRecordError(f"not a launch record: {d!r} ({exc})") from None

    @property
    def label(self) -> str:
        """`<module file stem, its hash cut to 12 digits>:<kernel>`."""
        stem = Path(self.source).stem
        family, _, digest = stem.rpartition("-")
        return f"{family}-{digest[:12]}:{self.kernel}" if family else f"{stem}:{self.kernel}"


def _frozen(d: Dict[str, Any]) -> Tuple[Tuple[str, Any], ...]:
    return tuple(sorted(d.items()))


def _int_class(value: int) -> int:
    """A stand-in for a runtime int that the compiler specialises alike: the same integer type
    (i32, u32, i64, u64 by range), divisibility by 16, and the values 0 and 1 kept as they are.
    Launches that differ only in such values (a row index, a length) compile to one kernel, so
    they are recorded once."""
    if value in (0, 1):
        return value
    rest = 0 if value % 16 == 0 else 1
    if -2 ** 31 <= value < 2 ** 31:
        return (32 if value > 0 else -32) + rest
    if 2 ** 31 <= value < 2 ** 32:
        return 2 ** 31 + rest
    if -2 ** 63 <= value < 2 ** 63:
        return (2 ** 40 if value > 0 else -2 ** 40) + rest
    return 2 ** 63 + rest


def _constexpr_params(fn: Any) -> set:
    names = set()
    for p in inspect.signature(fn).parameters.values():
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(
            p.annotation, "__name__", "")
        if annotation.split(".")[-1] == "constexpr":
            names.add(p.name)
    return names


def make_record(fn: Any, args: tuple, kwargs: Dict[str, Any]) -> LaunchRecord:
    """The record of launching the Python function `fn` (a kernel's body) with these arguments.
    Constexpr parameters and keywords keep their values; other ints become their `_int_class`."""
    names = list(inspect.signature(fn).parameters)
    constexprs = _constexpr_params(fn)

    def arg(i: int, value: Any) -> Tuple[Tuple[str, Any], ...]:
        runtime_int = (isinstance(value, int) and not isinstance(value, bool)
                       and i < len(names) and names[i] not in constexprs)
        return _frozen(describe(_int_class(value) if runtime_int else value))

    return LaunchRecord(os.path.abspath(inspect.getsourcefile(fn)), fn.__name__,
                        tuple(arg(i, a) for i, a in enumerate(args)),
                        tuple(sorted((k, _frozen(describe(v))) for k, v in kwargs.items())))


class LaunchRecorder:
    """The distinct launches seen, in first-seen order."""

    def __init__(self):
        self._seen: Dict[LaunchRecord, None] = {}

    def add(self, record: LaunchRecord) -> None:
        self._seen.setdefault(record, None)

    @property
    def records(self) -> List[LaunchRecord]:
        return list(self._seen)

    def save(self, path: os.PathLike) -> None:
        """Write the records as JSON lines (written beside `path`, then renamed into place)."""
        save_records(self.records, path)


def save_records(records: List[LaunchRecord], path: os.PathLike) -> None:
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text("".join(json.dumps(r.as_dict(), sort_keys=True) + "\n" for r in records),
                       encoding="utf-8")
    os.replace(partial, path)


def load_records(path: os.PathLike) -> List[LaunchRecord]:
    records = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(LaunchRecord.from_dict(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise LaunchRecordError(f"{path}:{number}: not JSON ({exc.msg})") from None
    return records


@contextlib.contextmanager
def recording_launches(recorder: Optional[LaunchRecorder] = None) -> Iterator[LaunchRecorder]:
    """Record every interpreted kernel launch made inside the block (the launches still run).
    Needs Triton's interpreter: compiled kernels are not seen."""
    from triton.runtime.interpreter import InterpretedFunction

    recorder = recorder if recorder is not None else LaunchRecorder()
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        recorder.add(make_record(self.fn, args, kwargs))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield recorder
    finally:
        InterpretedFunction.run = original
