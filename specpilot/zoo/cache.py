"""Train a zoo pair once and reuse it: a content-keyed cache of finished pairs, placed atomically.

A cache entry is one folder `<preset>-seed<N>-<hash>` holding target/, drafter/ and
train_report.json. It is trained in a temporary sibling folder and renamed into place in one
step, so an entry either exists whole or not at all; a killed run leaves only a temporary folder,
which is ignored (and removed by the run that made it when it can).
"""
import filecmp
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from specpilot.zoo.corpus import corpus_fingerprint
from specpilot.zoo.pair import REPORT_FILE, resolve_device, train_pair
from specpilot.zoo.presets import ZooError, ZooPreset, get_preset

# Bump when a change to the training code changes the weights a preset produces.
ZOO_CODE_VERSION = "1"
CACHE_ENV = "SPECPILOT_CACHE"
PAIR_ENTRIES = ("target", "drafter", REPORT_FILE)


def default_cache_dir() -> Path:
    """$SPECPILOT_CACHE/zoo if set, else ~/.cache/specpilot/zoo."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root) if root else Path.home() / ".cache" / "specpilot"
    return base / "zoo"


def pair_key(preset: ZooPreset, seed: int) -> str:
    """`<preset>-seed<N>-<hash>`; the hash covers the preset definition, the code version, the
    Python minor version (the "stdlib" corpus is that version's standard library) and, for the
    "python-env" corpus, the installed distributions."""
    parts = [preset.to_json(), ZOO_CODE_VERSION, "%d.%d" % sys.version_info[:2]]
    fingerprint = corpus_fingerprint(preset.corpus)
    if fingerprint:  # absent for "stdlib", so those keys are what they always were
        parts.append(fingerprint)
    material = "\n".join(parts)
    digest = hashlib.sha256(material.encode()).hexdigest()[:12]
    return f"{preset.name}-seed{seed}-{digest}"


def is_complete_pair(folder: Path) -> bool:
    folder = Path(folder)
    return all((folder / name).exists() for name in PAIR_ENTRIES) and all(
        (folder / role / f).is_file() for role in ("target", "drafter")
        for f in ("config.json", "model.safetensors", "tokenizer.json"))


def _place(tmp: Path, dest: Path) -> bool:
    """Rename the finished `tmp` onto `dest` (absent or an empty folder); False if `dest` is taken."""
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the placed pair is an ordinary folder
    try:
        os.replace(tmp, dest)
        return True
    except OSError:
        if dest.exists() and any(dest.iterdir()):
            return False
        raise


def _train_into(dest: Path, preset: ZooPreset, seed: int, progress, replace: bool) -> None:
    """Train into a temporary sibling of `dest`, then rename it into place; an existing `dest` is
    swapped out only after training succeeded when `replace`, else kept."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        train_pair(preset, seed, tmp, progress)
        if replace and dest.exists():
            _discard(dest)
        if not _place(tmp, dest):
            progress(f"[zoo] {dest} was completed by another run meanwhile; keeping that one")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_pair(preset="tiny", seed: int = 0, cache_dir=None, progress=print, force: bool = False):
    """(target_dir, drafter_dir) of a trained pair for (preset, seed), training it only if absent.

    `preset` is a name or a ZooPreset; `cache_dir` defaults to `default_cache_dir()`. With
    `force`, an existing entry is retrained and replaced. Progress lines go to `progress`.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = root / pair_key(preset, seed)
    if is_complete_pair(entry) and not force:
        progress(f"[zoo] reusing cached pair {entry}")
    else:
        if entry.exists() and not force:  # not ours to judge what is inside: refuse, not overwrite
            raise ZooError(f"cache entry {entry} exists but is incomplete; delete it or pass force")
        resolve_device(preset)  # no GPU for a GPU preset: say so before creating anything
        progress(f"[zoo] training preset {preset.name!r} seed {seed} into {entry}")
        _train_into(entry, preset, seed, progress, replace=force)
    return entry / "target", entry / "drafter"


def _discard(folder: Path) -> None:
    """Remove a pair folder: renamed aside first, so it vanishes from its place in one step."""
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
    os.replace(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _same_files(a: Path, b: Path) -> bool:
    """True when folders `a` and `b` hold the same relative file names with the same bytes."""
    def listing(root):
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    names = listing(a)
    return names == listing(b) and all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def place_pair(source: Path, out: Path, force: bool = False) -> Path:
    """Copy the pair folder `source` to `out` (absent or empty; with `force`, a previous pair).

    The copy is made in a temporary sibling and renamed into place, so `out` never holds half a
    pair. A non-empty `out` is replaced only with `force` and only if it holds nothing but a pair;
    if it already holds exactly this pair, nothing is done.
    """
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise ZooError(f"output folder {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        extra = sorted(p.name for p in out.iterdir() if p.name not in PAIR_ENTRIES)
        if extra:
            raise ZooError(f"output folder {out} holds other files ({', '.join(extra[:5])}); "
                           "choose a new or empty folder")
        if not force:
            if _same_files(Path(source), out):
                return out
            raise ZooError(f"output folder {out} already holds a different pair; pass --force "
                           "to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for name in PAIR_ENTRIES:
            src = Path(source) / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp / name)
        if out.is_dir() and any(out.iterdir()):
            _discard(out)
        if not _place(tmp, out):
            raise ZooError(f"output folder {out} was filled by another process while copying")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
