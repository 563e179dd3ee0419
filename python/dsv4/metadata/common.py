"""The batch description every builder consumes, builder configuration, and the decode/prefill split.

A step's batch is ordered decodes first. Token ``i`` of request ``r`` (``0 <= i < q_len[r]``) sits at
absolute position ``p = seq_len[r] - q_len[r] + i``; ``seq_len`` counts the context including the
tokens scheduled this step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..constants import COMPRESSED_LOGICAL_BLOCK, SLIDING_WINDOW, SWA_BLOCK_SIZE

DEFAULT_NUM_SMS = 132  # H100/H200: sizes the DeepGEMM logits-schedule buffer [num_sms + 1, 2]
MIB = 1 << 20
DEFAULT_INDEXER_MAX_LOGITS_BYTES = 512 * MIB  # per indexer prefill chunk (vLLM's default budget)


@dataclass(frozen=True)
class AttentionMetadataConfig:
    """What the builders need to know about the model and the scheduler (no engine objects)."""

    max_num_batched_tokens: int
    max_model_len: int
    compress_ratios: tuple[int, ...] = ()  # per layer; decides which tile schedulers exist
    model_version: str = "v4"  # what the ratios mean ("v4.1": 0 window only, 1 and 2 compressed)
    index_topk: int = 512
    num_speculative_tokens: int = 0
    sliding_window: int = SLIDING_WINDOW
    swa_block_size: int = SWA_BLOCK_SIZE
    logical_block_size: int = COMPRESSED_LOGICAL_BLOCK
    max_num_reqs: int | None = None  # defaults to max_num_batched_tokens
    num_sms: int = DEFAULT_NUM_SMS
    indexer_max_logits_bytes: int = DEFAULT_INDEXER_MAX_LOGITS_BYTES
    device: torch.device | str = "cpu"

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_model_len", "index_topk", "sliding_window", "swa_block_size",
                     "logical_block_size", "num_sms", "indexer_max_logits_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"AttentionMetadataConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")

    @property
    def decode_threshold(self) -> int:
        """A request with at most this many query tokens is a decode (1 + speculative tokens)."""
        return 1 + self.num_speculative_tokens

    @property
    def num_request_rows(self) -> int:
        return self.max_num_reqs or self.max_num_batched_tokens


@dataclass
class CommonAttentionMetadata:
    """One KV-cache group's view of a step: request boundaries, lengths, block table, slot mapping.

    ``slot_mapping`` may be longer than ``num_actual_tokens`` (CUDA-graph padding, -1 there).
    """

    query_start_loc: torch.Tensor  # [B + 1] int32
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor  # [B] int32
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor  # [B, max_blocks] int32, this group's table
    slot_mapping: torch.Tensor  # [T_padded] int64, this group's per-token slots (-1 = padding)
    positions: torch.Tensor | None = None  # [T] int64
    is_prefilling: torch.Tensor | None = None  # [B] bool, requests still in their prompt
    token_request_ids: torch.Tensor | None = None  # [T] int64, filled on first use and shared by for_group views

    @property
    def query_lens_cpu(self) -> torch.Tensor:
        return self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]

    def for_group(self, block_table: torch.Tensor, slot_mapping: torch.Tensor) -> CommonAttentionMetadata:
        """The same batch seen through another KV-cache group's block table and slot mapping (moved to the
        batch's device)."""
        device = self.seq_lens.device
        return replace(self, block_table_tensor=block_table.to(device=device, dtype=torch.int32),
                       slot_mapping=slot_mapping.to(device=device, dtype=torch.int64))

    def token_requests(self) -> torch.Tensor:
        """int64 ``[T]`` request index of every actual token."""
        if self.token_request_ids is None:
            reqs = torch.repeat_interleave(torch.arange(self.num_reqs), self.query_lens_cpu.long())
            self.token_request_ids = reqs.to(self.seq_lens.device)
        return self.token_request_ids

    def token_to_req_indices(self, out: torch.Tensor) -> torch.Tensor:
        """:meth:`token_requests` written into ``out`` (a persistent buffer); returns the view."""
        out[: self.num_actual_tokens].copy_(self.token_requests())
        return out[: self.num_actual_tokens]

    def token_positions(self) -> torch.Tensor:
        """int64 ``[T]`` absolute positions (``positions`` when given, else from the lengths)."""
        if self.positions is not None:
            return self.positions[: self.num_actual_tokens].long()
        reqs = self.token_requests().cpu()
        prefix = self.seq_lens_cpu.long() - self.query_lens_cpu.long()
        offsets = torch.arange(self.num_actual_tokens) - self.query_start_loc_cpu.long()[reqs]
        return (prefix[reqs] + offsets).to(self.seq_lens.device)


