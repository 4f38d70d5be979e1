"""The memory: a SQLite database of mechanisms and of each compile's completed rounds.

A mechanism is one transformation as it was evaluated on a deployment: the record, the
deployment signature, the measured gain, the token-forcing result and whether it was admitted.
Next to them the database keeps, per compile run, which rounds completed and with which Program,
so that a killed compile resumes at its last completed round, and the transformations of each
round's chosen Program (`bests`): a new compile on an alike deployment starts from the most
successful of those. Mechanisms alone are a weaker seed: each one's gain was measured on its own
round's base, and on a batch-1 compile a tree admitted on the eager stock Program lost once it
was combined with CUDA graphs.

Everything a round leaves is written in one transaction (`complete_round`): after a crash
either all of a round is in the database or none of it. The database runs in WAL mode, so
readers never block the writer.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from specpilot.ir import Transformation, transformation_from_obj, transformation_to_obj
from specpilot.ir.errors import IRError, SpecPilotError

from .signature import SIMILAR, signature_key, similarity

MEMORY_FILE = "memory.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS mechanisms (
    id INTEGER PRIMARY KEY,
    transformation TEXT NOT NULL,
    signature TEXT NOT NULL,
    signature_key TEXT NOT NULL,
    gain REAL,
    forcing_passed INTEGER NOT NULL,
    forcing TEXT NOT NULL,
    admitted INTEGER NOT NULL,
    base_program TEXT NOT NULL,
    run_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS mechanisms_by_signature ON mechanisms (signature_key);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    out_dir TEXT NOT NULL,
    signature TEXT NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    program_id TEXT NOT NULL,
    tokens_per_s REAL,
    completed REAL NOT NULL,
    PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS bests (
    run_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    history TEXT NOT NULL,
    speedup REAL,
    PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    proposal TEXT NOT NULL,
    stage TEXT NOT NULL,
    reason TEXT NOT NULL);
"""


class MemoryStoreError(SpecPilotError):
    """A memory database that cannot be opened or is not one."""


