"""What the best Program's ratio to the AR baseline measures, when it is not speculation.

The compile's AR baseline (strong AR on a GPU) runs on the stock Program's fast path. A Program
that turned speculation off (`SetDrafter("none")`) is plain greedy decoding itself, and one on
another fast path (`SetFastPath("layers")`) owes part of its speed to kernels that plain
decoding would get too; one with continuous refill owes part of it to refill, which plain
decoding gets too. Measured on an H200: a compile at batch 16 reported its best at 1.28x strong
AR, and that best was plain decoding on the whole-layer path. The report says so next to the
ratio, instead of leaving it to be read as a speculative gain.
"""
from __future__ import annotations

from typing import Optional

from specpilot.ir import Program


def baseline_note(best: Program, ar_label: str, ar_fast_path: Optional[str]) -> Optional[str]:
    """What `best`'s ratio to the AR baseline (`ar_label`, padded batches on the fast path
    `ar_fast_path`; None where the run did not record it) measures, or None when it is the gain
    of speculation over plain decoding on the same path and the same batching."""
    notes = [_path_note(best, ar_label, ar_fast_path)]
    if best.kernels.attention_kernels != "model":
        # The bench's greedy AR with the kernel, on the best Program's fast path.
        ar_twin = ("mech:graphed_ar_layers_attention" if best.kernels.fast_path == "layers"
                   else "mech:graphed_ar_attention")
        notes.append(f"Its attention runs by the {best.kernels.attention_kernels} kernel, which "
                     f"{ar_label} does not use: part of its ratio is that kernel's gain "
                     "(`specpilot bench --mechanisms` times plain decoding with it as "
                     f"{ar_twin}).")
    if best.batch.refill == "continuous":
        notes.append(f"It refills finished slots, which {ar_label}'s padded batches do not: part "
                     "of its ratio is refill's gain (`specpilot bench` times plain decoding with "
                     "refill as strong_ar_refill).")
    said = [n for n in notes if n is not None]
    return " ".join(said) if said else None


def _path_note(best: Program, ar_label: str, ar_fast_path: Optional[str]) -> Optional[str]:
    """`baseline_note` before refill: what speculation off or another fast path make of it."""
    path = best.kernels.fast_path
    other_path = ar_fast_path is not None and path != ar_fast_path
    if not best.draft.speculates:
        if other_path:
            return (f"The best Program does not speculate: it is plain greedy decoding on the "
                    f"'{path}' fast path, and {ar_label} ran on the '{ar_fast_path}' one, so "
                    f"its ratio to {ar_label} is that fast path's gain, not speculation's.")
        return (f"The best Program does not speculate: it is plain greedy decoding, as "
                f"{ar_label} is, so its ratio to it measures how it decodes (the decoding "
                f"loop and its kernels), not speculation.")
    if other_path:
        return (f"The best Program runs on the '{path}' fast path and {ar_label} on the "
                f"'{ar_fast_path}' one: part of its ratio to {ar_label} is that fast path's "
                f"gain, which plain decoding gets too (`specpilot bench` with "
                f"SPECPILOT_FAST_OPS={path} times both on it).")
    return None
