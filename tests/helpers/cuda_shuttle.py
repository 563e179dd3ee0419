"""Runs the CPU test grids on CUDA: every public function of ``dsv4.ops`` is wrapped so that its tensor
arguments are copied to the GPU with the same shape, strides, storage offset and every byte of storage (padding
included, aliasing views kept aliased), the op runs there, the GPU storage is copied back into the CPU tensors
(so in-place writes and untouched bytes are checked exactly as on the CPU) and returned tensors come back to the
CPU. References, inputs and tolerances stay those of the CPU test."""

from __future__ import annotations

import functools
import inspect

import torch

from dsv4 import ops

DEVICE = torch.device("cuda")


class GpuTwins:
    """GPU twins of CPU tensors, one GPU storage per CPU storage."""

    def __init__(self) -> None:
        self.storages: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # cpu storage ptr -> (cpu bytes, gpu bytes)
        self.originals: dict[int, torch.Tensor] = {}  # id of a GPU twin -> its CPU tensor

    def to_gpu(self, value):
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            storage = value.untyped_storage()
            key = storage.data_ptr()
            if key not in self.storages:
                cpu_bytes = torch.empty(0, dtype=torch.uint8).set_(storage)
                self.storages[key] = (cpu_bytes, cpu_bytes.to(DEVICE))
            gpu_bytes = self.storages[key][1]
            typed = torch.empty(0, dtype=value.dtype, device=DEVICE).set_(gpu_bytes.untyped_storage())
            twin = typed.as_strided(value.shape, value.stride(), value.storage_offset())
            self.originals[id(twin)] = value
            return twin
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_gpu(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_gpu(v) for k, v in value.items()}
        return value

    def copy_back(self) -> None:
        for cpu_bytes, gpu_bytes in self.storages.values():
            cpu_bytes.copy_(gpu_bytes)

    def to_cpu(self, value):
        """A returned argument (an ``out=`` buffer) comes back as the caller's CPU tensor itself."""
        if isinstance(value, torch.Tensor):
            return self.originals.get(id(value), value.cpu())
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_cpu(v) for v in value)
        return value


def _on_cuda(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        shuttle = GpuTwins()
        gpu_args, gpu_kwargs = shuttle.to_gpu(args), shuttle.to_gpu(kwargs)
        try:
            result = fn(*gpu_args, **gpu_kwargs)
            torch.cuda.synchronize()
        finally:
            shuttle.copy_back()
        return shuttle.to_cpu(result)

    return run


def run_ops_on_cuda(monkeypatch) -> None:
    """For one test: route every dsv4.ops wrapper through the GPU."""
    for name, fn in inspect.getmembers(ops, inspect.isfunction):
        if fn.__module__ == ops.__name__ and not name.startswith("_"):
            monkeypatch.setattr(ops, name, _on_cuda(fn))
