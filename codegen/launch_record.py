"""Record the Triton launches made in Triton's CPU interpreter, so that each can later be compiled
for a real GPU (codegen/target_compile.py) on a machine that has none.

The interpreter runs a kernel without ever compiling it, so a kernel can pass every CPU test and
still fail to compile for the GPU (a construct only the compiler rejects, a tile that needs more
shared memory than the GPU has). A `LaunchRecord` keeps what the compiler specialises on: the
kernel's module (by the digest of its source) and name, and each argument as its kind (a
tensor's dtype and 16-byte alignment, a scalar's value, a constexpr), never the data. Equal
specialisations are kept once. The records travel with the sources they name (`Launches`), so a
kernel written to a temporary folder that is gone by the time it is compiled still compiles.

    with recording_launches() as recorded:
        module.launch(...)                 # interpreted as usual
    recorded.save("launches.jsonl")
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from specpilot.ir.errors import SpecPilotError

# Arguments of these kinds are recorded by value: the compiler specialises on them.
_SCALARS = (bool, int, float, str)

# Constexpr keywords that are True exactly when the kernel runs in the interpreter: the
# templates pass `_interpreted(kernel)` (templates/triton/_support.py.j2: DOT_IN_FP32 widens a
# dot's operands, which only numpy needs). They are recorded as such and compiled False, as
# the GPU runs them; a test keeps this list and the templates in step.
INTERPRETER_FLAGS = ("DOT_IN_FP32",)


class LaunchRecordError(SpecPilotError):
    """Records that cannot be written or read (a malformed file)."""


def describe(value: Any) -> Dict[str, Any]:
    """What the compiler sees of one argument; {"unsupported": type} for a kind it cannot
    rebuild (the compile then fails with that reason rather than guessing). An
    INTERPRETER_FLAGS keyword is {"interpreter_flag": True} instead (make_record)."""
    if value is None:
        return {"none": True}
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return {"tensor": str(value.dtype).replace("torch.", ""),
                "aligned": value.data_ptr() % 16 == 0}
    if isinstance(value, _SCALARS):
        return {"value": value}
    return {"unsupported": type(value).__qualname__}


@dataclass(frozen=True)
class LaunchRecord:
    """One specialisation of one kernel: `source` (the module file where it was recorded) and
    `digest` (of that file's text), `kernel` (the function's name), positional `args` and keyword
    `kwargs` (constexprs and launch options such as num_warps) as `describe` gives them."""
    source: str
    digest: str
    kernel: str
    args: Tuple[Tuple[Tuple[str, Any], ...], ...]
    kwargs: Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...]

    def as_dict(self) -> Dict[str, Any]:
        return {"source": self.source, "digest": self.digest, "kernel": self.kernel,
                "args": [dict(a) for a in self.args],
                "kwargs": {name: dict(v) for name, v in self.kwargs}}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LaunchRecord":
        try:
            return cls(str(d["source"]), str(d["digest"]), str(d["kernel"]),
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


def module_name(label: str) -> str:
    """The module a `LaunchRecord.label` names, without its hash: the generated kernels'
    family (`norm_qkv_rope`), or a hand-written module's file stem."""
    stem = label.rpartition(":")[0]
    family, _, _ = stem.rpartition("-")
    return family or stem


