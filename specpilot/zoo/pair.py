"""Train one target/drafter pair from a preset and a seed, start to finish, into a folder.

The pipeline, in order: corpus → tokenizer → token streams → target pre-training → drafter
distillation → held-out evaluation → HF checkpoints + train_report.json. Every random choice
comes from a generator derived from the seed, so on CPU the same (preset, seed) gives
bit-identical weights.
"""
import contextlib
import hashlib
import json
import platform
import time
from pathlib import Path

import torch

from specpilot.zoo.corpus import load_corpus
from specpilot.zoo.evaluate import evaluate_pair, heldout_windows, unigram_loss
from specpilot.zoo.llama_train_model import TrainLlama
from specpilot.zoo.presets import ZooError, ZooPreset
from specpilot.zoo.save_hf import save_checkpoint
from specpilot.zoo.tokenizer import encode_documents, train_tokenizer
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


def train_pair(preset: ZooPreset, seed: int, out_dir: Path, progress=print) -> dict:
    """Train `preset` with `seed`; write out_dir/target, out_dir/drafter and the report; return it."""
    out_dir = Path(out_dir)
    device = resolve_device(preset)
    pinned = _fixed_threads(preset.cpu_threads) if device.type == "cpu" else contextlib.nullcontext()
    with pinned:
        return _train_pair(preset, seed, out_dir, device, progress)


def _train_pair(preset, seed, out_dir, device, progress) -> dict:
    t_start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    seconds = {}

    corpus = load_corpus(preset.corpus_bytes, preset.holdout_files)
    progress(f"[zoo] corpus: {len(corpus.train)} files, {corpus.train_bytes} bytes; "
             f"{len(corpus.heldout)} held-out files")
    t = time.perf_counter()
    tokenizer = train_tokenizer((f.text for f in corpus.train), preset.vocab_size)
    train_stream = torch.tensor(encode_documents(tokenizer, (f.text for f in corpus.train)))
    heldout_stream = torch.tensor(encode_documents(tokenizer, (f.text for f in corpus.heldout)))
    seconds["tokenizer"] = time.perf_counter() - t
    progress(f"[zoo] tokenizer: vocab {tokenizer.get_vocab_size()}, {train_stream.numel()} training "
             f"tokens, {heldout_stream.numel()} held-out tokens ({seconds['tokenizer']:.1f}s)")

    target = TrainLlama(preset.target, preset.vocab_size)
    target.init_weights(_generator(seed, "target-init"))
    drafter = TrainLlama(preset.drafter, preset.vocab_size)
    drafter.init_weights(_generator(seed, "drafter-init"))
    target.to(device)
    drafter.to(device)
    progress(f"[zoo] target {target.num_parameters():,} params, drafter "
             f"{drafter.num_parameters():,} params, device {device}")

    t = time.perf_counter()
    target_batches = WindowBatches(train_stream, preset.seq_len, preset.batch_size,
                                   _generator(seed, "target-data"))
    target_train_loss = train_target(target, preset.target_schedule, target_batches,
                                     preset.micro_batch_size, device, progress, preset.log_every)
    seconds["target"] = time.perf_counter() - t

    t = time.perf_counter()
    drafter_batches = WindowBatches(train_stream, preset.seq_len, preset.batch_size,
                                    _generator(seed, "drafter-data"))
    drafter_train_loss = distil_drafter(drafter, target, preset.drafter_schedule, drafter_batches,
                                        preset.micro_batch_size, device, progress, preset.log_every,
                                        preset.distill_kl_weight, preset.distill_temperature)
    seconds["drafter"] = time.perf_counter() - t

    t = time.perf_counter()
    windows = heldout_windows(heldout_stream, preset.seq_len, preset.eval_tokens)
    heldout = evaluate_pair(target, drafter, windows, device)
    heldout["unigram_loss"] = unigram_loss(train_stream, windows[:, 1:], preset.vocab_size)
    seconds["evaluate"] = time.perf_counter() - t
    progress(f"[zoo] held-out loss: target {heldout['target_loss']:.4f}, drafter "
             f"{heldout['drafter_loss']:.4f}, unigram {heldout['unigram_loss']:.4f}; "
             f"agreement {heldout['agreement']:.3f} over {heldout['positions']} positions")

    save_checkpoint(target, tokenizer, out_dir / "target")
    save_checkpoint(drafter, tokenizer, out_dir / "drafter")
    seconds["total"] = time.perf_counter() - t_start
    # CPU time of all threads: about threads x total when the machine is not shared.
    seconds["process_cpu"] = time.process_time() - cpu_start

    report = {
        "preset": json.loads(preset.to_json()),
        "seed": seed,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "corpus": {"train_files": len(corpus.train), "train_bytes": corpus.train_bytes,
                   "train_tokens": train_stream.numel(),
                   "heldout_files": [f.relpath for f in corpus.heldout],
                   "heldout_tokens": heldout_stream.numel()},
        "target_parameters": target.num_parameters(),
        "drafter_parameters": drafter.num_parameters(),
        "target_train_loss": target_train_loss,
        "drafter_train_loss": drafter_train_loss,
        "heldout": heldout,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    progress(f"[zoo] done in {seconds['total']:.1f}s")
    return report
