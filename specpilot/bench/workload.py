"""The benchmark workload: prompts encoded with the pair's tokenizer, filled up to whole batches,
and the stock decoder's reference output every system is checked against."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.ar import ARResult
from specpilot.runtime.decoder import ModelPair, run_reference


def workload_texts(workload: str, limit: Optional[int], asked: str = "") -> List[str]:
    """The first `limit` prompts of `workload` ("humaneval" or a prompts file); a SpecPilotError
    where it has fewer (`asked`: what asked for them, default --prompts)."""
    from specpilot.prompts import workload_prompts

    texts = workload_prompts(workload, limit)
    if limit and len(texts) < limit:
        raise SpecPilotError(f"{asked or f'--prompts {limit}'} asked for, but workload "
                             f"{workload!r} has only {len(texts)}")
    return texts


def encode_prompts(pair: ModelPair, workload: str, limit: Optional[int]) -> List[List[int]]:
    """The first `limit` prompts of `workload` ("humaneval" or a prompts file), as token ids."""
    return [pair.encode(t) for t in workload_texts(workload, limit)]


def fill_batches(items: Sequence, batch_size: int) -> list:
    """`items` repeated cyclically up to a whole number of batches, so every batch is full
    (a batch size larger than the workload is measured on repeats of its prompts)."""
    total = math.ceil(len(items) / batch_size) * batch_size
    return [items[i % len(items)] for i in range(total)]


def batches(items: Sequence, batch_size: int):
    for start in range(0, len(items), batch_size):
        yield items[start:start + batch_size]


def stock_reference(pair: ModelPair, prompts: Sequence[Sequence[int]],
                    max_new_tokens: int) -> ARResult:
    """The stock decoder's output (greedy AR of the target, one prompt at a time) with margins.

    On a GPU each decode step is replayed from a CUDA graph of the same forward (same kernels,
    same shapes; runtime/graphed_chain.py with chains of 0), which makes the reference of a
    large workload affordable."""
    import torch

    if pair.target.device.type != "cuda":
        return run_reference(pair, prompts, max_new_tokens, batch_size=1)
    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.runtime.steps import check_capacity

    capacity = check_capacity(pair.target, prompts, max_new_tokens, slack=1)
    decoder = GraphedChainDecoder(pair.target, None, 1, capacity, 0, pair.eos_ids,
                                  record_margins=True)
    decoder.prepare_prefill(prompts)
    out = ARResult([], [], 0)
    for p in prompts:
        r = decoder.generate_reference([p], max_new_tokens)
        out.tokens += r.tokens
        out.margins += r.margins
        out.target_forwards += r.target_forwards
    del decoder
    torch.cuda.empty_cache()
    return out


def filled_reference(reference: ARResult, batch_size: int) -> ARResult:
    """The reference of `fill_batches(prompts, batch_size)`."""
    return ARResult(fill_batches(reference.tokens, batch_size),
                    fill_batches(reference.margins, batch_size), reference.target_forwards)
