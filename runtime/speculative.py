"""Speculative decoding over a static draft tree (a chain is the tree with branching 1), batched.

Bookkeeping per request: its committed tokens (prompt + generated), and for each model how many
leading committed tokens have K/V in that model's cache. Every step:

  1. drafter catch-up: feed what is committed but not yet in the drafter's cache (at least the
     last committed token, the root), padded across the batch; its logits at the root seed the tree;
  2. draft: the drafter expands the tree level by level (`draft_tree`);
  3. verify: ONE target forward over root + all nodes with the tree mask (`verify_tree`);
  4. accept (per request): the acceptance rule picks a path and a bonus token;
  5. commit: the path's K/V is compacted behind the root in the target cache; the drafter rolls
     back to the committed length it had verified and catches up next step.

The target's cache always lags the committed sequence by exactly the root, which the verify
forward writes itself, so the target never needs a separate catch-up.

Forced mode (`force_reference`, used by token forcing): the candidate still drafts, verifies and
accepts on its own, but each proposed token is recorded and the REFERENCE token is committed in
its place (see runtime/request_state.py).

The batching mechanisms (ragged layout, per-request draft lengths, continuous refill) and the
dynamic / two-level verification run in runtime/step_loop.py; this loop is the stock one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence

import torch

from .acceptance import AcceptedPath, greedy_accept
from .checkpoint import check_same_vocabulary
from .drafting import draft_tree
from .request_state import Request
from .request_state import check_path, commit_proposal, reference_tokens
from .steps import append_step, check_capacity
from .tree_plan import TreePlan
from .verify_tree import compact_path, verify_tree


@dataclass
class SpecResult:
    tokens: List[List[int]]            # generated tokens per request (EOS included if hit)
    target_forwards: int               # prefill + one verify forward per step
    drafter_forwards: int              # per step: one catch-up + one per tree level but the last
    accepted_lengths: List[List[int]]  # per request, per step it was active: drafts accepted
    mean_accepted: float               # mean over (step, active request) of accepted + 1 bonus
    compactions: int = 0               # target KV compaction copies (never for chains)
    # forced mode only: the token the candidate proposed at each reference position
    proposals: List[List[int]] = field(default_factory=list)
    # counters of the mechanism decode loop (runtime/step_loop.py), e.g. verified_tokens
    stats: Dict[str, int] = field(default_factory=dict)
    # an adaptive graphed refill decoder's length rule: its round prices and when it turned
    # speculation off (GraphedRefillDecoder._length_rule); empty for every other decoder
    length_rule: dict = field(default_factory=dict)


@torch.no_grad()
def speculative_generate(target, drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         shape, eos_ids: Sequence[int] = (),
                         acceptance: Callable[..., AcceptedPath] = greedy_accept,
                         force_reference=None) -> SpecResult:
    """Greedy speculative decoding of every prompt with draft topology `shape` (a TreeShape,
    `Chain` or `Tree`); with `greedy_accept` the tokens equal `generate_ar`'s.

    Each request stops at its own EOS or after `max_new_tokens`; tokens a step proposes past that
    point are dropped. `accepted_lengths` counts the drafts the acceptance rule accepted (before
    that cut), and `mean_accepted` is the mean over (step, active request) of tokens committed per
    target forward, i.e. accepted drafts + 1 bonus (0.0 if no step ran). With `force_reference`
    (an ARResult) the run is forced: see the module docstring; `eos_ids` and `max_new_tokens` are
    then taken from the reference lengths.
    """
    plan = TreePlan.build(shape)
    check_same_vocabulary(target.config, drafter.config)
    eos = set(eos_ids)
    references = reference_tokens(force_reference, prompts)
    if references is not None:
        max_new_tokens, eos = max(len(r) for r in references), set()
    capacity = max(check_capacity(m, prompts, max_new_tokens, slack=plan.num_nodes + 2)
                   for m in (target, drafter))
    b, device = len(prompts), target.device
    t_cache, d_cache = target.new_cache(b, capacity), drafter.new_cache(b, capacity)
    reqs = [Request(list(p), len(p), None if references is None else references[i])
            for i, p in enumerate(prompts)]

    logits = append_step(target, t_cache, torch.zeros(b, dtype=torch.int64, device=device),
                         [r.committed for r in reqs])          # prefill: first token, as in AR
    for r, tok in zip(reqs, torch.argmax(logits, dim=-1).tolist()):
        r.target_len = r.prompt_length
        commit_proposal(r, [tok], eos, max_new_tokens)
    target_forwards, drafter_forwards, compactions = 1, 0, 0

    while not all(r.done for r in reqs):
        # The convention every step relies on: the target holds all committed K/V but the root's.
        assert all(r.done or r.target_len == len(r.committed) - 1 for r in reqs)
        pending = [[0] if r.done else r.committed[r.drafter_len:] for r in reqs]
        drafter_lengths = torch.tensor([r.drafter_len for r in reqs], device=device)
        root_logits = append_step(drafter, d_cache, drafter_lengths, pending)
        for r in reqs:
            # Stays at this length: the drafter's tree K/V is never kept, the accepted drafts
            # are re-fed as committed tokens next step (a roll back, without a copy).
            r.drafter_len = r.drafter_len if r.done else len(r.committed)
        root_slots = torch.tensor([len(r.committed) - 1 for r in reqs], device=device)
        roots = torch.tensor([r.committed[-1] for r in reqs], device=device)
        node_tokens, forwards = draft_tree(drafter, d_cache, root_slots, root_logits, plan)
        logits = verify_tree(target, t_cache, root_slots, roots, node_tokens, plan)
        drafter_forwards += 1 + forwards
        target_forwards += 1
        for row, (r, nodes) in enumerate(zip(reqs, node_tokens.tolist())):
            if r.done:
                continue
            path = acceptance(plan, nodes, logits[row])
            check_path(plan.children, path)
            root = len(r.committed) - 1
            compactions += compact_path(t_cache, row, root, path.nodes)
            r.accepted.append(path.length)
            kept = commit_proposal(r, [nodes[n] for n in path.nodes] + [path.bonus], eos,
                                   max_new_tokens)
            r.target_len = root + 1 + kept

    steps = [n + 1 for r in reqs for n in r.accepted]
    return SpecResult(tokens=[r.generated for r in reqs], target_forwards=target_forwards,
                      drafter_forwards=drafter_forwards,
                      accepted_lengths=[r.accepted for r in reqs],
                      mean_accepted=sum(steps) / len(steps) if steps else 0.0,
                      compactions=compactions,
                      proposals=[r.proposals for r in reqs] if references is not None else [])
