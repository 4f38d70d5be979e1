"""Whole compiles on a tiny pair on the CPU: the run folder, the memory, reuse of mechanisms
validated before (a seeded compile reaches its best in fewer evaluations), and resuming after a
kill between rounds and in the middle of one (counting evaluations the same way)."""
import json
import os
import signal
import subprocess
import sys

import pytest

from specpilot.ir import (SetDraftLength, diff, format_diff, load_program, program_id,
                          stock_program)
from specpilot.memory import Mechanism, MemoryStore, deployment_signature
from specpilot.search.compile import Hooks, compile_deployment
from test_search_support import agreeing_pair, one_thread, small_settings  # noqa: F401


class Killed(BaseException):
    """What a kill looks like to the code under test: nothing after it runs."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return agreeing_pair(tmp_path_factory.mktemp("pair"))


def memory_rows(settings):
    with MemoryStore(settings.memory_path) as m:
        return (m._db.execute("SELECT run_id, round FROM rounds ORDER BY round").fetchall(),
                m._db.execute("SELECT transformation, round FROM mechanisms ORDER BY id")
                .fetchall())


def evaluations_by_hand(out_dir):
    """(evaluations until the last round's Program was first chosen, in all), counted from the
    round folders' candidates.json and round.json."""
    per_round, ids = [], []
    k = 0
    while os.path.isdir(os.path.join(out_dir, f"round-{k}")):
        with open(os.path.join(out_dir, f"round-{k}", "candidates.json")) as f:
            per_round.append(sum(1 for o in json.load(f) if o["forcing"] is not None
                                 or o["stage"] == "forcing"))
        with open(os.path.join(out_dir, f"round-{k}", "round.json")) as f:
            ids.append(json.load(f)["program_id"])
        k += 1
    first = ids.index(ids[-1])
    return sum(per_round[:first + 1]), sum(per_round)


def assert_consistent(settings, rounds):
    """Folder and memory agree: rounds 0..rounds sealed, recorded once, no partial folder."""
    out = settings.out_dir
    names = sorted(os.listdir(out))
    assert not [n for n in names if n.endswith(".partial")]
    assert [n for n in names if n.startswith("round-")] == [f"round-{k}" for k in
                                                              range(rounds + 1)]
    recorded, _ = memory_rows(settings)
    assert [k for _, k in recorded] == list(range(rounds + 1))
    for k in range(rounds + 1):
        with open(os.path.join(out, f"round-{k}", "round.json")) as f:
            sealed = json.load(f)
        assert sealed["program_id"] == program_id(load_program(os.path.join(out, f"round-{k}")))
    best = load_program(out)                       # runs/NAME/program.json
    assert best == load_program(os.path.join(out, "best"))
    assert program_id(best) == program_id(load_program(os.path.join(out, f"round-{rounds}")))


def test_compile_writes_rounds_best_and_memory(pair, tmp_path):
    settings = small_settings(tmp_path, *pair)
    lines = []
    result = compile_deployment(settings, progress=lines.append)
    assert_consistent(settings, 1)
    out = settings.out_dir
    zero = json.load(open(os.path.join(out, "round-0", "report.json")))
    assert zero["forcing"]["passed"] and zero["forcing"]["violations"] == []
    assert zero["ar_timing"]["median_tokens_per_s"] > 0
    assert zero["calibration"]["points"]                      # calibrated on AR and stock
    one = json.load(open(os.path.join(out, "round-1", "report.json")))
    assert one["cost_report"]["prediction_error"] is not None
    assert one["outcomes"], "round 1 evaluated nothing"
    for o in one["outcomes"]:
        assert o["stage"] in ("proposal", "lowering", "build", "forcing", "output", "admitted",
                              "not_admitted")
        assert o["admitted"] or o["reason"]                  # every failure says why
    for name in ("program.json", "diff.txt", "report.md", "candidates.json",
                 "kernels/plan.json"):
        assert os.path.exists(os.path.join(out, "round-1", name)), name
    stock = load_program(os.path.join(out, "round-0"))
    text = open(os.path.join(out, "round-1", "diff.txt")).read()
    assert format_diff(diff(stock, result.best)) in text
    _, mechanisms = memory_rows(settings)
    # one mechanism per evaluated single transformation (a combination is not one)
    evaluated = [o for o in one["outcomes"] if len(o["transformations"]) == 1
                 and o["stage"] in ("admitted", "not_admitted", "forcing", "output")]
    assert sorted(m[0] for m in mechanisms) == sorted(
        json.dumps(o["transformations"][0], sort_keys=True, separators=(",", ":"))
        for o in evaluated)
    assert any("[round 1] candidate" in line for line in lines)


def test_mechanisms_from_an_alike_deployment_seed_the_first_round(pair, tmp_path):
    settings = small_settings(tmp_path, *pair, candidates_per_round=1)
    from specpilot.deploy import build_deployment
    stock = stock_program(build_deployment(*pair, gpu="cpu", dtype="float32"))
    signature = deployment_signature(stock, settings.workload, 1)
    with MemoryStore(settings.memory_path) as m:
        m.start_run("earlier", "elsewhere", signature)
        m.complete_round("earlier", 1, "p", 1.0, [Mechanism(
            SetDraftLength(2), signature, 0.25, True, {"passed": True}, True, "b", "earlier", 1)])
    compile_deployment(settings, progress=lambda _: None)
    one = json.load(open(os.path.join(settings.out_dir, "round-1", "report.json")))
    seeded = [o for o in one["outcomes"] if o["direction"] == "memory"]
    assert [o["label"] for o in seeded] == [str(SetDraftLength(2))]
    assert seeded[0]["forcing"]["passed"]


@pytest.mark.parametrize("moment", ["before_commit", "after_commit", "mid_round"])
def test_a_killed_compile_resumes_consistently(pair, tmp_path, moment):
    settings = small_settings(tmp_path, *pair, rounds=2)
    kill_round = 2 if moment == "mid_round" else 1

    def kill(k):
        if k == kill_round:
            raise Killed

    with pytest.raises(Killed):
        compile_deployment(settings, progress=lambda _: None, hooks=Hooks(**{moment: kill}))
    recorded, mechanisms_before = memory_rows(settings)
    done = [k for _, k in recorded]
    assert done == ([0] if moment == "before_commit" else [0, 1])
    lines = []
    result = compile_deployment(settings, progress=lines.append)
    assert (result.evaluations.to_best, result.evaluations.total) == evaluations_by_hand(
        settings.out_dir)
    assert any(f"resuming after round {max(done)}" in line for line in lines)
    assert not any("[round 0]" in line for line in lines)          # round 0 not redone
    assert_consistent(settings, 2)
    _, mechanisms = memory_rows(settings)
    # the rounds recorded before the kill are not recorded again
    kept = [m for m in mechanisms if m[1] in done]
    assert kept == [m for m in mechanisms_before if m[1] in done]


def test_a_resumed_compile_must_be_asked_the_same(pair, tmp_path):
    from specpilot.search.settings import SettingsError

    settings = small_settings(tmp_path, *pair, rounds=0)
    compile_deployment(settings, progress=lambda _: None)
    changed = small_settings(tmp_path, *pair, rounds=0, max_new_tokens=8)
    with pytest.raises(SettingsError, match="max_new_tokens"):
        compile_deployment(changed, progress=lambda _: None)


def test_sigkill_inside_an_open_round_transaction_then_resume(pair, tmp_path):
    """SIGKILL while round 2's folder is written and its memory transaction is open."""
    settings = small_settings(tmp_path, *pair, rounds=2)
    script = (
        "import json, sys, time\n"
        "from specpilot.search.compile import Hooks, compile_deployment\n"
        "from specpilot.search.settings import CompileSettings\n"
        "settings = CompileSettings.from_json(json.loads(sys.argv[1]))\n"
        "def hold(k):\n"
        "    if k == 2:\n"
        "        print('HOLDING', flush=True)\n"
        "        time.sleep(120)\n"
        "compile_deployment(settings, progress=lambda m: print(m, flush=True),\n"
        "                   hooks=Hooks(before_commit=hold))\n")
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(settings.to_json())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("HOLDING"):
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert seen and seen[-1].startswith("HOLDING"), "".join(seen[-20:])
    assert os.path.isdir(os.path.join(settings.out_dir, "round-2.partial"))
    recorded, _ = memory_rows(settings)
    assert [k for _, k in recorded] == [0, 1]       # the open transaction left nothing
    compile_deployment(settings, progress=lambda _: None)
    assert_consistent(settings, 2)


def test_a_compile_seeded_from_the_memory_reaches_its_best_in_fewer_evaluations(pair, tmp_path):
    """Batch 1 first, on an empty memory; then batch 2 (another setting, an alike deployment)
    on the same memory file: its seeds are evaluated first, together, and end round 1."""
    from specpilot.report import build_run_report

    first = compile_deployment(small_settings(tmp_path, *pair, candidates_per_round=3,
                                              out_dir=str(tmp_path / "runs" / "b1")),
                               progress=lambda _: None)
    assert first.evaluations.to_best >= 2, "the agents offered fewer than 2 candidates"
    admitted = [o["label"] for o in json.load(open(tmp_path / "runs" / "b1" / "round-1" /
                                                   "candidates.json")) if o["admitted"]]
    assert admitted, "nothing was admitted on batch 1: nothing for the memory to seed"
    lines = []
    second = compile_deployment(small_settings(tmp_path, *pair, candidates_per_round=3,
                                               batch_size=2,
                                               out_dir=str(tmp_path / "runs" / "b2")),
                                progress=lines.append)
    one = json.load(open(tmp_path / "runs" / "b2" / "round-1" / "report.json"))
    evaluated = [o for o in one["outcomes"] if o["forcing"] is not None]
    assert [o["direction"] for o in evaluated] == ["memory"]
    assert evaluated[0]["admitted"] and evaluated[0]["label"] in admitted
    assert one["chosen"] == evaluated[0]["label"] and one["evaluations"] == 1
    assert any("propose again in the next round" in n for n in one["notes"])
    assert second.evaluations.to_best == 1 < first.evaluations.to_best
    for run, result in (("b1", first), ("b2", second)):
        assert (result.evaluations.to_best, result.evaluations.total) == evaluations_by_hand(
            str(tmp_path / "runs" / run))
        build_run_report(str(tmp_path / "runs" / run))
        summary = json.load(open(tmp_path / "runs" / run / "report.json"))
        assert summary["evaluations_to_best"] == result.evaluations.to_best
        assert summary["evaluations"] == result.evaluations.total
        text = open(tmp_path / "runs" / run / "report.md").read()
        assert (f"best reached after {result.evaluations.to_best} candidate evaluations, of "
                f"{result.evaluations.total}") in text
    assert evaluated[0]["program_id"] == program_id(second.best)
