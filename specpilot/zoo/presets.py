"""Zoo presets as data: one frozen `ZooPreset` per named recipe.

A preset fixes everything that decides the trained weights (model shapes, corpus cap, steps,
batch, learning rates, device), so its canonical JSON is part of the cache key. Adding a preset
is adding an entry to `PRESETS`; nothing else changes.
"""
import dataclasses
import json
from dataclasses import dataclass
from typing import Optional, Tuple

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

    def parameter_count(self, vocab_size: int) -> int:
        """Parameters of the Llama this describes (untied embeddings and LM head, no biases)."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden
        return self.layers * (attention + mlp + norms) + 2 * vocab_size * self.hidden + self.hidden


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
    # Fields below were added later. At their defaults they are left out of `to_json`, so the
    # presets that existed before them keep their cache keys.
    corpus: str = "stdlib"     # see CORPUS_SOURCES
    tokenizer_train_bytes: Optional[int] = None  # BPE trained on this many leading bytes (None: all)
    compile: bool = False      # torch.compile the models for training (not for evaluation)
    # Wall-clock guard per stage, seconds: one number for every stage, or (target, drafter).
    # A stage that would overrun shortens its schedule, and stops if it still runs past it.
    max_seconds_per_stage: Optional[Tuple[float, ...]] = None
    # Greedy chain speculation with the saved pair on the first HumanEval prompts, per draft length.
    spec_eval_prompts: int = 4               # 0 skips it
    spec_eval_new_tokens: int = 32
    spec_eval_draft_lengths: Tuple[int, ...] = (4, 8)
    spec_eval_dtype: str = "float32"

    def __post_init__(self):
        if self.batch_size % self.micro_batch_size:
            raise ZooError(f"preset {self.name!r}: batch_size={self.batch_size} must be a multiple "
                           f"of micro_batch_size={self.micro_batch_size}")
        if self.corpus not in CORPUS_SOURCES:
            raise ZooError(f"preset {self.name!r}: corpus {self.corpus!r} is not one of "
                           f"{', '.join(sorted(CORPUS_SOURCES))}")
        limit = self.max_seconds_per_stage
        if limit is not None:
            limits = (limit,) if isinstance(limit, (int, float)) else tuple(limit)
            if len(limits) not in (1, 2) or any(not x > 0 for x in limits):
                raise ZooError(f"preset {self.name!r}: max_seconds_per_stage must be a positive "
                               f"number or a (target, drafter) pair, got {limit!r}")
            object.__setattr__(self, "max_seconds_per_stage", tuple(float(x) for x in limits))
        object.__setattr__(self, "spec_eval_draft_lengths", tuple(self.spec_eval_draft_lengths))

    def stage_seconds(self, stage: str) -> Optional[float]:
        """The wall-clock limit of stage "target" or "drafter" (None: unlimited)."""
        limits = self.max_seconds_per_stage
        if limits is None:
            return None
        return limits[0] if len(limits) == 1 or stage == "target" else limits[1]

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) — the preset's part of the cache key."""
        fields = dataclasses.asdict(self)
        for name, default in _OMITTED_AT_DEFAULT.items():
            if fields[name] == default:
                del fields[name]
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))


# "stdlib": the standard library's source. "python-env": the standard library and the
# site-packages of the running interpreter, without tests, duplicates or HumanEval's functions.
CORPUS_SOURCES = frozenset({"stdlib", "python-env"})
_OMITTED_AT_DEFAULT = {
    f.name: f.default
    for f in dataclasses.fields(ZooPreset)
    if f.name in ("corpus", "tokenizer_train_bytes", "compile", "max_seconds_per_stage",
                  "spec_eval_prompts", "spec_eval_new_tokens", "spec_eval_draft_lengths",
                  "spec_eval_dtype")
}


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
    # The GPU pair: a 161.5M-parameter target and a 12.6M drafter (1/12.8) in about four minutes
    # on one H200. Target: 800 steps x 64 windows x 1024 tokens = 52M tokens, planned at ~350k
    # tokens/s (6 x 161.5M FLOP/token plus attention: ~35% of bf16 peak) = ~150s, about 1.25
    # epochs of the 150 MB corpus (~42M tokens at ~3.6 bytes/token). Drafter: 500 pure-KL steps,
    # each a no-grad target forward (~1/3 of a training step) plus the drafter's own pass,
    # ~0.1s/step = ~50s. Corpus ~5s, BPE on 20 MB ~3s, encoding ~5s, evaluation and saving ~5s.
    # The stage limits (160s, 55s) refit or stop the stages on a slower GPU, so the whole run
    # stays near four minutes anyway; the speculation eval is timed apart.
    "gpu-small": ZooPreset(
        name="gpu-small",
        target=ModelDims(hidden=1024, layers=12, heads=16, kv_heads=4, intermediate=3072),
        drafter=ModelDims(hidden=384, layers=4, heads=6, kv_heads=2, intermediate=1024),
        target_schedule=StageSchedule(steps=800, lr=1.5e-3, warmup=40),
        drafter_schedule=StageSchedule(steps=500, lr=2e-3, warmup=25),
        vocab_size=8192, seq_len=1024, batch_size=64, micro_batch_size=32,
        corpus_bytes=150_000_000, holdout_files=48, eval_tokens=131072,
        distill_kl_weight=1.0, distill_temperature=1.0, device="cuda", log_every=50,
        corpus="python-env", tokenizer_train_bytes=20_000_000, compile=False,
        max_seconds_per_stage=(160.0, 55.0),
        spec_eval_prompts=32, spec_eval_new_tokens=128, spec_eval_dtype="bfloat16"),
}


def get_preset(name: str) -> ZooPreset:
    """The preset called `name`; a ZooError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ZooError(f"unknown zoo preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None
