"""The mechanism decode loop: speculative decoding with trees as data, either batch layout,
per-request draft lengths, two-level verification and continuous refill.

Each step, over the requests that are decoding (slots from runtime/refill.py):

  1. refill: finished requests leave their slots; queued ones come in (drain or continuous);
  2. drafter catch-up: feed what is committed but not in the drafter's cache (a newcomer's
     whole prompt, else at least the root); its logits at the root seed the proposal;
  3. propose: a `RowTree` per request (static shape, dynamic tree or adaptive chain);
  4. prune (two-level verification only): the cheap verifier keeps the nodes it agrees with;
  5. verify: ONE target forward over [the tokens the target lacks, root last] + the tree: for
     a request in its first step that is its prefill, so a newcomer's prefill shares the
     forward with the others' verification;
  6. accept (greedy, per request; in the ragged layout one packed pass with offsets), compact
     the accepted path's K/V behind the root, commit (plain or forced, runtime/request_state.py).

Invariant: after its first step, a request's target cache holds every committed token but the
root (the last), which the next verify forward writes itself.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from specpilot.ir.errors import SpecPilotError

from .acceptance import AcceptedPath, greedy_accept
from .batch_layout import LAYOUTS, FeedLogits, feed, run_feeds, with_pad_slot
from .checkpoint import check_same_vocabulary
from .ragged import ragged_greedy_accept
from .refill import SlotScheduler
from .request_state import check_path, commit_proposal, reference_tokens
from .row_tree import RowTree
from .speculative import SpecResult
from .steps import check_capacity
from .tree_drafting import catch_up
from .verify_tree import compact_path


@torch.no_grad()
def decode_with_mechanisms(target, drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                           proposer, eos_ids: Sequence[int] = (), *, layout: str = "padded",
                           refill: str = "drain", max_batch_size: Optional[int] = None,
                           pruner_factory: Optional[Callable] = None,
                           acceptance: Callable[..., AcceptedPath] = greedy_accept,
                           force_reference=None) -> SpecResult:
    """Greedy speculative decoding of every prompt, `max_batch_size` slots at a time.

    `proposer` drafts the trees (runtime/tree_drafting.py StaticProposer, DynamicProposer,
    AdaptiveChainProposer); `pruner_factory(batch, capacity)` builds a two-level TreePruner.
    With greedy acceptance the tokens equal `generate_ar`'s whatever the proposer, pruner,
    layout or refill. With `force_reference` (an ARResult) the run is forced, like
    `speculative_generate`. Counts: target_forwards = steps (prefills are inside them),
    drafter_forwards = catch-ups + drafting levels; `stats` adds verified_tokens (real tokens
    through the target's verify forwards), padded_tokens (tokens the layout computed, pads
    included), max_step_tokens (most roots + tree nodes verified in one step: what a token
    budget caps; prefill tokens are not counted), drafted_nodes,
    verified_nodes (after pruning), cheap_forwards, admissions, steps, interleaved_prefills
    (steps whose verify forward held a newcomer's prefill next to others' decoding).
    """
    if layout not in LAYOUTS:
        raise SpecPilotError(f"unknown batch layout {layout!r} (known: {', '.join(LAYOUTS)})")
    check_same_vocabulary(target.config, drafter.config)
    eos = set(eos_ids)
    references = reference_tokens(force_reference, prompts)
    if references is not None:
        max_new_tokens, eos = max(len(r) for r in references), set()
    batch = min(max_batch_size or len(prompts), len(prompts))
    slack = max(proposer.scratch_nodes, proposer.max_nodes) + 2
    capacity = with_pad_slot(max(check_capacity(m, prompts, max_new_tokens, slack)
                                 for m in (target, drafter)))
    t_cache, d_cache = target.new_cache(batch, capacity), drafter.new_cache(batch, capacity)
    pruner = pruner_factory(batch, capacity) if pruner_factory is not None else None
    scheduler = SlotScheduler(prompts, references, batch, refill)
    stats = dict(steps=0, verified_tokens=0, padded_tokens=0, max_step_tokens=0, drafted_nodes=0,
                 verified_nodes=0, cheap_forwards=0, admissions=0, interleaved_prefills=0)
    drafter_forwards = compactions = 0

    while True:
        scheduler.fill()
        rows = scheduler.active()
        if not rows:
            break
        reqs = [scheduler.slots[row] for row in rows]
        active = [(row, r.committed) for row, r in zip(rows, reqs)]

        root_logits = catch_up(drafter, d_cache, active, [r.drafter_len for r in reqs], layout)
        for r in reqs:
            # The drafter's tree K/V is never kept: accepted drafts are re-fed as committed
            # tokens next step (a roll back without a copy).
            r.drafter_len = len(r.committed)
        trees, forwards = proposer.propose(drafter, d_cache, active, reqs, root_logits, layout)
        drafter_forwards += 1 + forwards
        stats["drafted_nodes"] += sum(t.num_nodes for t in trees)
        if pruner is not None:
            trees, forwards = pruner.prune(active, reqs, trees, layout)
            stats["cheap_forwards"] += forwards
        stats["verified_nodes"] += sum(t.num_nodes for t in trees)

        feeds = [feed(row, r.committed[r.target_len:], r.target_len, tree)
                 for row, r, tree in zip(rows, reqs, trees)]
        logits = run_feeds(target, t_cache, feeds, layout)
        stats["steps"] += 1
        stats["verified_tokens"] += sum(len(f) for f in feeds)
        stats["max_step_tokens"] = max(stats["max_step_tokens"],
                                       sum(1 + t.num_nodes for t in trees))
        prefilling = [r.target_len == 0 for r in reqs]
        stats["interleaved_prefills"] += any(prefilling) and not all(prefilling)
        stats["padded_tokens"] += (sum(len(f) for f in feeds) if layout == "ragged"
                                   else batch * max(len(f) for f in feeds))

        paths = _accept(logits, trees, acceptance, layout)
        for row, r, tree, path in zip(rows, reqs, trees, paths):
            check_path(tree.children, path)
            c = len(r.committed)
            compactions += compact_path(t_cache, row, c - 1, path.nodes)
            r.accepted.append(path.length)
            proposer.observe(r, tree, path.length)
            kept = commit_proposal(r, [tree.tokens[n] for n in path.nodes] + [path.bonus], eos,
                                   max_new_tokens)
            r.target_len = c + kept

    done = scheduler.results()
    stats["admissions"] = scheduler.admissions
    steps = [n + 1 for r in done for n in r.accepted]
    return SpecResult(tokens=[r.generated for r in done], target_forwards=stats["steps"],
                      drafter_forwards=drafter_forwards,
                      accepted_lengths=[r.accepted for r in done],
                      mean_accepted=sum(steps) / len(steps) if steps else 0.0,
                      compactions=compactions,
                      proposals=[r.proposals for r in done] if references is not None else [],
                      stats=stats)


def _accept(logits: FeedLogits, trees: List[RowTree], acceptance,
            layout: str) -> List[AcceptedPath]:
    """Each request's accepted path; a request without drafts takes the target's token."""
    if layout == "ragged" and acceptance is greedy_accept:
        node_offsets = [0]
        for t in trees:
            node_offsets.append(node_offsets[-1] + t.num_nodes)
        # The trees as (tokens, parents, depths) rows, copied to the logits' device at once.
        cols = torch.tensor([[x for t in trees for x in t.tokens],
                             [x for t in trees for x in t.parents],
                             [x for t in trees for x in t.depths]],
                            dtype=torch.int64, device=logits.packed.device)
        return ragged_greedy_accept(logits.packed, logits.offsets, cols[0], node_offsets,
                                    cols[1], cols[2])
    out = []
    for i, tree in enumerate(trees):
        if tree.num_nodes == 0:
            out.append(AcceptedPath((), int(torch.argmax(logits[i][0]))))
        else:
            out.append(acceptance(tree.plan, list(tree.tokens), logits[i]))
    return out
