"""On a ROCm torch, dsv4 ops without a HIP kernel run their pure-PyTorch reference, with a one-time warning each.

ROCm tensors dispatch through the CUDA key, so the fallbacks are registered there, only for ops that have no kernel
for it (``dsv4._C_cuda`` built for ROCm registers the hipified portable tier first). The references build their
intermediates on the CPU, so a fallback runs on CPU copies of its arguments and copies written arguments and
results back to the device: slow, but exactly the specification.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._pytree import tree_map

from .reference import OP_IMPLS

_LIBRARIES: list[torch.library.Library] = []  # keeps the Python registrations alive


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of the first tensor argument that is not on the CPU, if any."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.device
    return None


def _on_cpu(impl, written: tuple[tuple[int, str], ...]):
    """impl run on CPU copies of the arguments; written (positional) arguments and results go back to the device."""

    def run(*args, **kwargs):
        device = _device_of(args, kwargs)
        if device is None:
            return impl(*args, **kwargs)
        cpu_args, cpu_kwargs = tree_map(lambda v: v.cpu() if isinstance(v, torch.Tensor) else v, (args, kwargs))
        result = impl(*cpu_args, **cpu_kwargs)
        for i, name in written:
            dst, src = (args[i], cpu_args[i]) if i < len(args) else (kwargs.get(name), cpu_kwargs.get(name))
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, result)

    return run


def _warning_once(qualified_name: str, impl):
    """impl behind a warning issued on the first call only."""
    warned = False

    def fallback(*args, **kwargs):
        nonlocal warned
        if not warned:
            warned = True
            warnings.warn(
                f"{qualified_name} has no ROCm kernel in this build: running its pure-PyTorch reference (slow)",
                RuntimeWarning,
                stacklevel=2,
            )
        return impl(*args, **kwargs)

    return fallback


def register_reference_fallbacks(namespace: str = "dsv4", dispatch_key: str = "CUDA") -> frozenset[str]:
    """On a ROCm torch, registers the reference of every op of OP_IMPLS that has no ``dispatch_key`` kernel.

    Returns the names of the ops now backed by their reference (empty on a CUDA or CPU-only torch).
    """
    if torch.version.hip is None:
        return frozenset()
    ops = getattr(torch.ops, namespace)
    missing = sorted(
        name
        for name in OP_IMPLS
        if hasattr(ops, name)
        and not torch._C._dispatch_has_kernel_for_dispatch_key(f"{namespace}::{name}", dispatch_key)
    )
    lib = torch.library.Library(namespace, "IMPL")
    for name in missing:
        schema = getattr(ops, name).default._schema
        written = tuple((i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info and a.alias_info.is_write)
        lib.impl(name, _warning_once(f"{namespace}::{name}", _on_cpu(OP_IMPLS[name], written)), dispatch_key)
    _LIBRARIES.append(lib)
    return frozenset(missing)
