"""Eager PyTorch versions of the Triton kernels that vLLM's DeepSeek-V4 metadata builders launch.

vLLM's CPU path expects triton-cpu, which is not on PyPI; without it the first step fails. Each function
here computes what one kernel computes, for every row its launch grid covers, with the launcher's (or the
kernel's) own argument names, so :func:`install` can put it in the kernel's place. The window and
compressed slots go through dsv4's block-table mapping (``ops.map_local_to_global_slots``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from ... import ops


def _request_of_tokens(query_start_loc: torch.Tensor, tokens: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """int64 request index of each token: how many requests end at or before it, clamped to the last."""
    ends = query_start_loc[1 : num_reqs + 1].long()
    return torch.searchsorted(ends, tokens.long(), right=True).clamp(max=max(num_reqs - 1, 0))


def _positions(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, reqs: torch.Tensor, tokens: torch.Tensor
               ) -> torch.Tensor:
    """int64 position of each token in its request: the context before the request's queries plus its offset."""
    qsl = query_start_loc.long()
    return seq_lens.long()[reqs] - (qsl[reqs + 1] - qsl[reqs]) + tokens - qsl[reqs]


def _block_slots(local: torch.Tensor, req_ids: torch.Tensor, block_table: torch.Tensor, block_size: int
                 ) -> torch.Tensor:
    """Global slots of request-local positions ``[rows, cols]`` (negative stays -1)."""
    return ops.map_local_to_global_slots(local.long(), req_ids.long(), block_table, block_size)


def token_request_mapping(query_start_loc, output, num_reqs, num_mapped, num_tokens, **launch_options):
    """``_token_request_mapping_kernel``: the request of each of the first num_mapped tokens, 0 after."""
    tokens = torch.arange(num_tokens, device=output.device)
    reqs = _request_of_tokens(query_start_loc, tokens, num_reqs)
    output[:num_tokens].copy_(torch.where(tokens < num_mapped, reqs, 0))


def indexer_decode_metadata(query_start_loc, seq_lens, block_table, output_seq_lens, output_block_table, decode_lens,
                            indices, per_req_lens, num_reqs, num_tokens, capacity, input_stride, output_stride,
                            BLOCK_COLS, **launch_options):  # noqa: N803 (the kernel's name)
    """``_indexer_decode_metadata_kernel``: one indexer row per decode token, the tail of the lengths zeroed."""
    tokens = torch.arange(num_tokens, device=output_seq_lens.device)
    qsl = query_start_loc.long()
    reqs = _request_of_tokens(query_start_loc, tokens, num_reqs)
    actual = int(qsl[num_reqs])
    valid = tokens < actual
    lengths = _positions(query_start_loc, seq_lens, reqs, tokens) + 1
    output_seq_lens[:num_tokens].copy_(torch.where(valid, lengths, 0))
    output_seq_lens[num_tokens:capacity].zero_()
    decode_lens[:num_tokens].fill_(1)
    indices[:num_tokens].copy_(torch.where(valid, reqs, num_reqs + tokens - actual))
    rows = torch.where(valid[:, None], block_table[reqs, :BLOCK_COLS], 0)
    output_block_table[:num_tokens, :BLOCK_COLS].copy_(rows)
    per_req_lens[:num_reqs].copy_(qsl[1 : num_reqs + 1] - qsl[:num_reqs])


def prefill_gather_lens(prefill_gather_lens, seq_lens, query_start_loc, replay_start, num_prefills, num_decodes,
                        window_size):
    """``ComputePrefillMetadataKernel``: rows to gather per prefill (its queries plus the visible window)."""
    rows = slice(num_decodes, num_decodes + num_prefills)
    qsl = query_start_loc.long()
    query_len = qsl[num_decodes + 1 : num_decodes + num_prefills + 1] - qsl[rows]
    visible_prefix = (seq_lens.long()[rows] - query_len - replay_start.long()[rows]).clamp(min=0)
    prefill_gather_lens[:num_prefills].copy_(query_len + visible_prefix.clamp(max=window_size - 1))


def swa_indices_and_lens(swa_indices, swa_lens, window_size, index_width, left_visible, right_visible,
                         query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table, block_size,
                         replay_start, *, num_tokens, token_offset, has_image=False):
    """``ComputeSWAIndicesAndLensKernel``: each token's window slots (-1 after its length) and length."""
    if num_tokens == 0:
        return
    tokens = torch.arange(token_offset, token_offset + num_tokens, device=swa_lens.device)
    valid = is_valid_token[tokens]
    reqs = token_to_req_indices[tokens].long()
    pos = _positions(query_start_loc, seq_lens, reqs, tokens)
    left = left_visible.long()[tokens] if has_image else torch.zeros_like(pos)
    right = right_visible.long()[tokens] if has_image else torch.zeros_like(pos)
    start = (pos - (window_size - 1) - (left - (window_size - 1)).clamp(min=0)).clamp(min=0)
    start = torch.maximum(start, replay_start.long()[reqs])  # no window KV below a request's replay start
    lens = torch.where(valid, pos + right + 1 - start, 0)
    offsets = torch.arange(index_width, device=swa_lens.device)
    local = torch.where(offsets < lens[:, None], start[:, None] + offsets, -1)
    rows = swa_indices.view(swa_indices.shape[0], -1)
    rows[:num_tokens, :index_width].copy_(_block_slots(local, reqs, block_table, block_size))
    swa_lens[:num_tokens].copy_(lens)


