"""Continuous refill with draft trees in the graphed runtime: the refill host loop and per-row
round log (runtime/graphed_refill.py) over the static or dynamic tree's rounds
(runtime/graphed_tree.py, runtime/graphed_dynamic.py).

A tree round keeps no per-row state beyond the chain's (each row's length, last and previous
token, count, limit, active flag and output row): the tree's nodes, mask and positions live in
the round's own scratch slots past each row's length, written afresh every round. So a refilled
row needs what it needs with chains, a row prefill of both caches and its state set as a batch
prefill sets it; the classes below only combine the two through Python's method order (the
refill's host loop and log first, then the tree's round, forced round and compaction). Tree
lengths do not adapt (`rounds_refusal`), so the refill's length policy stays off.
"""
from __future__ import annotations

from .graphed_dynamic import GraphedDynamicTreeDecoder
from .graphed_refill import GraphedRefillDecoder
from .graphed_tree import GraphedTreeDecoder


class GraphedTreeRefillDecoder(GraphedRefillDecoder, GraphedTreeDecoder):
    """Static-tree speculation for any number of prompts, `batch` slots kept busy: a slot whose
    request is done takes the next one. Built as GraphedTreeDecoder is (`shape` a TreeShape
    where the chain decoder takes k)."""


class GraphedDynamicTreeRefillDecoder(GraphedRefillDecoder, GraphedDynamicTreeDecoder):
    """Dynamic-tree speculation for any number of prompts, `batch` slots kept busy. Built as
    GraphedDynamicTreeDecoder is (`topology` a DynamicTree where the chain decoder takes k)."""
