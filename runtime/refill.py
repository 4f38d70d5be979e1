"""Which request occupies each batch slot: `drain` or `continuous` refill.

drain:      the queue is cut into batches; a batch's slots wait until all of its requests are
            done, then the next batch takes them all.
continuous: as soon as a slot's request is done, the next queued request takes the slot; its
            prefill runs inside the next step's forwards, next to the others' decoding.

A newcomer inherits the slot's cache rows with whatever the previous request left there. That
K/V is garbage to it: `admit` starts every cache length at 0, so its whole prompt is written
from slot 0 before anything reads it, and nothing past its own committed tokens is ever visible.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from specpilot.ir.errors import SpecPilotError

from .request_state import Request

if TYPE_CHECKING:   # for the annotation only: the scheduler never calls into it
    from .adaptive_draft import AcceptanceEstimate

REFILLS = ("drain", "continuous")


@dataclass
class SlotRequest(Request):
    index: int = 0                     # the prompt's index in the caller's list
    cheap_len: int = 0                 # leading committed tokens in the cheap verifier's cache
    # The adaptive draft length's acceptance estimate; None before the request's first
    # drafted round.
    ema: Optional[AcceptanceEstimate] = None


def admit(index: int, prompt: Sequence[int], reference: Optional[List[int]],
          previous: Optional[SlotRequest]) -> SlotRequest:
    """A fresh request for a slot; `previous` (the slot's last occupant) leaves nothing behind."""
    return SlotRequest(committed=list(prompt), prompt_length=len(prompt), reference=reference,
                       index=index)


class SlotScheduler:
    """Hands queued prompts to batch slots and collects finished requests by prompt index."""

    def __init__(self, prompts: Sequence[Sequence[int]],
                 references: Optional[Sequence[List[int]]], slots: int, refill: str):
        if refill not in REFILLS:
            raise SpecPilotError(f"unknown refill policy {refill!r} (known: {', '.join(REFILLS)})")
        self.prompts = prompts
        self.references = references
        self.refill = refill
        self.queue = deque(range(len(prompts)))
        self.slots: List[Optional[SlotRequest]] = [None] * slots
        self.finished: Dict[int, SlotRequest] = {}
        self.admissions = 0

    def fill(self) -> List[int]:
        """Collect finished requests and admit queued ones; returns the slots refilled."""
        free = [row for row, r in enumerate(self.slots) if r is None or r.done]
        for row in free:
            r = self.slots[row]
            if r is not None:
                self.finished[r.index] = r
        if self.refill == "drain" and len(free) < len(self.slots):
            return []
        admitted = []
        for row in free:
            if not self.queue:
                self.slots[row] = None
                continue
            index = self.queue.popleft()
            reference = None if self.references is None else self.references[index]
            self.slots[row] = admit(index, self.prompts[index], reference, self.slots[row])
            admitted.append(row)
        self.admissions += len(admitted)
        return admitted

    def active(self) -> List[int]:
        """Slots whose request is still decoding."""
        return [row for row, r in enumerate(self.slots) if r is not None and not r.done]

    def results(self) -> List[SlotRequest]:
        """Every request in prompt order (call once the queue is empty and all are done)."""
        self.fill()
        missing = [i for i in range(len(self.prompts)) if i not in self.finished]
        if missing:
            raise SpecPilotError(f"requests {missing} never finished")
        return [self.finished[i] for i in range(len(self.prompts))]
