"""dsv4 as a vLLM plugin: vLLM's DeepSeek-V4 CPU path served by dsv4.

Installed with dsv4 and found by vLLM through the ``vllm.general_plugins`` entry point ``dsv4``; vLLM calls
:func:`register` in each of its processes. ``DSV4_VLLM`` chooses what is taken over:

- ``off``: nothing;
- ``metadata``: vLLM's DeepSeek-V4 metadata Triton kernels run as eager PyTorch (no triton-cpu needed)
  and the sliding-window builder's tile-scheduler keys are fixed: vLLM's own kernels then run;
- ``kernels`` (the default): ``metadata`` plus the nine ``torch.ops._C.*_cpu`` DeepSeek-V4 kernels;
- ``full``: ``kernels`` plus the CPU lightning indexer on dsv4's fused top-k (any index top-k, e.g.
  DeepSeek-V4-Pro's 1024; no dense prefill logits).

Nothing happens off the CPU platform, or on a vLLM outside :data:`TESTED_VLLM` (one warning). Calling
:func:`register` again does nothing more; what was taken over is logged once.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from enum import Enum

ENV_VAR = "DSV4_VLLM"
TESTED_VLLM = ((0, 32), (0, 33))  # [low, high): the releases whose code paths this plugin was tested on


def _log(level: int, message: str, *args) -> None:
    """Through vLLM's logger when it is set up; vLLM loads plugins before that, so else on stderr."""
    logger = logging.getLogger("vllm.dsv4")
    if logger.hasHandlers():
        logger.log(level, message, *args)
    elif level >= logging.INFO:
        print(f"{logging.getLevelName(level)} {message % args}", file=sys.stderr)


class Mode(str, Enum):
    OFF = "off"
    METADATA = "metadata"
    KERNELS = "kernels"
    FULL = "full"


def mode_from_env() -> Mode:
    """The mode ``DSV4_VLLM`` names (unset or empty: ``kernels``); a ValueError lists the accepted values."""
    value = os.environ.get(ENV_VAR, "").strip().lower() or Mode.KERNELS.value
    try:
        return Mode(value)
    except ValueError:
        raise ValueError(f"{ENV_VAR}={value!r}: expected one of {', '.join(m.value for m in Mode)}") from None


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def tested(version: str) -> bool:
    """Whether a vLLM version string is inside :data:`TESTED_VLLM`."""
    release = _release(version)
    return release is not None and TESTED_VLLM[0] <= release < TESTED_VLLM[1]


_taken_over: list[str] | None = None  # what register() installed in this process (None: not yet)


def taken_over() -> list[str]:
    """The names of what :func:`register` replaced in this process (empty if nothing)."""
    return list(_taken_over or [])


def register() -> None:
    """The ``vllm.general_plugins`` entry point; idempotent."""
    global _taken_over
    if _taken_over is not None:
        return
    mode = mode_from_env()  # a bad value raises here, naming the accepted ones
    _taken_over = []
    if mode is Mode.OFF:
        return
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError:
        return
    if not tested(vllm.__version__):
        lo, hi = (".".join(map(str, r)) for r in TESTED_VLLM)
        _log(logging.WARNING, "dsv4: vLLM %s is outside the tested range [%s, %s); leaving vLLM untouched",
             vllm.__version__, lo, hi)
        return
    if not current_platform.is_cpu():
        return
    _taken_over = _install(mode, current_platform)
    _log(logging.INFO, "dsv4 %s (%s=%s) took over: %s", _dsv4_version(), ENV_VAR, mode.value,
         ", ".join(name.rsplit(".", 1)[-1] for name in _taken_over))


def _install(mode: Mode, platform) -> list[str]:
    from . import indexer, kernels, metadata_kernels, tile_scheduler_fix

    installed = [*metadata_kernels.install(), *tile_scheduler_fix.install()]
    if mode in (Mode.KERNELS, Mode.FULL):
        platform.import_kernels()  # vLLM's _C defines the ops; its CPU kernels must load before ours replace them
        installed += [f"_C.{name}" for name in kernels.install()]
    if mode is Mode.FULL:
        installed += indexer.install()
    return installed


def _dsv4_version() -> str:
    from ..._version import __version__

    return __version__
