"""A CPU stand-in for a second device: catch host tensors mixed into model-device ops.

On a CUDA machine, `torch.where(cuda_mask, cuda_x, torch.zeros(n))` fails ("Expected all tensors
to be on the same device"); on the CPU every tensor lives on one device, so the bug passes
unseen. `DeviceProvenance` is a TorchFunctionMode that tags every tensor, while the models still
sit on the CPU, with where it would live on a GPU:

  * device: tensors that existed before the mode started (the models' weights), tensors made
    with an explicit `device=`, `.to(device)` / `.to(tensor)` copies, and every result computed
    from a device tensor;
  * host: tensors made without `device=` (torch.tensor(list), arange, zeros, ...) or with
    `device=` a host tensor's own `.device` or "cpu", `.cpu()` copies, and results computed
    only from host tensors.

An op that takes a host tensor and a device tensor (0-dim host scalars excepted, as CUDA
allows them) raises `CrossDeviceError`, as the GPU would; so does indexing a device tensor
with a host index tensor (legal, but a hidden copy each time). `.to`, `.cuda`, `.cpu` and
`copy_` are the explicit transfers and may mix.
"""
from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

HOST, DEVICE = "host", "device"
_TAG = "_device_provenance"
_TRANSFERS = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.copy_}
_DEVICE_GETTER = torch.Tensor.device.__get__   # compares equal (not identical) to the mode's func


class CrossDeviceError(RuntimeError):
    """A host tensor met a device tensor in one op."""


def tag_of(t: torch.Tensor) -> str:
    return getattr(t, _TAG, DEVICE)


def _where_in_runtime() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "/runtime/" in f.filename
              and "device_provenance" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


class DeviceProvenance(TorchFunctionMode):
    """Tags tensors host or device and raises CrossDeviceError where a GPU would (see the
    module docstring); `ops` counts the torch calls it saw."""

    def __init__(self):
        super().__init__()
        # torch.device objects read off host tensors, by id (held, so ids stay unique):
        # `device=` with one of these means host.
        self._host_devices = {}
        self.ops = 0

    def _device_arg_tag(self, device) -> str:
        if isinstance(device, torch.Tensor):
            return tag_of(device)
        if isinstance(device, str) and device.startswith("cpu"):
            return HOST
        return HOST if self._host_devices.get(id(device)) is device else DEVICE

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func not in _TRANSFERS:
            self._check_mix(func, tensors)
        out = func(*args, **kwargs)
        if func == _DEVICE_GETTER:
            if tag_of(args[0]) == HOST:
                self._host_devices[id(out)] = out
            return out
        tag = self._result_tag(func, args, kwargs, tensors)
        if isinstance(out, torch.Tensor) and any(out is t for t in tensors) and tag_of(out) != tag:
            # A same-device `.to(...)` returns its input: on a GPU it would be a new tensor.
            out = out.clone()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                setattr(t, _TAG, tag)
        return out

    def _check_mix(self, func, tensors):
        sized = {tag_of(t) for t in tensors if t.dim() > 0}
        if len(sized) > 1:
            name = getattr(func, "__qualname__", repr(func))
            raise CrossDeviceError(f"{name} at {_where_in_runtime()} mixes host and device "
                                   f"tensors (shapes {[tuple(t.shape) for t in tensors]}, tags "
                                   f"{[tag_of(t) for t in tensors]})")

    def _result_tag(self, func, args, kwargs, tensors) -> str:
        if func is torch.Tensor.cpu:
            return HOST
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            targets = [a for a in args[1:] if not isinstance(a, torch.dtype)]
            targets += [kwargs[k] for k in ("device", "other") if kwargs.get(k) is not None]
            if func is torch.Tensor.cuda:
                return DEVICE
            return self._device_arg_tag(targets[0]) if targets else tag_of(args[0])
        if kwargs.get("device") is not None:
            return self._device_arg_tag(kwargs["device"])
        if not tensors:
            return HOST
        return DEVICE if any(tag_of(t) == DEVICE for t in tensors) else HOST
