"""Locates and loads vLLM's CPU kernel library, the peer that tests and benchmarks compare against.

The library comes from ``tools/check/fetch_vllm_peer.sh`` (``<repo>/.peer/vllm/_C.abi3.so``) or from
the path in ``$DSV4_VLLM_PEER``. Loading registers vLLM's ops under ``torch.ops._C``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

PEER_ENV = "DSV4_VLLM_PEER"
# tools/check/fetch_vllm_peer.sh puts it here in a source checkout (editable installs find it too).
DEFAULT_PEER = Path(__file__).resolve().parents[3] / ".peer" / "vllm" / "_C.abi3.so"

# vLLM compiles its DSv4 kernels for AVX-512 BF16/VNNI + AMX only; elsewhere calling them would crash.
REQUIRED_CPU_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")

PEER_OPS = (
    "fused_qnorm_rope_kv_insert_cpu",
    "fused_indexer_q_rope_quant_cpu",
    "save_partial_states_cpu",
    "compress_norm_rope_store_cpu",
    "compress_norm_rope_store_indexer_cpu",
    "inverse_gptj_rope_o_proj_cpu",
    "fp8_paged_mqa_logits_cpu",
    "topk_transform_512_cpu",
    "flash_mla_with_kvcache_cpu",
)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def peer_path() -> Path:
    """Where the peer library is looked for."""
    return Path(os.environ.get(PEER_ENV) or DEFAULT_PEER)


def missing_cpu_flags() -> list[str]:
    """The CPU features vLLM's DSv4 kernels need that this CPU lacks (empty: it can run them)."""
    return [flag for flag in REQUIRED_CPU_FLAGS if flag not in _cpu_flags()]


def _load() -> tuple[object | None, str]:
    path = peer_path()
    if not path.is_file():
        return None, f"{path} not found (run tools/check/fetch_vllm_peer.sh or set ${PEER_ENV})"
    missing_flags = missing_cpu_flags()
    if missing_flags:
        return None, f"this CPU lacks {', '.join(missing_flags)}, which vLLM's DSv4 CPU kernels need"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:  # missing libnuma, glibc/libstdc++ too old, torch ABI mismatch
        return None, f"{path} could not be loaded: {exc}"
    missing_ops = [name for name in PEER_OPS if not hasattr(torch.ops._C, name)]
    if missing_ops:
        return None, f"{path} lacks the ops {', '.join(missing_ops)}"
    return torch.ops._C, ""


@functools.cache
def load_peer_reason() -> tuple[object | None, str]:
    """(``torch.ops._C`` with vLLM's ops, "") or (None, why not); prints the reason once."""
    peer, reason = _load()
    if peer is None:
        print(f"vLLM peer unavailable: {reason}")
    return peer, reason


def load_peer():
    """``torch.ops._C`` with vLLM's CPU ops, or None when the peer is absent or unloadable."""
    return load_peer_reason()[0]
