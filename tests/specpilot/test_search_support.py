"""Shared helpers of the compile-loop tests (no tests here): tiny model pairs whose drafter
agrees with the target part of the time, workload files, and small compile settings."""
from __future__ import annotations

import glob
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_factory import make_checkpoint
from torch_threads import single_thread_fixture


# Imported by the test modules as their autouse fixture.
one_thread = single_thread_fixture()


def perturbed_copy(folder: str, out: str, scale: float, seed: int) -> str:
    """A copy of checkpoint `folder` whose every tensor gets seeded noise of `scale` times its
    own standard deviation: the same architecture and tokenizer, slightly different weights."""
    shutil.copytree(folder, out)
    gen = torch.Generator().manual_seed(seed)
    for path in glob.glob(os.path.join(out, "*.safetensors")):
        tensors = load_file(path)
        noisy = {}
        for name, t in tensors.items():
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            std = t.float().std() if t.numel() > 1 else t.float().abs()
            noisy[name] = (t.float() + scale * std * noise).to(t.dtype).contiguous()
        save_file(noisy, path, metadata={"format": "pt"})
    return out


def agreeing_pair(tmp_path, scale: float = 0.1, seed: int = 0):
    """(target, drafter): the drafter is the target with small noise, so it proposes the
    target's token often but not always (acceptance well between 0 and 1)."""
    target = make_checkpoint(tmp_path, "llama3", name="target", seed=seed,
                             hidden_size=64, intermediate_size=128)
    drafter = perturbed_copy(target, os.path.join(str(tmp_path), "drafter"), scale, seed + 7)
    return target, drafter


def prompts_file(tmp_path, count: int = 4, seed: int = 0) -> str:
    """A plain-text workload of `count` prompts of the test tokenizer's words."""
    gen = torch.Generator().manual_seed(seed)
    lines = []
    for _ in range(count):
        n = int(torch.randint(4, 9, (1,), generator=gen))
        ids = torch.randint(1, 97, (n,), generator=gen).tolist()
        lines.append(" ".join(f"w{i}" for i in ids))
    path = os.path.join(str(tmp_path), "prompts.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def small_settings(tmp_path, target: str, drafter: str, **overrides):
    """CompileSettings for a test compile that finishes in seconds on a CPU."""
    from specpilot.search.settings import CompileSettings

    base = dict(target_dir=target, drafter_dir=drafter,
                out_dir=os.path.join(str(tmp_path), "runs", "t"), gpu="cpu",
                workload=prompts_file(tmp_path), prompts=4, max_new_tokens=16, rounds=1,
                candidates_per_round=2, timing_repeats=1, baseline_repeats=2, workers=1,
                memory_path=os.path.join(str(tmp_path), "memory.sqlite"))
    base.update(overrides)
    return CompileSettings(**base)
