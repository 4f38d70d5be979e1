"""The run folder of a compile, written so that a kill at any moment leaves it consistent.

    runs/NAME/compile.json          the settings, the run id, the resolved device
    runs/NAME/acceptance.json       the drafter's measured rank profile (`specpilot cost
                                    --acceptance` reads it)
    runs/NAME/escapes.json          measured lossless12 escape rates (bfloat16 models)
    runs/NAME/kernel-cache/         built kernels of the candidates (content-addressed)
    runs/NAME/round-K/              one per completed round (round-0 is the stock Program):
        program.json diff.txt report.md report.json candidates.json kernels/
    runs/NAME/best/                 the best Program so far: program.json, report.md, kernels/
    runs/NAME/program.json          the same Program, so `ir.load_program("runs/NAME")` and
                                    `specpilot export runs/NAME` find it

A round is written into `round-K.partial/` (its `round.json` last), recorded in the memory
database in one transaction, and only then renamed to `round-K/`. On resume: a partial folder
whose round the database recorded is renamed into place (the kill fell between the two); any
other partial folder is deleted and its round run again.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional

from specpilot.ir import PROGRAM_FILE, Program, load_program, program_id, save_program
from specpilot.ir.errors import SpecPilotError

ROUND_MARKER = "round.json"
PARTIAL = ".partial"


class RunFolderError(SpecPilotError):
    """A run folder whose contents disagree with the memory database or the settings."""


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


class RunFolder:
    def __init__(self, root):
        self.root = Path(root)

    def round_dir(self, k: int) -> Path:
        return self.root / f"round-{k}"

    def partial_dir(self, k: int) -> Path:
        return self.root / f"round-{k}{PARTIAL}"

    @property
    def best_dir(self) -> Path:
        return self.root / "best"

    # ---------------------------------------------------------------- writing a round

    def begin_round(self, k: int) -> Path:
        """An empty `round-K.partial/` to write the round into."""
        folder = self.partial_dir(k)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        return folder

    @staticmethod
    def seal(folder: Path, k: int, program: Program) -> None:
        """Write the marker that says the folder holds the whole round (written last)."""
        write_json_atomic(folder / ROUND_MARKER, {"round": k, "program_id": program_id(program)})

    def finish_round(self, k: int) -> Path:
        """Rename the sealed partial folder into place."""
        final = self.round_dir(k)
        if final.exists():
            raise RunFolderError(f"{final} already exists: the run folder was changed by hand")
        os.replace(self.partial_dir(k), final)
        return final

    # ---------------------------------------------------------------- reading back

    def sealed_program_id(self, folder: Path) -> Optional[str]:
        try:
            with open(folder / ROUND_MARKER, encoding="utf-8") as f:
                return json.load(f).get("program_id")
        except (OSError, ValueError):
            return None

    def reconcile(self, recorded: Dict[int, str]) -> None:
        """Bring the folder in line with the rounds the database recorded (see the module
        docstring). Raises RunFolderError when a recorded round has no folder."""
        if not self.root.exists():
            return
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if not (name.startswith("round-") and name.endswith(PARTIAL)):
                continue
            k = int(name[len("round-"):-len(PARTIAL)])
            if k in recorded and self.sealed_program_id(entry) == recorded[k] \
                    and not self.round_dir(k).exists():
                os.replace(entry, self.round_dir(k))
            else:
                shutil.rmtree(entry)
        for k, pid in sorted(recorded.items()):
            folder = self.round_dir(k)
            if self.sealed_program_id(folder) != pid:
                raise RunFolderError(
                    f"{folder} is missing or holds another Program than the memory database "
                    f"recorded for round {k}: use a new --out, or the --memory this run used")
        for entry in self.root.iterdir():   # a round folder the database never recorded
            if entry.name.startswith("round-") and entry.is_dir():
                k = entry.name[len("round-"):]
                if k.isdigit() and int(k) not in recorded:
                    raise RunFolderError(f"{entry} was not recorded by the memory database: "
                                         "use a new --out, or the --memory this run used")

    def load_round_program(self, k: int) -> Program:
        return load_program(str(self.round_dir(k) / PROGRAM_FILE))

    def load_round_report(self, k: int) -> dict:
        with open(self.round_dir(k) / "report.json", encoding="utf-8") as f:
            return json.load(f)

    # ---------------------------------------------------------------- best

    def publish_best(self, k: int) -> None:
        """Make round K's Program the run's best: best/ and the top-level program.json."""
        source = self.round_dir(k)
        staging = self.root / f"best{PARTIAL}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        for name in (PROGRAM_FILE, "report.md", "report.json", "diff.txt"):
            if (source / name).exists():
                shutil.copy2(source / name, staging / name)
        if (source / "kernels").is_dir():
            shutil.copytree(source / "kernels", staging / "kernels")
        old = self.root / "best.old"
        if old.exists():
            shutil.rmtree(old)
        if self.best_dir.exists():
            os.replace(self.best_dir, old)
        os.replace(staging, self.best_dir)
        if old.exists():
            shutil.rmtree(old)
        save_program(load_program(str(self.best_dir / PROGRAM_FILE)),
                     str(self.root / PROGRAM_FILE))
