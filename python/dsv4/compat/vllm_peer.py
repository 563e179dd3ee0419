"""Locates and loads vLLM's CPU kernel library, the peer that tests and benchmarks compare against.

The library comes from ``tools/check/fetch_vllm_peer.sh`` (``<repo>/.peer/vllm/_C.abi3.so``) or from
the path in ``$DSV4_VLLM_PEER``. Loading registers vLLM's ops under ``torch.ops._C``. Whether this CPU can run
vLLM's kernels is found out by running them: a child process loads the library and calls every op once on small
inputs (:func:`probe_calls`); only if it exits cleanly is the library loaded here (an unsupported instruction
would kill the process that runs it).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from . import vllm_cpu

PEER_ENV = "DSV4_VLLM_PEER"
# tools/check/fetch_vllm_peer.sh puts it here in a source checkout (editable installs find it too).
DEFAULT_PEER = Path(__file__).resolve().parents[3] / ".peer" / "vllm" / "_C.abi3.so"

PROBE_TIMEOUT_S = 300
CPU_CANNOT_RUN = "calling vLLM's kernels on this CPU killed the process"  # how a failed probe by a signal reads

PEER_OPS = vllm_cpu.OPS


def peer_path() -> Path:
    """Where the peer library is looked for."""
    return Path(os.environ.get(PEER_ENV) or DEFAULT_PEER)


def probe_calls(m) -> None:
    """Calls each of PEER_OPS once on small valid inputs, through ``m`` (``torch.ops._C`` or
    :mod:`dsv4.compat.vllm_cpu`, which take the same arguments)."""
    from .. import cache
    from ..rope import rope_cos_sin_cache

    tokens, heads, block = 4, 16, 64
    rope = rope_cos_sin_cache(64, 64, 10000.0)
    positions = torch.arange(tokens)
    slots = torch.arange(tokens)
    swa = cache.allocate_kv_cache(1, block)
    m.fused_qnorm_rope_kv_insert_cpu(torch.randn(tokens, heads, 512).bfloat16(), torch.randn(tokens, 512).bfloat16(),
                                     positions, swa, slots, rope, heads, 1e-6, block)
    iq_fp8 = torch.empty(tokens, 64, 128, dtype=torch.float8_e4m3fn)
    iw_out = torch.empty(tokens, 64)
    m.fused_indexer_q_rope_quant_cpu(positions, torch.randn(tokens, 64, 128), rope, iq_fp8, torch.randn(tokens, 64),
                                     128**-0.5, 0.125, iw_out)
    for dim, store in ((512, swa), (128, cache.allocate_indexer_k_cache(1, block))):
        state = cache.allocate_compressor_state(2, 4, dim, 4).normal_()
        m.save_partial_states_cpu(torch.randn(tokens, 2 * dim), torch.randn(tokens, 2 * dim), torch.randn(4, 2 * dim),
                                  positions, state, slots)
        compress = m.compress_norm_rope_store_cpu if dim == 512 else m.compress_norm_rope_store_indexer_cpu
        compress(state, torch.arange(8).repeat(tokens, 1), positions * 4 + 3, slots, torch.rand(dim) + 0.5, 1e-6, rope,
                 store, block, 4)
    m.inverse_gptj_rope_o_proj_cpu(torch.randn(tokens, heads, 512).bfloat16(), positions, rope, 64)
    k_cache = cache.allocate_indexer_k_cache(1, block)
    k_cache.view(-1)[:] = torch.randint(0, 120, (k_cache.numel(),), dtype=torch.uint8)
    m.fp8_paged_mqa_logits_cpu(iq_fp8, k_cache, iw_out, torch.full((tokens,), block, dtype=torch.int32),
                               torch.zeros(tokens, 1, dtype=torch.int32), block, block)
    out_slots = torch.empty(tokens, 512, dtype=torch.int32)
    m.topk_transform_512_cpu(torch.randn(tokens, 1024), torch.full((tokens,), 1024, dtype=torch.int32),
                             torch.arange(16, dtype=torch.int32).repeat(tokens, 1), out_slots, block,
                             torch.empty_like(out_slots))
    window = torch.arange(tokens).repeat(tokens, 1)
    m.flash_mla_with_kvcache_cpu(torch.empty(tokens, heads, 512, dtype=torch.bfloat16),
                                 torch.randn(tokens, heads, 512).bfloat16(), swa, window, block, swa, window.clone(),
                                 block, torch.zeros(heads), 512**-0.5)


def _probe(path: Path) -> str:
    """Empty when a child process loads the library at path and runs :func:`probe_calls` on it, else why not."""
    code = ("import sys, torch, dsv4; from dsv4.compat import vllm_peer; torch.ops.load_library(sys.argv[1]); "
            "vllm_peer.probe_calls(torch.ops._C)")
    try:
        result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"calling vLLM's kernels did not finish in {PROBE_TIMEOUT_S} s"
    if result.returncode < 0:
        return f"{CPU_CANNOT_RUN} ({signal.Signals(-result.returncode).name})"
    if result.returncode > 0:
        last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        return f"calling vLLM's kernels failed: {last}"
    return ""


def _load() -> tuple[object | None, str]:
    path = peer_path()
    if not path.is_file():
        return None, f"{path} not found (run tools/check/fetch_vllm_peer.sh or set ${PEER_ENV})"
    failed = _probe(path)
    if failed:
        return None, failed
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