def make_common_metadata(
    query_lens: list[int] | torch.Tensor,
    seq_lens: list[int] | torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    is_prefilling: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> CommonAttentionMetadata:
    """Builds the metadata of a batch from per-request query and context lengths (decodes first)."""
    q_lens = torch.as_tensor(query_lens, dtype=torch.int32).cpu()
    s_lens = torch.as_tensor(seq_lens, dtype=torch.int32).cpu()
    if q_lens.shape != s_lens.shape or q_lens.dim() != 1:
        raise ValueError(f"query_lens and seq_lens must be 1-D of one length, got {list(q_lens.shape)} "
                         f"and {list(s_lens.shape)}")
    if bool((q_lens < 0).any()) or bool((q_lens > s_lens).any()):
        raise ValueError(f"need 0 <= query_len <= seq_len per request, got query_lens {q_lens.tolist()} "
                         f"and seq_lens {s_lens.tolist()}")
    if block_table.dim() != 2 or block_table.shape[0] != q_lens.numel():
        raise ValueError(f"block_table must be [num_reqs = {q_lens.numel()}, max_blocks], "
                         f"got {list(block_table.shape)}")
    qsl = torch.zeros(q_lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(q_lens, 0, out=qsl[1:])
    num_tokens = int(qsl[-1])
    if slot_mapping.shape[0] < num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=s_lens.to(device),
        seq_lens_cpu=s_lens,
        num_reqs=q_lens.numel(),
        num_actual_tokens=num_tokens,
        max_query_len=int(q_lens.max()) if q_lens.numel() else 0,
        max_seq_len=int(s_lens.max()) if s_lens.numel() else 0,
        block_table_tensor=block_table.to(device=device, dtype=torch.int32),
        slot_mapping=slot_mapping.to(device=device, dtype=torch.int64),
        positions=None if positions is None else positions.to(device=device, dtype=torch.int64),
        is_prefilling=is_prefilling,
    )


@dataclass(frozen=True)
class DecodePrefillSplit:
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int

    def __iter__(self):
        return iter((self.num_decodes, self.num_prefills, self.num_decode_tokens, self.num_prefill_tokens))


def split_decodes_and_prefills(
    cm: CommonAttentionMetadata,
    decode_threshold: int = 1,
    require_uniform: bool = False,
    treat_short_extends_as_decodes: bool = True,
) -> DecodePrefillSplit:
    """Splits the (decodes-first) batch into ``(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)``.

    A request is a decode when its query has at most ``decode_threshold`` tokens; with
    ``require_uniform`` every decode must have the first request's query length (requests with 0
    tokens are padding and count as decodes); without ``treat_short_extends_as_decodes`` a short
    query of a request still in its prompt (``is_prefilling``) is a prefill. ValueError when a
    decode follows a prefill.
    """
    num_reqs, num_tokens = cm.num_reqs, cm.num_actual_tokens
    all_decode = DecodePrefillSplit(num_reqs, 0, num_tokens, 0)
    if num_reqs == 0:
        return all_decode
    q_lens = cm.query_lens_cpu
    short_ok = treat_short_extends_as_decodes or cm.is_prefilling is None
    if cm.max_query_len <= decode_threshold and short_ok and (not require_uniform or decode_threshold <= 1):
        return all_decode
    if int(q_lens[0]) > decode_threshold:
        return DecodePrefillSplit(0, num_reqs, 0, num_tokens)
    if require_uniform:
        if short_ok and bool(((q_lens == q_lens[0]) | (q_lens == 0)).all()):
            return all_decode
        is_prefill = q_lens != q_lens[0]
    else:
        is_prefill = q_lens > decode_threshold
    if not short_ok:
        is_prefill = is_prefill | cm.is_prefilling.cpu()
    if not bool(is_prefill.any()):
        return all_decode
    first_prefill = int(is_prefill.int().argmax())
    if not bool(is_prefill[first_prefill:].all()):
        raise ValueError(f"batch must be ordered decodes first; query lengths {q_lens.tolist()} "
                         f"(decode threshold {decode_threshold})")
    num_decode_tokens = int(cm.query_start_loc_cpu[first_prefill])
    return DecodePrefillSplit(first_prefill, num_reqs - first_prefill, num_decode_tokens,
                              num_tokens - num_decode_tokens)


def check_capacity(builder: str, num_tokens: int, capacity: int) -> None:
    """Builders write into buffers sized by max_num_batched_tokens: refuse larger steps."""
    if num_tokens > capacity:
        raise ValueError(f"{builder}: step has {num_tokens} tokens, buffers hold max_num_batched_tokens = {capacity}")
