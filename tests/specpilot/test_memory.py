"""The SQLite memory: mechanisms recorded and found again for alike deployments, rounds
recorded atomically (a failure inside the transaction leaves nothing), WAL mode."""
import sqlite3

import pytest

from specpilot.ir import SetDraftLength, SetTopology, SetWeightFormat, Tree
from specpilot.memory import (Failure, Mechanism, MemoryStore, MemoryStoreError,
                              deployment_signature, similarity)
from test_cost_model import program  # noqa: F401 (fixture: an 8B/1B-shaped Program)

SIG = {"gpu": "h200", "dtype": "bfloat16", "family": "llama", "target_size": 33,
       "drafter_ratio": 3, "batch": 0, "workload": "humaneval"}


def mech(t, sig=SIG, gain=0.1, passed=True, admitted=True, run="r1", k=1):
    return Mechanism(t, sig, gain, passed, {"passed": passed}, admitted, "base", run, k)


def test_signature_of_a_program_and_similarity(program):
    sig = deployment_signature(program, "humaneval", 1)
    assert sig["gpu"] == "h200" and sig["family"] == "llama" and sig["batch"] == 0
    assert similarity(sig, sig) == 1.0
    other_gpu = dict(sig, gpu="a100")
    assert similarity(sig, other_gpu) == pytest.approx(0.75)
    nearby = dict(sig, target_size=sig["target_size"] + 1)
    assert similarity(sig, nearby) == pytest.approx(1 - 0.15 / 2)


def test_mechanisms_round_trip_and_seed_alike_deployments(tmp_path):
    path = tmp_path / "m.sqlite"
    with MemoryStore(path) as m:
        m.start_run("r1", str(tmp_path), SIG)
        m.complete_round("r1", 1, "p1", 100.0, [
            mech(SetDraftLength(6), gain=0.2),
            mech(SetTopology(Tree((2, 2))), gain=0.3),
            mech(SetDraftLength(2), gain=-0.1, admitted=False),
            mech(SetWeightFormat("target.*", "lossless12"), passed=False, admitted=False)],
            [Failure("SetWeightFormat(...)", "forcing", "3 violations")])
    with MemoryStore(path) as m:      # reopened: everything persisted
        assert [x.transformation for x in m.mechanisms("r1")][:2] == [
            SetDraftLength(6), SetTopology(Tree((2, 2)))]
        assert m.failures("r1") == [Failure("SetWeightFormat(...)", "forcing", "3 violations")]
        view = m.view(dict(SIG, batch=1))              # alike, not equal
        seeds = view.seeds()
        assert [s.transformation for s in seeds] == [SetTopology(Tree((2, 2))),
                                                     SetDraftLength(6)]
        assert not view.failed_forcing(SetWeightFormat("target.*", "lossless12"))
        same = m.view(SIG)
        assert same.failed_forcing(SetWeightFormat("target.*", "lossless12"))
        far = m.view(dict(SIG, gpu="rtx4090", dtype="float32", family="qwen3",
                          target_size=20))
        assert far.seeds() == []
        assert m._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_new_compile_is_seeded_with_the_best_path_of_the_most_alike_one(tmp_path):
    from specpilot.ir import CaptureGraphs

    path = tmp_path / "m.sqlite"
    graphs, tree = CaptureGraphs(True), SetTopology(Tree((2, 2)))
    with MemoryStore(path) as m:
        # r1 (batch 1): the tree was admitted alone, but the chosen path is graphs only.
        m.start_run("r1", str(tmp_path), SIG)
        m.complete_round("r1", 0, "stock", 80.0)
        m.complete_round("r1", 1, "p1", 1200.0, [mech(graphs, gain=14.0), mech(tree, gain=0.2)],
                         history=(graphs,))
        m.complete_round("r1", 2, "p1", 1210.0, [mech(SetDraftLength(6), admitted=False)],
                         history=(graphs,))
        # r2 (a less alike deployment) got further with a longer path.
        far = dict(SIG, drafter_ratio=9)
        m.start_run("r2", str(tmp_path), far)
        m.complete_round("r2", 0, "stock", 100.0)
        m.complete_round("r2", 1, "q1", 3000.0, history=(graphs, tree))
    with MemoryStore(path) as m:
        want = dict(SIG, batch=2)
        bests = m.best_histories(want)
        assert [b[2] for b in bests] == [(graphs,), (graphs, tree)]
        assert bests[0][1] == pytest.approx(1210.0 / 80.0)       # speedup over its own stock
        assert m.view(want).seed_transformations(3) == ([graphs], True)
        # A compile is never offered its own chosen Programs back.
        assert m.view(want, run_id="r1").seed_transformations(3) == ([graphs, tree], True)
        # Without any recorded path (a memory of mechanisms only), the admitted mechanisms.
        from specpilot.memory import MemoryView
        only = MemoryView(want, m.view(want).scored)
        assert only.seed_transformations(3) == ([graphs, tree], False)


def test_a_round_is_all_or_nothing(tmp_path):
    with MemoryStore(tmp_path / "m.sqlite") as m:
        m.start_run("r1", str(tmp_path), SIG)

        def killed():
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            m.complete_round("r1", 1, "p1", 1.0, [mech(SetDraftLength(3))],
                             [Failure("x", "forcing", "y")], before_commit=killed)
        assert m.completed_rounds("r1") == {}
        assert m.mechanisms() == [] and m.failures("r1") == []
        m.complete_round("r1", 1, "p1", 1.0, [mech(SetDraftLength(3))])
        assert m.completed_rounds("r1") == {1: "p1"}
        with pytest.raises(sqlite3.IntegrityError):       # a round is recorded once
            m.complete_round("r1", 1, "p2", 1.0)
        assert len(m.mechanisms()) == 1


def test_readers_see_committed_rounds_while_a_writer_holds_a_transaction(tmp_path):
    path = tmp_path / "m.sqlite"
    writer, reader = MemoryStore(path), MemoryStore(path)
    try:
        writer.start_run("r1", str(tmp_path), SIG)
        writer.complete_round("r1", 1, "p1", 1.0)
        seen = []
        writer.complete_round("r1", 2, "p2", 1.0,
                              before_commit=lambda: seen.append(reader.completed_rounds("r1")))
        assert seen == [{1: "p1"}]                       # not blocked, not the uncommitted round
        assert reader.completed_rounds("r1") == {1: "p1", 2: "p2"}
    finally:
        writer.close()
        reader.close()


def test_unknown_records_are_skipped_and_bad_files_refused(tmp_path):
    path = tmp_path / "m.sqlite"
    with MemoryStore(path) as m:
        m.start_run("r1", str(tmp_path), SIG)
        m.complete_round("r1", 1, "p", 1.0, [mech(SetDraftLength(3))])
        m._db.execute("UPDATE mechanisms SET transformation='{\"name\":\"Gone\",\"params\":{}}'")
        assert m.mechanisms() == []
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(MemoryStoreError, match="garbage.sqlite"):
        MemoryStore(garbage)
