"""The graphed trees' acceptance walks on their own: `walk_tree` (static trees, all depths at
once) and `walk_per_row` (dynamic trees, depth by depth) against the greedy-accept kernel's
Python reference (`reference_ops.greedy_accept_ref`), on random trees and drafts."""
import random

import pytest
import torch

from specpilot.ir import SparseTree, Tree
from specpilot.runtime.graphed_dynamic import walk_per_row
from specpilot.runtime.graphed_tree import tree_walk_tables, walk_tree
from specpilot.runtime.reference_ops import greedy_accept_ref

VOCAB = 3


def _random_sparse_tree(rng: random.Random, nodes: int) -> SparseTree:
    """A random tree of `nodes` rank paths, at most 3 children a node (each parent's
    children are its top-1, top-2, ... tokens, as the IR requires)."""
    children = {(): 0}
    while len(children) < nodes + 1:
        parent = rng.choice([p for p, c in children.items() if c < 3])
        children[parent + (children[parent],)] = 0
        children[parent] += 1
    return SparseTree(tuple(p for p in children if p))


def _drafts_and_argmax(gen: torch.Generator, shape, batch: int):
    """Random node tokens, distinct among siblings, and the target's argmax per row [B, n+1],
    drawn from a small vocabulary so that long accepted paths are common."""
    n = shape.num_nodes
    nodes = torch.empty((batch, n), dtype=torch.int64)
    for b in range(batch):
        for i in range(n):
            taken = {int(nodes[b, j]) for j in range(i) if shape.parents[j] == shape.parents[i]}
            free = [t for t in range(VOCAB) if t not in taken]
            nodes[b, i] = free[int(torch.randint(len(free), (1,), generator=gen))]
    g = torch.randint(VOCAB, (batch, n + 1), generator=gen)
    return nodes, g


def _reference(nodes: torch.Tensor, g: torch.Tensor, parents: torch.Tensor, depth: int):
    logits = torch.nn.functional.one_hot(g, VOCAB).float()       # argmax g, no ties
    _, count, path, _ = greedy_accept_ref(logits, nodes, parents)
    return path[:, :depth], count


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_static_walk_accepts_what_the_reference_walk_accepts(seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    trees = [Tree((2, 2, 1)), Tree((3, 2)), _random_sparse_tree(rng, 7),
             _random_sparse_tree(rng, 12)]
    lengths = []
    for topology in trees:
        shape = topology.shape()
        tables = tree_walk_tables(shape, "cpu")
        nodes, g = _drafts_and_argmax(gen, shape, batch=64)
        path, count = walk_tree(tables, nodes, g)
        want_path, want_count = _reference(nodes, g, torch.tensor(shape.parents),
                                           shape.max_depth)
        assert torch.equal(count, want_count)
        assert torch.equal(path, want_path)
        lengths += count.tolist()
    # The draws reach every depth from 0 to at least 3: the check is not of empty paths only.
    assert set(range(4)) <= set(lengths)


@pytest.mark.parametrize("seed", [4, 5])
def test_the_per_row_walk_accepts_what_the_reference_walk_accepts(seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    rows = [_random_sparse_tree(rng, 8).shape() for _ in range(64)]
    depth = max(s.max_depth for s in rows)
    nodes, g, parents = [], [], []
    for shape in rows:                       # one row per tree, each its own parents
        row_nodes, row_g = _drafts_and_argmax(gen, shape, batch=1)
        nodes.append(row_nodes)
        g.append(row_g)
        parents.append(torch.tensor(shape.parents))
    nodes, g, parents = torch.cat(nodes), torch.cat(g), torch.stack(parents)
    path, count = walk_per_row(nodes, torch.where(parents >= 0, parents + 1, 0), g, depth)
    want_path, want_count = _reference(nodes, g, parents, depth)
    assert torch.equal(count, want_count) and torch.equal(path, want_path)
    assert count.max() >= 2