def default_memory_path() -> Path:
    base = os.environ.get("SPECPILOT_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "specpilot"
    return root / MEMORY_FILE


@dataclass(frozen=True)
class Mechanism:
    transformation: Transformation
    signature: Dict
    gain: Optional[float]
    forcing_passed: bool
    forcing: Dict
    admitted: bool
    base_program: str
    run_id: str
    round: int


@dataclass(frozen=True)
class Failure:
    proposal: str
    stage: str
    reason: str


class MemoryStore:
    """One SQLite file. Open it with `MemoryStore(path)`; use from one thread at a time (the
    search writes from its main thread; agents get a read-only `MemoryView`)."""

    def __init__(self, path=None):
        self.path = Path(path) if path is not None else default_memory_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._transaction() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                               (str(SCHEMA_VERSION),))
                elif row[0] != str(SCHEMA_VERSION):
                    raise MemoryStoreError(
                        f"{self.path}: memory schema version {row[0]}, this build reads "
                        f"{SCHEMA_VERSION}; use another --memory file")
        except sqlite3.DatabaseError as exc:
            raise MemoryStoreError(f"cannot open memory database {self.path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextmanager
    def _transaction(self):
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (a kill leaves nothing)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ---------------------------------------------------------------- runs and rounds

    def start_run(self, run_id: str, out_dir: str, signature: Dict) -> None:
        """Register a compile run (again on resume: kept as it was)."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?)",
                       (run_id, str(out_dir), _dump(signature), time.time()))

    def completed_rounds(self, run_id: str) -> Dict[int, str]:
        """{round: program id} of every round of `run_id` completed so far."""
        rows = self._db.execute("SELECT round, program_id FROM rounds WHERE run_id=?",
                                (run_id,)).fetchall()
        return {int(k): pid for k, pid in rows}

    def complete_round(self, run_id: str, round_index: int, program_id: str,
                       tokens_per_s: Optional[float], mechanisms: Sequence[Mechanism] = (),
                       failures: Sequence[Failure] = (), before_commit=None,
                       history: Sequence[Transformation] = ()) -> None:
        """Record a finished round, its evaluated mechanisms, its failures and the
        transformations of its chosen Program (`history`, from the stock Program on),
        atomically. `before_commit()` runs inside the transaction (tests use it to simulate a
        kill)."""
        with self._transaction() as db:
            db.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?)",
                       (run_id, round_index, program_id, tokens_per_s, time.time()))
            stock = db.execute("SELECT tokens_per_s FROM rounds WHERE run_id=? AND round=0",
                               (run_id,)).fetchone()
            speedup = (tokens_per_s / stock[0] if stock and stock[0] and tokens_per_s
                       else None)
            db.execute("INSERT INTO bests VALUES (?, ?, ?, ?)",
                       (run_id, round_index,
                        _dump([transformation_to_obj(t) for t in history]), speedup))
            for m in mechanisms:
                db.execute(
                    "INSERT INTO mechanisms (transformation, signature, signature_key, gain, "
                    "forcing_passed, forcing, admitted, base_program, run_id, round, created) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (_dump(transformation_to_obj(m.transformation)), _dump(m.signature),
                     signature_key(m.signature), m.gain, int(m.forcing_passed),
                     _dump(m.forcing), int(m.admitted), m.base_program, run_id, round_index,
                     time.time()))
            for f in failures:
                db.execute("INSERT INTO failures (run_id, round, proposal, stage, reason) "
                           "VALUES (?, ?, ?, ?, ?)", (run_id, round_index, f.proposal, f.stage,
                                                      f.reason))
            if before_commit is not None:
                before_commit()

    def failures(self, run_id: str) -> List[Failure]:
        rows = self._db.execute("SELECT proposal, stage, reason FROM failures WHERE run_id=? "
                                "ORDER BY id", (run_id,)).fetchall()
        return [Failure(*r) for r in rows]

    # ---------------------------------------------------------------- mechanisms

    def mechanisms(self, run_id: Optional[str] = None) -> List[Mechanism]:
        query = "SELECT * FROM mechanisms" + (" WHERE run_id=?" if run_id else "") + " ORDER BY id"
        rows = self._db.execute(query, (run_id,) if run_id else ()).fetchall()
        out = []
        for row in rows:
            m = _mechanism(row)
            if m is not None:
                out.append(m)
        return out

    def similar(self, signature: Dict, threshold: float = SIMILAR) -> List[tuple]:
        """(similarity, Mechanism) of every mechanism validated on a deployment at least
        `threshold` alike, most similar and then largest gain first."""
        scored = [(similarity(signature, m.signature), m) for m in self.mechanisms()]
        scored = [(s, m) for s, m in scored if s >= threshold]
        scored.sort(key=lambda sm: (-sm[0], -(sm[1].gain or 0.0)))
        return scored

    def best_histories(self, signature: Dict, exclude_run: Optional[str] = None) -> List[tuple]:
        """(similarity, speedup over its stock Program, transformations from its stock
        Program) of each run's last recorded round but `exclude_run`'s, most similar and then
        fastest first; runs whose record this build no longer reads are left out."""
        rows = self._db.execute(
            "SELECT r.signature, b.speedup, b.history FROM bests b JOIN runs r USING (run_id) "
            "WHERE b.round = (SELECT MAX(round) FROM bests WHERE run_id = b.run_id) "
            "AND b.run_id IS NOT ?", (exclude_run,)).fetchall()
        out = []
        for sig, speedup, history in rows:
            try:
                steps = tuple(transformation_from_obj(t) for t in json.loads(history))
            except (IRError, ValueError):
                continue
            out.append((similarity(signature, json.loads(sig)), speedup, steps))
        out.sort(key=lambda x: (-x[0], -(x[1] or 0.0)))
        return out

    def view(self, signature: Dict, run_id: Optional[str] = None) -> "MemoryView":
        """What the memory holds for `signature`, for the compile `run_id` (whose own chosen
        Programs are not offered back to it as seeds)."""
        return MemoryView(signature, tuple(self.similar(signature, threshold=0.0)),
                          tuple(self.best_histories(signature, exclude_run=run_id)))


class MemoryView:
    """A read-only snapshot of the memory as it concerns one deployment (safe to share with
    agents running in threads)."""

    def __init__(self, signature: Dict, scored: Sequence[tuple], bests: Sequence[tuple] = ()):
        self.signature = signature
        self.scored = tuple(scored)
        self.bests = tuple(bests)

    def seed_transformations(self, limit: int, threshold: float = SIMILAR
                             ) -> Tuple[List[Transformation], bool]:
        """What a new compile tries first, and whether it is one path to apply in order: the
        chosen Program's transformations of the most similar earlier compile (the fastest
        against its stock Program among equally similar ones) that got anywhere (True);
        without one, the `limit` best admitted mechanisms (False)."""
        for s, _speedup, steps in self.bests:
            if s >= threshold and steps:
                return list(steps), True
        return [m.transformation for m in self.seeds(threshold)[:limit]], False

    def seeds(self, threshold: float = SIMILAR) -> List[Mechanism]:
        """Admitted mechanisms from alike deployments, best first, one per transformation."""
        out, seen = [], set()
        for s, m in self.scored:
            if s >= threshold and m.admitted and m.transformation not in seen:
                seen.add(m.transformation)
                out.append(m)
        return out

    def failed_forcing(self, t: Transformation) -> bool:
        """True when `t` failed token forcing on this very deployment before."""
        return any(s >= 1.0 and m.transformation == t and not m.forcing_passed
                   for s, m in self.scored)

    def summary(self, limit: int = 20) -> List[dict]:
        """What the LLM agent is told: the most relevant mechanisms as plain data."""
        return [{"transformation": transformation_to_obj(m.transformation),
                 "similarity": s, "gain": m.gain, "forcing_passed": m.forcing_passed,
                 "admitted": m.admitted} for s, m in self.scored[:limit]]


def _dump(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _mechanism(row) -> Optional[Mechanism]:
    (_id, transformation, signature, _key, gain, passed, forcing, admitted, base, run_id,
     round_index, _created) = row
    try:
        t = transformation_from_obj(json.loads(transformation))
    except (IRError, ValueError):
        return None     # a record this build no longer knows: skipped, not fatal
    return Mechanism(t, json.loads(signature), gain, bool(passed), json.loads(forcing),
                     bool(admitted), base, run_id, int(round_index))
