"""Per-request bookkeeping shared by every speculative decode loop: what is committed, how far
each model's cache has caught up, and how a step's proposal is committed (plain or forced).

Forced mode (token forcing): the candidate's proposed tokens are recorded and the REFERENCE
tokens committed in their place; at the first disagreement within a step the rest of that step's
proposal is dropped (it was conditioned on a token that is not the reference's), so every
reference position is proposed exactly once, always after the reference prefix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from specpilot.ir.errors import SpecPilotError

from .acceptance import AcceptedPath


@dataclass
class Request:
    committed: List[int]
    prompt_length: int
    reference: Optional[List[int]]
    target_len: int = 0                # leading committed tokens with K/V in the target cache
    drafter_len: int = 0               # ... in the drafter cache
    done: bool = False
    accepted: List[int] = field(default_factory=list)
    proposals: List[int] = field(default_factory=list)

    @property
    def generated(self) -> List[int]:
        return self.committed[self.prompt_length:]


def commit_proposal(r: Request, proposal: List[int], eos: set, max_new_tokens: int) -> int:
    """Commit a step's proposal (accepted drafts + bonus); returns how many of its leading path
    tokens stay valid in the target cache. Forced: commit reference tokens instead, stopping
    after the first disagreement."""
    for j, tok in enumerate(proposal):
        if r.reference is None:
            r.committed.append(tok)
            if tok in eos or len(r.generated) >= max_new_tokens:
                r.done = True
                break
            continue
        ref = r.reference[len(r.generated)]
        r.proposals.append(tok)
        r.committed.append(ref)
        if len(r.generated) >= len(r.reference):
            r.done = True
            break
        if tok != ref:
            return j
    return len(proposal) - 1


def check_path(children, path: AcceptedPath) -> None:
    """Refuse an acceptance result that does not descend the tree (`children(node)` lists a
    node's children, -1 being the root)."""
    parent = -1
    for node in path.nodes:
        if node not in children(parent):
            raise SpecPilotError(f"acceptance rule returned path {list(path.nodes)}, but node "
                                 f"{node} is not a child of {parent}: a path must descend the tree")
        parent = node


def reference_tokens(reference, prompts: Sequence) -> Optional[List[List[int]]]:
    """The reference's tokens per request (None when not forcing), checked against the prompts."""
    if reference is None:
        return None
    tokens = [list(t) for t in reference.tokens]
    if len(tokens) != len(prompts):
        raise SpecPilotError(f"the reference has {len(tokens)} requests but {len(prompts)} prompts "
                             f"were given: force with the prompts the reference was decoded from")
    if any(not t for t in tokens):
        raise SpecPilotError("a reference request has no tokens: nothing to force")
    return tokens
