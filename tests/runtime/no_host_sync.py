"""A guard for code that runs inside a captured CUDA graph, checkable on CPU: any operation that
hands a tensor's value to the host (.item(), bool(t), int(t), indexing with a 0-dim tensor)
dispatches to one of the ops below, and a capture fails on it with 'operation not permitted when
stream is capturing'. Under `no_host_sync()` the same code raises on CPU instead."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
              torch.ops.aten.equal.default}


class HostSync(AssertionError):
    pass


class no_host_sync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            raise HostSync(f"{func} reads a tensor on the host inside a captured region")
        return func(*args, **(kwargs or {}))


def guard_rounds(decoder) -> None:
    """Run every round `decoder._runner` hands out (what capture would record) under
    no_host_sync; the host loop around the rounds may still read tensors."""
    runner = decoder._runner

    def guarded(*args, **kwargs):
        body = runner(*args, **kwargs)

        def run():
            with no_host_sync():
                body()
        return run
    decoder._runner = guarded