@dataclass(eq=False)
class Launches:
    """Distinct records in first-seen order, and the sources they name (digest -> text)."""
    records: List[LaunchRecord] = field(default_factory=list)
    sources: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self._seen = set(self.records)

    def _keep(self, record: LaunchRecord) -> None:
        if record not in self._seen:
            self._seen.add(record)
            self.records.append(record)

    def add(self, record: LaunchRecord, text: str) -> None:
        self._keep(record)
        self.sources.setdefault(record.digest, text)

    def merge(self, other: "Launches") -> "Launches":
        """Adds `other`'s launches (each distinct one once) to these; returns self."""
        for record in other.records:
            self.add(record, other.sources[record.digest])
        return self

    def save(self, path: os.PathLike) -> None:
        """JSON lines: one {"digest", "text"} per source, then one line per record; written
        beside `path`, then renamed into place."""
        path = Path(path)
        lines = [json.dumps({"digest": d, "text": t}) for d, t in sorted(self.sources.items())]
        lines += [json.dumps(r.as_dict(), sort_keys=True) for r in self.records]
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(partial, path)

    @classmethod
    def load(cls, path: os.PathLike) -> "Launches":
        launches = cls()
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LaunchRecordError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if isinstance(item, dict) and set(item) == {"digest", "text"}:
                launches.sources[str(item["digest"])] = str(item["text"])
            else:
                launches._keep(LaunchRecord.from_dict(item))
        missing = {r.digest for r in launches.records} - set(launches.sources)
        if missing:
            raise LaunchRecordError(f"{path}: records name sources it does not hold: "
                                    f"{sorted(missing)}")
        return launches


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


@functools.lru_cache(maxsize=None)
def _kernel_facts(fn: Any) -> Tuple[str, str, str, Tuple[str, ...], frozenset]:
    """(source file, its text, the text's digest, parameter names, constexpr parameter names)
    of a kernel's function: read once per kernel, as a decode launches the same few kernels
    thousands of times."""
    source = os.path.abspath(inspect.getsourcefile(fn))
    text = Path(source).read_text(encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
    return (source, text, digest, tuple(inspect.signature(fn).parameters),
            frozenset(_constexpr_params(fn)))


def make_record(fn: Any, args: tuple, kwargs: Dict[str, Any]) -> Tuple[LaunchRecord, str]:
    """The record of launching the Python function `fn` (a kernel's body) with these arguments,
    and its module's text. Constexpr parameters and keywords keep their values; other ints
    become their `_int_class`."""
    source, text, digest, names, constexprs = _kernel_facts(fn)

    def arg(i: int, value: Any) -> Tuple[Tuple[str, Any], ...]:
        runtime_int = (isinstance(value, int) and not isinstance(value, bool)
                       and i < len(names) and names[i] not in constexprs)
        return _frozen(describe(_int_class(value) if runtime_int else value))

    def keyword(name: str, value: Any) -> Tuple[Tuple[str, Any], ...]:
        return (("interpreter_flag", True),) if name in INTERPRETER_FLAGS else _frozen(
            describe(value))

    record = LaunchRecord(source, digest, fn.__name__,
                          tuple(arg(i, a) for i, a in enumerate(args)),
                          tuple(sorted((k, keyword(k, v)) for k, v in kwargs.items())))
    return record, text


# What the blocks now open record into, innermost last: a launch goes to the innermost alone,
# so a test that records its own (deliberately broken) kernels keeps them out of a whole
# suite's recording (tests/conftest.py).
_recorders: List[Launches] = []
_unrecorded_run: Any = None       # InterpretedFunction.run as it was before the outermost block


def _recorded_run(self, *args, grid, warmup, **kwargs):
    _recorders[-1].add(*make_record(self.fn, args, kwargs))
    return _unrecorded_run(self, *args, grid=grid, warmup=warmup, **kwargs)


@contextlib.contextmanager
def recording_launches(into: Optional[Launches] = None) -> Iterator[Launches]:
    """Record every interpreted kernel launch made inside the block into `into` (a new
    Launches by default), which it yields; the launches still run. Needs Triton's interpreter:
    compiled kernels are not seen."""
    global _unrecorded_run
    from triton.runtime.interpreter import InterpretedFunction

    recorder = into if into is not None else Launches()
    if not _recorders:
        _unrecorded_run = InterpretedFunction.run
        InterpretedFunction.run = _recorded_run
    _recorders.append(recorder)
    try:
        yield recorder
    finally:
        _recorders.pop()          # blocks close innermost first
        if not _recorders:
            InterpretedFunction.run = _unrecorded_run
