"""Held-out numbers of a zoo pair: each model's loss, a unigram baseline, and top-1 agreement.

Agreement — the fraction of held-out positions where the drafter's argmax equals the target's —
is what greedy speculative decoding accepts, so it is the figure of merit of the pair.
"""
import torch
import torch.nn.functional as F


def heldout_windows(stream: torch.Tensor, seq_len: int, max_tokens: int) -> torch.Tensor:
    """Non-overlapping windows of `seq_len + 1` tokens (consecutive windows share one token)."""
    n = min((stream.numel() - 1) // seq_len, max(1, -(-max_tokens // seq_len)))
    if n < 1:
        raise ValueError(f"held-out stream of {stream.numel()} tokens is shorter than one window")
    starts = torch.arange(n) * seq_len
    return stream[starts[:, None] + torch.arange(seq_len + 1)]


def unigram_loss(train_stream: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy of `labels` under add-one-smoothed training-token frequencies (a floor to beat)."""
    counts = torch.bincount(train_stream, minlength=vocab_size).double() + 1.0
    logp = torch.log(counts / counts.sum())
    return float(-logp[labels.flatten()].mean())


@torch.no_grad()
def evaluate_pair(target, drafter, windows: torch.Tensor, device, batch_size: int = 16) -> dict:
    """Held-out loss and top-1 accuracy of both models and their argmax agreement on `windows`."""
    target.eval()
    drafter.eval()
    sums = {"target_nll": 0.0, "drafter_nll": 0.0, "target_correct": 0, "drafter_correct": 0,
            "agree": 0}
    positions = 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i:i + batch_size].to(device)
        inputs, labels = batch[:, :-1], batch[:, 1:].flatten()
        t_logits = target(inputs).float().flatten(0, 1)
        d_logits = drafter(inputs).float().flatten(0, 1)
        t_top, d_top = t_logits.argmax(-1), d_logits.argmax(-1)
        sums["target_nll"] += float(F.cross_entropy(t_logits, labels, reduction="sum"))
        sums["drafter_nll"] += float(F.cross_entropy(d_logits, labels, reduction="sum"))
        sums["target_correct"] += int((t_top == labels).sum())
        sums["drafter_correct"] += int((d_top == labels).sum())
        sums["agree"] += int((t_top == d_top).sum())
        positions += labels.numel()
    return {
        "positions": positions,
        "target_loss": sums["target_nll"] / positions,
        "drafter_loss": sums["drafter_nll"] / positions,
        "target_top1_accuracy": sums["target_correct"] / positions,
        "drafter_top1_accuracy": sums["drafter_correct"] / positions,
        "agreement": sums["agree"] / positions,
    }
