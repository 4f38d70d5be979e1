"""Training loops of the zoo: target pre-training (next-token loss) and drafter distillation.

Both loops are deterministic given their generators on CPU (fixed data order, fixed init, fixed
thread count chosen by the caller) and no wall-clock limit. On CUDA they use bf16 autocast, fused
AdamW and page-locked batches (the caller allows TF32); weights stay float32 either way so
checkpoints are float32.
"""
import contextlib
import math
import time

import torch
import torch.nn.functional as F

from specpilot.zoo.presets import StageSchedule
from specpilot.zoo.stage_clock import StageClock, StageResult


class WindowBatches:
    """Shuffled non-overlapping windows of `seq_len + 1` tokens from one token stream.

    Every window is visited once per epoch, in an order drawn from `generator`, so the data
    order is a pure function of the stream and the seed.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator):
        n = (stream.numel() - 1) // seq_len
        if n < batch_size:
            raise ValueError(f"token stream of {stream.numel()} tokens is too short for "
                             f"{batch_size} windows of {seq_len}")
        # Windows are gathered per batch: materialising all of them would copy the stream.
        self.stream, self.starts = stream, torch.arange(n) * seq_len
        self.offsets = torch.arange(seq_len + 1)
        self.batch_size, self.generator = batch_size, generator
        self._order, self._pos = None, 0

    def next(self) -> torch.Tensor:
        """The next (batch_size, seq_len + 1) batch; a new shuffled epoch starts when one runs out."""
        if self._order is None or self._pos + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.starts), generator=self.generator)
            self._pos = 0
        idx = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.stream[self.starts[idx, None] + self.offsets]


def lr_at(step: int, sched: StageSchedule) -> float:
    """Linear warm-up to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if step < sched.warmup:
        return sched.lr * (step + 1) / sched.warmup
    progress = (step - sched.warmup) / max(1, sched.steps - sched.warmup)
    floor = sched.lr * sched.min_lr_ratio
    return floor + (sched.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model: torch.nn.Module, sched: StageSchedule, device: torch.device):
    """AdamW with weight decay on matrices only (not norms); fused kernels on CUDA."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": sched.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=sched.lr, betas=(0.9, 0.95), eps=1e-8, **extra)


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA; plain float32 elsewhere (CPU bf16 is slower and less exact)."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _run_stage(label, model, sched, batches, micro_batch_size, device, loss_fn, progress, log_every,
               max_seconds=None, clip=1.0) -> StageResult:
    """Optimise `model`'s parameters on `loss_fn(inputs, labels)` for `sched.steps` steps, or
    fewer when `max_seconds` (a wall-clock limit, see stage_clock.py) cuts the stage short.

    Each step's batch is split into micro-batches of `micro_batch_size` windows whose gradients
    accumulate: on CPU, activations past a few MiB are fresh pages on every step (the allocator
    maps and unmaps them) and page faults then cost more than the arithmetic.
    """
    model.train()
    opt = make_optimizer(model, sched, device)
    clock = StageClock(max_seconds, device, sched)
    planned = sched.steps
    window_loss = torch.zeros((), device=device)
    window_steps, window_tokens, window_start = 0, 0, time.perf_counter()
    last_loss, tokens, stopped_at, step = float("nan"), 0, None, 0
    while step < sched.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, sched)
        batch = batches.next()
        if device.type == "cuda":  # page-locked, so the copy overlaps the previous step's kernels
            batch = batch.pin_memory()
        batch = batch.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        for chunk in batch.split(micro_batch_size):
            inputs, labels = chunk[:, :-1], chunk[:, 1:]
            with autocast_for(device):
                loss = loss_fn(inputs, labels) * (len(chunk) / len(batch))
            loss.backward()
            window_loss += loss.detach()
            window_tokens += inputs.numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        window_steps += 1
        step += 1
        sched, stop = clock.after_step(step, sched, label, progress)
        if stop:
            stopped_at = step
        if step % log_every == 0 or step == sched.steps or stop:
            last_loss = window_loss.item() / window_steps  # host sync (else only the clock probe)
            elapsed = time.perf_counter() - window_start
            progress(f"[{label}] step {step}/{sched.steps} loss {last_loss:.4f} "
                     f"lr {lr_at(step - 1, sched):.2e} {window_tokens / max(elapsed, 1e-9):.0f} tok/s")
            tokens += window_tokens
            window_loss.zero_()
            window_steps, window_tokens, window_start = 0, 0, time.perf_counter()
        if stop:
            break
    model.eval()
    return StageResult(final_loss=last_loss, planned_steps=planned, steps=step, tokens=tokens,
                       seconds=clock.elapsed(), rescheduled_to=clock.rescheduled_to,
                       stopped_early_at_step=stopped_at)


def maybe_compile(model, enabled: bool):
    """`torch.compile(model)` when `enabled` (the callable used for training), else `model`."""
    return torch.compile(model) if enabled else model


def lm_loss(model, inputs, labels):
    """Mean next-token cross-entropy of `model` on (inputs, labels)."""
    logits = model(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def train_target(model, sched: StageSchedule, batches: WindowBatches, micro_batch_size: int, device,
                 progress, log_every: int, max_seconds=None, compile: bool = False) -> StageResult:
    """Pre-train `model` on next-token prediction (see `_run_stage` for `max_seconds`)."""
    forward = maybe_compile(model, compile)
    return _run_stage("target", model, sched, batches, micro_batch_size, device,
                      lambda x, y: lm_loss(forward, x, y), progress, log_every, max_seconds)


def distillation_loss(drafter, target, inputs, labels, kl_weight: float, temperature: float):
    """w * T^2 * KL(target_T || drafter_T) + (1 - w) * next-token loss of the drafter.

    The KL term pulls the drafter's whole distribution (hence its argmax) onto the target's,
    which is what speculative acceptance rewards; the LM term keeps it anchored to real text.
    """
    with torch.no_grad():
        teacher = target(inputs).float()
    student = drafter(inputs).float()
    t = temperature
    kl = F.kl_div(F.log_softmax(student / t, dim=-1).flatten(0, 1),
                  F.log_softmax(teacher / t, dim=-1).flatten(0, 1),
                  log_target=True, reduction="batchmean") * (t * t)
    if kl_weight >= 1.0:
        return kl
    ce = F.cross_entropy(student.flatten(0, 1), labels.flatten())
    return kl_weight * kl + (1.0 - kl_weight) * ce


def distil_drafter(drafter, target, sched: StageSchedule, batches: WindowBatches, micro_batch_size: int,
                   device, progress, log_every: int, kl_weight: float, temperature: float,
                   max_seconds=None, compile: bool = False) -> StageResult:
    """Train `drafter` to match frozen `target`'s next-token distribution."""
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    student, teacher = maybe_compile(drafter, compile), maybe_compile(target, compile)
    try:
        return _run_stage("drafter", drafter, sched, batches, micro_batch_size, device,
                          lambda x, y: distillation_loss(student, teacher, x, y, kl_weight, temperature),
                          progress, log_every, max_seconds)
    finally:
        for p in target.parameters():
            p.requires_grad_(True)
