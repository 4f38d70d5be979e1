"""The zoo's training corpus: the Python standard library's own source files (the "stdlib" source;
the larger "python-env" source, which adds site-packages, is in env_corpus.py).

The standard library is on every machine that runs us, is real Python written by many hands,
and needs no download. Selection is deterministic: files are ordered by a hash of their relative
path (a spread over all packages rather than the alphabetically first few), held-out files are
taken first, then training files until the byte cap.
"""
import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.zoo.presets import ZooError

# Test suites and the IDE are excluded: test files are huge, repetitive fixtures, and the
# site-packages of whichever environment runs us are not part of the standard library.
# `encodings/` is mostly generated codec tables (a hundred near-identical files of hex literals).
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "encodings", "site-packages",
                           "dist-packages", "__pycache__"})
# Generated data tables (pydoc_data/topics.py is 750 kB of one string) teach nothing about code.
MAX_FILE_BYTES = 200_000


@dataclass(frozen=True)
class SourceFile:
    relpath: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Training and held-out source files, in the order they are used."""

    train: tuple
    heldout: tuple
    skipped: dict = field(default_factory=dict)  # files left out, by reason (python-env only)

    @property
    def train_bytes(self) -> int:
        return sum(len(f.text.encode("utf-8")) for f in self.train)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_python_files(root: Path = None) -> list:
    """Relative paths of the standard library's .py files (no tests, IDE or site-packages), sorted."""
    root = Path(root) if root is not None else stdlib_root()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS)
        for name in files:
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found)


def spread_key(relpath: str) -> str:
    """Order of files: a hash of the relative path spreads picks over all packages."""
    return hashlib.sha256(relpath.encode("utf-8")).hexdigest()


def _read_source(path: Path):
    """The file's text, or None when it is too large or not UTF-8 (skipped, deterministically)."""
    if path.stat().st_size > MAX_FILE_BYTES:
        return None
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.strip() else None


def load_corpus(max_bytes: int, holdout_files: int, root: Path = None) -> Corpus:
    """Held-out files first, then training files up to `max_bytes`, in a fixed hash order."""
    root = Path(root) if root is not None else stdlib_root()
    relpaths = sorted(stdlib_python_files(root), key=spread_key)
    heldout, train, used = [], [], 0
    for rel in relpaths:
        if len(heldout) < holdout_files:
            text = _read_source(root / rel)
            if text is not None:
                heldout.append(SourceFile(rel, text))
            continue
        if used >= max_bytes:
            break
        text = _read_source(root / rel)
        if text is None:
            continue
        train.append(SourceFile(rel, text))
        used += len(text.encode("utf-8"))
    if not train or len(heldout) < holdout_files:
        raise ZooError(f"too few Python source files under {root} to build the zoo corpus "
                       f"({len(train)} training, {len(heldout)} held out)")
    return Corpus(train=tuple(train), heldout=tuple(heldout))


def load_source_corpus(source: str, max_bytes: int, holdout_files: int) -> Corpus:
    """The corpus of a preset's `corpus` source: "stdlib" or "python-env"."""
    if source == "stdlib":
        return load_corpus(max_bytes, holdout_files)
    if source == "python-env":
        from specpilot.zoo.env_corpus import load_python_env_corpus

        return load_python_env_corpus(max_bytes, holdout_files)
    raise ZooError(f"unknown zoo corpus source {source!r}; use 'stdlib' or 'python-env'")


def corpus_fingerprint(source: str) -> str:
    """What besides the preset decides the corpus, for the cache key ("" for "stdlib", whose
    content the Python minor version already pins)."""
    if source == "python-env":
        from specpilot.zoo.env_corpus import environment_fingerprint

        return environment_fingerprint()
    return ""
