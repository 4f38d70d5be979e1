"""Zoo presets as data: one frozen `ZooPreset` per named recipe.

A preset fixes everything that decides the trained weights (model shapes, corpus cap, steps,
batch, learning rates, device), so its canonical JSON is part of the cache key. Adding a preset
is adding an entry to `PRESETS`; nothing else changes.
"""
import dataclasses
import json
from dataclasses import dataclass

from specpilot.ir.errors import SpecPilotError


class ZooError(SpecPilotError):
    """A zoo request that cannot be served (unknown preset, unusable output folder, no device)."""


@dataclass(frozen=True)
class ModelDims:
    """Shape of one Llama-architecture model (the fields HF `LlamaConfig` needs)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ZooError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ZooError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
        if (self.hidden // self.heads) % 2:
            raise ZooError(f"head_dim={self.hidden // self.heads} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class StageSchedule:
    """Optimiser settings of one training stage (target pre-training or drafter distillation)."""

    steps: int
    lr: float
    warmup: int
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1


@dataclass(frozen=True)
class ZooPreset:
    """Everything that decides a trained target/drafter pair, given a seed."""

    name: str
    target: ModelDims
    drafter: ModelDims
    target_schedule: StageSchedule
    drafter_schedule: StageSchedule
    vocab_size: int
    seq_len: int
    batch_size: int            # windows of seq_len tokens per optimiser step
    micro_batch_size: int      # windows per forward/backward (gradients accumulate over them)
    corpus_bytes: int          # cap on the training corpus (UTF-8 bytes of source)
    holdout_files: int         # whole files kept out of training for the held-out numbers
    eval_tokens: int           # cap on held-out tokens scored in the report
    distill_kl_weight: float   # drafter loss = w * KL(target || drafter) + (1 - w) * LM loss
    distill_temperature: float
    device: str = "cpu"        # "cpu" or "cuda"
    cpu_threads: int = 2       # fixed so CPU results do not depend on the machine's core count
    log_every: int = 25

    def __post_init__(self):
        if self.batch_size % self.micro_batch_size:
            raise ZooError(f"preset {self.name!r}: batch_size={self.batch_size} must be a multiple "
                           f"of micro_batch_size={self.micro_batch_size}")

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) — the preset's part of the cache key."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))


PRESETS = {
    # For tests: trains in seconds on two CPU cores; weak but real and deterministic.
    "micro": ZooPreset(
        name="micro",
        target=ModelDims(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=176),
        drafter=ModelDims(hidden=32, layers=1, heads=1, kv_heads=1, intermediate=88),
        target_schedule=StageSchedule(steps=100, lr=3e-3, warmup=10),
        drafter_schedule=StageSchedule(steps=100, lr=3e-3, warmup=10),
        vocab_size=512, seq_len=64, batch_size=16, micro_batch_size=16,
        corpus_bytes=400_000, holdout_files=3, eval_tokens=4096,
        distill_kl_weight=0.8, distill_temperature=1.0, log_every=50),
    # The CPU pair: a few million parameters, about three minutes on two cores from cold. At this
    # compute a narrower target fed more tokens beats a wider one, small batches (many updates)
    # beat large ones, and pure-KL distillation gives the highest agreement (measured on this
    # corpus for about equal time: held-out loss 3.96 for this target over 1000 steps of 4
    # windows, 4.83 for a 256-wide one over 150 steps of 16; agreement 0.75, against 0.71 with a
    # 0.2 share of LM loss in the drafter's objective).
    "tiny": ZooPreset(
        name="tiny",
        target=ModelDims(hidden=192, layers=4, heads=3, kv_heads=1, intermediate=512),
        drafter=ModelDims(hidden=128, layers=2, heads=2, kv_heads=1, intermediate=344),
        target_schedule=StageSchedule(steps=1000, lr=2e-3, warmup=50),
        drafter_schedule=StageSchedule(steps=500, lr=2e-3, warmup=30),
        vocab_size=2048, seq_len=256, batch_size=4, micro_batch_size=4,
        corpus_bytes=4_000_000, holdout_files=6, eval_tokens=32768,
        distill_kl_weight=1.0, distill_temperature=1.0, log_every=100),
}


def get_preset(name: str) -> ZooPreset:
    """The preset called `name`; a ZooError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ZooError(f"unknown zoo preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None
