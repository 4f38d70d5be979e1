"""KVCache.view (runtime/kv_cache.py): a view of some rows and slots whose writes land in the
cache, and whose reads are the cache's own entries, checked element by element against
indexing the full tensors by hand."""
import torch

from specpilot.runtime.kv_cache import KVCache


def _random_cache(seed):
    cache = KVCache.allocate(num_layers=2, batch=3, capacity=10, num_kv_heads=2, head_dim=4,
                             dtype=torch.float32)
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