def compressed_slot_mapping(compressed_slot_mapping, slot_mapping, query_start_loc, seq_lens, block_table, block_size,
                            compress_ratio, dcp_world_size, cp_interleave):
    """``CompressedSlotMappingKernel``: the slot of the compressed state each token completes, else -1."""
    num_reqs = min(block_table.shape[0], query_start_loc.numel() - 1)
    qsl = query_start_loc.long()
    num_tokens = int(qsl[num_reqs])
    if num_tokens == 0:
        return
    tokens = torch.arange(num_tokens, device=slot_mapping.device)
    reqs = _request_of_tokens(query_start_loc, tokens, num_reqs)
    pos = _positions(query_start_loc, seq_lens, reqs, tokens)
    valid = ((pos + 1) % compress_ratio == 0) & (slot_mapping[:num_tokens] != -1)
    local_pos = pos // (cp_interleave * dcp_world_size) * cp_interleave + pos % cp_interleave
    local = torch.where(valid, local_pos // compress_ratio, -1)
    compressed_slot_mapping[:num_tokens].copy_(_block_slots(local[:, None], reqs, block_table, block_size)[:, 0])


def prefill_chunk_metadata(query_start_loc, uncompressed_seq_lens, cu_compressed_seq_lens,
                           row_start_cu_compressed_seq_lens, token_to_seq, cu_compressed_seq_len_ks,
                           cu_compressed_seq_len_ke, query_slice_start, query_slice_stop, DCP_RANK, DCP_WORLD,  # noqa: N803
                           DCP_INTERLEAVE, *, num_reqs, COMPRESS_RATIO):  # noqa: N803 (the kernel's names)
    """``BuildPrefillChunkMetadataKernel``: per query its K row range in the gathered compressed keys, and
    the request of every gathered key."""
    if num_reqs == 0:
        return
    qsl = query_start_loc.long()[: num_reqs + 1]
    tokens = torch.arange(int(qsl[0]), int(qsl[num_reqs]), device=token_to_seq.device)
    reqs = _request_of_tokens(query_start_loc, tokens, num_reqs)
    per_token = (_positions(query_start_loc, uncompressed_seq_lens, reqs, tokens) + 1) // COMPRESS_RATIO
    if DCP_WORLD > 1:  # this rank's share of an interleaved context
        base = per_token // DCP_INTERLEAVE // DCP_WORLD * DCP_INTERLEAVE
        rest = (per_token - base * DCP_WORLD - DCP_RANK * DCP_INTERLEAVE).clamp(min=0, max=DCP_INTERLEAVE)
        per_token = base + rest
    row_start = row_start_cu_compressed_seq_lens.long()[reqs]
    keep = (tokens >= query_slice_start) & (tokens < query_slice_stop)
    out_pos = tokens[keep] - query_slice_start
    cu_compressed_seq_len_ks[out_pos] = row_start[keep].to(cu_compressed_seq_len_ks.dtype)
    cu_compressed_seq_len_ke[out_pos] = (row_start + per_token)[keep].to(cu_compressed_seq_len_ke.dtype)
    cu = cu_compressed_seq_lens.long()[: num_reqs + 1]
    keys = torch.arange(int(cu[0]), int(cu[num_reqs]), device=token_to_seq.device)
    token_to_seq[keys] = (torch.searchsorted(cu[1:], keys, right=True)).to(token_to_seq.dtype)


def uniform_decode(seq_lens, decode_seq_lens, block_table, expanded_block_table, decode_lens, num_decode_tokens,
                   max_decode_len):
    """``PrepareUniformDecodeKernel``: every request's next_n decode tokens as rows of one token each."""
    rows = torch.arange(num_decode_tokens, device=decode_seq_lens.device)
    reqs, local = rows // max_decode_len, rows % max_decode_len
    decode_seq_lens[:num_decode_tokens].copy_((seq_lens.long()[reqs] - max_decode_len + local + 1).clamp(min=0))
    width = min(block_table.shape[1], expanded_block_table.shape[1])
    expanded_block_table[:num_decode_tokens, :width].copy_(block_table[reqs, :width])
    decode_lens[:num_decode_tokens].fill_(1)


class EagerLauncher:
    """Stands in for one of vLLM's Triton launcher objects: called like it, warm-up registration a no-op."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self.__name__ = fn.__name__

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def register_warmup(self, *args, **kwargs) -> None:
        return None


# Raw Triton kernels (their launch arguments name all the work): replaced through vLLM's kernel dispatcher.
KERNELS: dict[str, Callable[..., None]] = {
    "vllm.v1.attention.ops.metadata._token_request_mapping_kernel": token_request_mapping,
    "vllm.v1.attention.ops.metadata._indexer_decode_metadata_kernel": indexer_decode_metadata,
}

# Launcher objects (their grid is an argument of the launcher, not of the kernel): the module attribute is rebound.
LAUNCHERS: dict[str, Callable[..., None]] = {
    "vllm.v1.attention.backends.mla.sparse_swa._COMPUTE_PREFILL_METADATA_KERNEL": prefill_gather_lens,
    "vllm.v1.attention.backends.mla.sparse_swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL": swa_indices_and_lens,
    "vllm.v1.attention.backends.mla.compressor_utils._COMPRESSED_SLOT_MAPPING_KERNEL": compressed_slot_mapping,
    "vllm.v1.attention.backends.mla.indexer._BUILD_PREFILL_CHUNK_METADATA_KERNEL": prefill_chunk_metadata,
    "vllm.v1.attention.backends.mla.indexer._PREPARE_UNIFORM_DECODE_KERNEL": uniform_decode,
}


def install() -> list[str]:
    """Puts every eager version in place of its kernel; returns the qualified names replaced."""
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels(dict(KERNELS))
    for qualified, fn in LAUNCHERS.items():
        module_name, attr = qualified.rsplit(".", 1)
        module = importlib.import_module(module_name)
        if not isinstance(getattr(module, attr), EagerLauncher):
            setattr(module, attr, EagerLauncher(fn))
    return [*KERNELS, *LAUNCHERS]
