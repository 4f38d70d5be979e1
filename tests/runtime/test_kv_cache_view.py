"""KVCache (runtime/kv_cache.py): a view of some rows and slots whose writes land in the
cache, and whose reads are the cache's own entries (its stacked buffers' too), checked element
by element against indexing the full tensors by hand; `move_slots` (one gather and scatter over
the stacked layers, or layer by layer) against a slot-by-slot copy by hand; and a cache whose
layers are not its stacked buffer's refused."""
import pytest
import torch

from specpilot.runtime.kv_cache import KVCache


def _random_cache(seed, num_layers=2, batch=3, capacity=10, head_dim=4):
    cache = KVCache.allocate(num_layers=num_layers, batch=batch, capacity=capacity,
                             num_kv_heads=2, head_dim=head_dim, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    cache.positions.copy_(torch.randint(0, 50, cache.positions.shape, generator=g))
    return cache


def test_a_view_reads_and_writes_the_chosen_rows_and_slots_only():
    cache = _random_cache(1)
    before = [t.clone() for t in cache.k + cache.v + [cache.positions]]
    view = cache.view(rows=slice(1, 2), slots=slice(0, 6))
    assert view.batch == 1 and view.capacity == 6
    for mine, full in zip(view.k + view.v + [view.positions], before):
        assert torch.equal(mine, full[1:2, :6])
    g = torch.Generator().manual_seed(2)
    for t in view.k + view.v:
        t.copy_(torch.randn(t.shape, generator=g))
    view.positions.fill_(-7)
    for i, (now, then) in enumerate(zip(cache.k + cache.v + [cache.positions], before)):
        written = (view.k + view.v + [view.positions])[i]
        assert torch.equal(now[1, :6], written[0])               # the writes landed
        assert not torch.equal(now[1, :6], then[1, :6])
        assert torch.equal(now[1, 6:], then[1, 6:])              # the rest is as it was
        assert torch.equal(now[0], then[0]) and torch.equal(now[2], then[2])


def test_the_default_view_is_the_whole_cache():
    cache = _random_cache(3)
    view = cache.view()
    assert view.batch == cache.batch and view.capacity == cache.capacity
    for mine, full in zip(view.k + view.v + [view.positions],
                          cache.k + cache.v + [cache.positions]):
        assert torch.equal(mine, full)


def test_a_views_stacked_buffers_are_its_layers():
    view = _random_cache(4).view(rows=slice(1, 3), slots=slice(2, 8))
    for layers, stacked in ((view.k, view.stacked_k), (view.v, view.stacked_v)):
        assert stacked.shape[0] == len(layers)
        for i, t in enumerate(layers):
            assert torch.equal(stacked[i], t) and stacked[i].data_ptr() == t.data_ptr()


def _moved_by_hand(before, rows, src, dst):
    want = before.clone()
    for b, r in enumerate(rows.flatten().tolist()):
        for j in range(src.shape[1]):
            want[r, int(dst[b, j])] = before[r, int(src[b, j])]
    return want


@pytest.mark.parametrize("stacked", [True, False])
def test_move_slots_copies_every_layers_k_and_v_and_nothing_else(stacked):
    cache = _random_cache(7, num_layers=3, batch=4, capacity=12, head_dim=3)
    if not stacked:                          # layers held as separate tensors
        cache = KVCache(k=[t.clone() for t in cache.k], v=[t.clone() for t in cache.v],
                        positions=cache.positions)
    before = [t.clone() for t in cache.k + cache.v + [cache.positions]]
    # Per row: accepted nodes at slots after a base moved down to the slots right after it.
    # The ranges overlap (a source is another move's destination), and the last row's path is
    # where it belongs already (source = destination), as an unmoved or inactive row's is.
    base = torch.tensor([2, 0, 5, 3])
    nodes = torch.tensor([[0, 2, 3], [1, 2, 4], [0, 1, 2], [0, 1, 2]])
    dst = base[:, None] + torch.arange(1, 4)
    src = torch.where(torch.tensor([True, True, True, False])[:, None],
                      base[:, None] + 1 + nodes, dst)
    rows = torch.arange(4)[:, None]
    cache.move_slots(rows, src, dst)
    for now, then in zip(cache.k + cache.v, before):
        assert torch.equal(now, _moved_by_hand(then, rows, src, dst))
        assert not torch.equal(now, then)
    assert torch.equal(cache.positions, before[-1])       # positions are the caller's


def test_move_slots_on_a_view_moves_within_the_view():
    cache = _random_cache(5)
    before = [t.clone() for t in cache.k + cache.v]
    view = cache.view(rows=slice(1, 3), slots=slice(2, 10))
    src, dst = torch.tensor([[3, 5], [6, 7]]), torch.tensor([[1, 2], [2, 3]])
    view.move_slots(torch.arange(2)[:, None], src, dst)
    for now, then in zip(cache.k + cache.v, before):
        want = then.clone()
        want[1:3, 2:10] = _moved_by_hand(then[1:3, 2:10], torch.arange(2), src, dst)
        assert torch.equal(now, want) and not torch.equal(now, then)


def test_a_cache_whose_layers_are_not_its_stacked_buffers_is_refused():
    cache = _random_cache(6)
    with pytest.raises(ValueError, match="stacked buffer"):
        KVCache(k=[t.clone() for t in cache.k], v=cache.v, positions=cache.positions,
                stacked_k=cache.stacked_k, stacked_v=cache.stacked_v)


def _layered(cache: KVCache) -> KVCache:
    """The same values in layers held as separate tensors (no stacked buffer)."""
    return KVCache(k=[t.clone() for t in cache.k], v=[t.clone() for t in cache.v],
                   positions=cache.positions.clone())


@pytest.mark.parametrize("into_stacked,from_stacked", [(True, True), (False, True),
                                                       (True, False), (False, False)])
def test_copy_row_from_copies_one_rows_first_slots_of_every_layer(into_stacked, from_stacked):
    """A newcomer's prefill into a batch row (runtime/row_prefill.py): row 2 of a 4-row cache
    takes the first 6 slots of row 1 of another, K, V and positions in every layer, stacked
    buffers or not; every other row and slot keeps its own."""
    into = _random_cache(8, num_layers=3, batch=4, capacity=12)
    source = _random_cache(9, num_layers=3, batch=2, capacity=12)
    into = into if into_stacked else _layered(into)
    source = source if from_stacked else _layered(source)
    before = [t.clone() for t in into.k + into.v + [into.positions]]
    into.copy_row_from(2, source, 1, 6)
    for now, then, theirs in zip(into.k + into.v + [into.positions], before,
                                 source.k + source.v + [source.positions]):
        want = then.clone()
        want[2, :6] = theirs[1, :6]
        assert torch.equal(now, want) and not torch.equal(now, then)
