"""Kernels interpreted on the CPU, compiled for the H200 (sm_90) without a GPU.

The interpreter never compiles a kernel, so these tests record interpreted launches
(codegen/launch_record.py) and compile each for sm_90 in a worker process
(codegen/target_compile.py): the generated round-end kernels of a refilled, adaptive batch
compile and fit the GPU; a kernel the interpreter runs correctly but the compiler refuses, and
one that needs more shared memory than the GPU has, are both reported, by name, with the reason.
Launches that compile alike are recorded once; saved launches carry their sources, so they
compile after the kernel's file is gone; the command prints failures and a summary naming the
Triton that compiled, and refuses a bad file or a worker interpreter that cannot run it.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch
import triton

from specpilot.codegen.cache import triton_interpreting
from specpilot.codegen.launch_record import (INTERPRETER_FLAGS, LaunchRecordError, Launches,
                                             make_record, module_name, recording_launches)
from specpilot.codegen.target_compile import (TARGETS, TargetCompileError, compile_in_subprocess,
                                              compile_records)
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

from mechanism_setup import MAX_NEW
from refill_setup import mixed_requests

pytestmark = pytest.mark.skipif(not triton_interpreting(),
                                reason="records interpreted launches (the CPU suite); on a GPU "
                                       "the kernels compile for real when they run")

KERNELS = '''
import triton
import triton.language as tl


def _double(x):            # a plain Python helper: the interpreter calls it, the compiler cannot
    return x * 2


@triton.jit
def plain_helper(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, _double(tl.load(x_ptr + r, mask=r < n)), mask=r < n)


@triton.jit
def twice(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r, mask=r < n) * 2, mask=r < n)


@triton.jit
def flagged(a_ptr, c_ptr, K, BLOCK: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    r = tl.arange(0, BLOCK)
    if DOT_IN_FP32:        # the interpreter's branch: compiled, it needs 2 MB of shared memory
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k in range(0, K, BLOCK):
            a = tl.load(a_ptr + r[:, None] * K + k + r[None, :])
            b = tl.load(a_ptr + (k + r[:, None]) * K + r[None, :])
            acc += tl.dot(a, b)
    else:
        acc = tl.load(a_ptr + r[:, None] * K + r[None, :])
    tl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)


@triton.jit
def square_tile(a_ptr, c_ptr, K, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, K, BLOCK):
        a = tl.load(a_ptr + r[:, None] * K + k + r[None, :])
        b = tl.load(a_ptr + (k + r[:, None]) * K + r[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc)
'''


@pytest.fixture
def kernels(tmp_path):
    path = tmp_path / "hand_kernels.py"
    path.write_text(textwrap.dedent(KERNELS), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("hand_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_round_end_kernels_of_a_refilled_adaptive_batch_compile_for_sm90():
    s, prompts, reference = mixed_requests(4)
    with recording_launches() as recorded:
        refill = GraphedRefillDecoder(s["target"], s["drafter"], 3, 48, 4, s["eos"], capture=False,
                                      accept_kernels="fused", adaptive=True,
                                      round_costs=[1.0, 1.5, 1.9, 2.3, 2.7],
                                      length_estimator="per_depth").generate(prompts, MAX_NEW)
        padded = GraphedChainDecoder(s["target"], s["drafter"], 2, 48, 3, s["eos"], capture=False,
                                     accept_kernels="fused").generate(prompts[:2], MAX_NEW)
    # Recording passes every launch through: the decoders still give greedy AR's tokens.
    assert refill.tokens == reference.tokens and padded.tokens == reference.tokens[:2]
    kernels = {r.kernel for r in recorded.records}
    assert {"_row_start_kernel", "_chain_commit_kernel", "_length_policy_kernel",
            "_length_admit_kernel"} <= kernels, kernels
    results = compile_in_subprocess(recorded, "sm_90")
    assert [r.label for r in results] == [r.label for r in recorded.records]
    assert [r.line() for r in results if not r.ok] == []
    # Each label names its generated module: the family the kernel is named after.
    assert {module_name(r.label) for r in results} == {
        r.kernel.strip("_").removesuffix("_kernel") for r in recorded.records}
    for record, result in zip(recorded.records, results):
        assert result.num_warps == dict(record.kwargs)["num_warps"][0][1]
        assert 0 <= result.shared_bytes <= TARGETS["sm_90"].max_shared_bytes


def test_what_only_the_compiler_refuses_is_reported(kernels):
    x = torch.randn(40)
    y = torch.empty(40)
    a = torch.randn(512, 512)
    c = torch.empty(256, 256)
    with recording_launches() as recorded:
        kernels.plain_helper[(1,)](x, y, 40, BLOCK=64)
        kernels.square_tile[(1,)](a, c, 512, BLOCK=256, num_stages=4)
    # The interpreter ran both correctly...
    assert torch.equal(y, x * 2)
    torch.testing.assert_close(c, (a.double() @ a.double())[:256, :256].float(), rtol=1e-4,
                               atol=1e-2)
    # ...and compiling for the GPU refuses both, each with its reason.
    helper, tile = compile_in_subprocess(recorded, "sm_90")
    assert helper.label == "hand_kernels:plain_helper" and not helper.ok
    assert "_double" in helper.error
    assert tile.label == "hand_kernels:square_tile" and not tile.ok
    assert "shared memory" in tile.error and tile.shared_bytes > 232448


def test_launches_that_compile_alike_are_recorded_once(kernels, tmp_path):
    x = torch.randn(40)
    y = torch.empty(40)
    recorded = Launches()
    with recording_launches(recorded):
        for n in (40, 37, 33):           # runtime ints neither 1 nor divisible by 16: alike
            kernels.plain_helper[(1,)](x, y, n, BLOCK=64)
        kernels.plain_helper[(1,)](x, y, 32, BLOCK=64)       # divisible by 16: specialised
        kernels.plain_helper[(1,)](x, y, 40, BLOCK=128)      # another constexpr
        kernels.plain_helper[(1,)](x.double(), y, 40, BLOCK=64)   # another dtype
        kernels.plain_helper[(1,)](x[1:], y, 39, BLOCK=64)   # a pointer off 16-byte alignment
    records = recorded.records
    assert len(records) == 5
    assert [dict(r.args[0])["aligned"] for r in records] == [True] * 4 + [False]
    assert dict(records[3].args[0])["tensor"] == "float64"
    assert len({r.digest for r in records}) == 1


def test_saved_launches_compile_after_their_source_is_gone(kernels, tmp_path):
    x = torch.randn(50)
    y = torch.empty(50)
    with recording_launches() as recorded:
        kernels.twice[(1,)](x, y, 50, BLOCK=64)
    assert torch.equal(y, x * 2)
    path = tmp_path / "launches.jsonl"
    recorded.save(path)
    source = tmp_path / "hand_kernels.py"
    text = source.read_text()
    source.unlink()                      # as pytest's temporary folders go before a compile
    loaded = Launches.load(path)
    assert loaded.records == recorded.records
    assert list(loaded.sources.values()) == [text]
    [result] = compile_in_subprocess(loaded, "sm_90")
    assert result.ok and result.label == "hand_kernels:twice", result.line()


def test_records_from_a_bad_file_or_for_an_unknown_gpu_are_refused(kernels, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "k.py", "kernel": "k", "args": []}\n{not json\n')
    with pytest.raises(LaunchRecordError, match="not a launch record"):
        Launches.load(bad)
    bad.write_text("{not json\n")
    with pytest.raises(LaunchRecordError, match="bad.jsonl:1: not JSON"):
        Launches.load(bad)
    launches = Launches()
    launches.add(*make_record(kernels.twice.fn, (torch.ones(2), torch.ones(2), 2), {"BLOCK": 2}))
    launches.save(bad)
    bad.write_text(bad.read_text().split("\n", 1)[1])     # the source's line dropped
    with pytest.raises(LaunchRecordError, match="records name sources it does not hold"):
        Launches.load(bad)
    with pytest.raises(TargetCompileError, match="unknown GPU architecture 'sm_61'"):
        compile_in_subprocess(launches, "sm_61")
    with pytest.raises(TargetCompileError, match="interpreted in this process"):
        compile_records(launches, "sm_90")
    with pytest.raises(TargetCompileError, match="interpreter '.*no-python' cannot be started"):
        compile_in_subprocess(launches, "sm_90", python=str(tmp_path / "no-python"))
    with pytest.raises(TargetCompileError, match="exited with 1 and no result"):
        compile_in_subprocess(launches, "sm_90", python="false")


def test_the_command_prints_each_failure_and_a_summary(kernels, tmp_path):
    x = torch.randn(50)
    y = torch.empty(50)
    with recording_launches() as recorded:
        kernels.twice[(1,)](x, y, 50, BLOCK=64)
        kernels.plain_helper[(1,)](x, y, 50, BLOCK=64)
    path = tmp_path / "launches.jsonl"
    recorded.save(path)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    command = [sys.executable, "-m", "specpilot.codegen.target_compile"]
    result = tmp_path / "result.json"
    done = subprocess.run(command + [str(path), "--quiet", "--json", str(result)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert "FAIL hand_kernels:plain_helper" in done.stderr and "twice" not in done.stderr
    assert "| hand_kernels | 2 | 1 |" in done.stdout
    compiler = f"triton {triton.__version__}"
    assert f"1 of 2 launches compile for sm_90 ({compiler})" in done.stdout
    answer = json.loads(result.read_text())
    assert answer["arch"] == "sm_90" and answer["compiler"] == compiler
    assert [r["error"] is None for r in answer["results"]] == [True, False]
    missing = subprocess.run(command + [str(tmp_path / "none.jsonl")], env=env,
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "target_compile: error:" in missing.stderr


def test_interpreter_flags_compile_as_the_gpu_runs_them(kernels):
    """DOT_IN_FP32 is True in the interpreter; the GPU runs the kernel with it False, and so
    must the compile (here the True branch alone needs more shared memory than the GPU has)."""
    a = torch.randn(512, 512)
    c = torch.empty(256, 256)
    with recording_launches() as recorded:
        kernels.flagged[(1,)](a, c, 512, BLOCK=256, DOT_IN_FP32=True, num_stages=4)
    torch.testing.assert_close(c, (a.double() @ a.double())[:256, :256].float(), rtol=1e-4,
                               atol=1e-2)
    [record] = recorded.records
    assert dict(record.kwargs)["DOT_IN_FP32"] == (("interpreter_flag", True),)
    [as_run] = compile_in_subprocess(recorded, "sm_90")
    assert as_run.ok, as_run.line()
    # The same launch with the flag kept True compiles the interpreter's branch, which fails.
    kept = Launches()
    kept.add(replace(record, kwargs=tuple((k, (("value", True),) if k == "DOT_IN_FP32" else v)
                                          for k, v in record.kwargs)),
             recorded.sources[record.digest])
    [interpreters] = compile_in_subprocess(kept, "sm_90")
    assert not interpreters.ok and "shared memory" in interpreters.error


def test_every_flag_the_templates_derive_from_the_interpreter_is_known():
    """A template that passes `_interpreted(kernel)` as a keyword must name it in
    INTERPRETER_FLAGS, or its launches recorded on the CPU would compile the interpreter's
    variant."""
    import importlib.resources

    passed = set()
    folder = importlib.resources.files("specpilot.templates").joinpath("triton")
    for template in sorted(folder.iterdir(), key=lambda t: t.name):
        text = template.read_text(encoding="utf-8")
        for name in re.findall(r"^(\w+) = _interpreted\(", text, flags=re.M):
            passed |= set(re.findall(rf"(\w+)={name}\b", text))
    assert passed == set(INTERPRETER_FLAGS)


def test_a_recording_inside_another_keeps_its_launches_to_itself(kernels):
    from triton.runtime.interpreter import InterpretedFunction

    unrecorded = InterpretedFunction.run
    x = torch.randn(50)
    y = torch.empty(50)
    with recording_launches() as outer:
        with recording_launches() as idle:     # closed empty, while the outer is empty too
            pass
        kernels.twice[(1,)](x, y, 50, BLOCK=64)
        with recording_launches() as inner:
            kernels.twice[(1,)](x, y, 50, BLOCK=128)
        kernels.twice[(1,)](x, y, 50, BLOCK=32)
    kernels.twice[(1,)](x, y, 50, BLOCK=16)      # after both: neither records it
    assert torch.equal(y, x * 2)
    blocks = lambda r: [dict(rec.kwargs)["BLOCK"] for rec in r.records]   # noqa: E731
    assert blocks(outer) == [(("value", 64),), (("value", 32),)]
    assert blocks(inner) == [(("value", 128),)] and idle.records == []
    assert InterpretedFunction.run is unrecorded
