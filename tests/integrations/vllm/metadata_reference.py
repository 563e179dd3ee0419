"""Runs vLLM's own DeepSeek-V4 metadata Triton kernels (through Triton's interpreter, on the CPU) and dsv4's
eager versions on the same random batches, and prints one JSON line per kernel: cases run, mismatches.

A separate process: Triton must be put in place of vLLM's placeholders before vLLM's kernel modules load.
Outputs are poisoned before each run so an unwritten element shows.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import vllm.triton_utils as triton_utils  # noqa: E402

triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = triton, tl, True

from vllm.v1.attention.backends.mla import compressor_utils, indexer, sparse_swa  # noqa: E402
from vllm.v1.attention.ops import metadata  # noqa: E402

from dsv4.integrations.vllm import metadata_kernels as eager  # noqa: E402

POISON = -7777
BLOCK = 64


def batch(g: torch.Generator, num_decodes: int, num_prefills: int, max_prefill: int = 300):
    """query_start_loc, seq_lens, block_table (a random permutation of pages) for decodes first."""
    num_prefills = max(num_prefills, 1 - num_decodes)  # at least one request
    qlens = [1] * num_decodes + [int(torch.randint(0, max_prefill, (1,), generator=g)) for _ in range(num_prefills)]
    prefix = [int(torch.randint(0, 900, (1,), generator=g)) for _ in qlens]
    seq_lens = torch.tensor([p + q for p, q in zip(prefix, qlens, strict=True)], dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    pages = (int(seq_lens.max()) + BLOCK - 1) // BLOCK + 2
    block_table = torch.stack([torch.randperm(4 * pages, generator=g)[:pages] for _ in qlens]).to(torch.int32)
    return qsl, seq_lens, block_table


def poisoned(*shape, dtype=torch.int32):
    return torch.full(shape, POISON, dtype=dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def check_token_request(g) -> int:
    bad = 0
    for _ in range(20):
        qsl, _, _ = batch(g, int(torch.randint(0, 5, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g)))
        tokens = int(qsl[-1])
        num_tokens = tokens + int(torch.randint(0, 6, (1,), generator=g))
        want, got = poisoned(num_tokens + 3), poisoned(num_tokens + 3)
        metadata.compute_token_to_req_indices(qsl, want, tokens, num_tokens)
        eager.token_request_mapping(qsl, got, qsl.numel() - 1, tokens, num_tokens)
        bad += not same(want, got)
    return bad


def indexer_decode_loop(qsl, seq_lens, block_table, out_lens, out_table, decode_lens, indices, per_req, num_reqs,
                        num_tokens, capacity, cols):
    """The kernel's per-program steps as a loop (Triton's interpreter rejects one of its masks)."""
    actual = int(qsl[num_reqs])
    for token in range(num_tokens):
        req = min(sum(int(qsl[r + 1]) <= token for r in range(num_reqs)), num_reqs - 1)
        valid = token < actual
        start, end = int(qsl[req]), int(qsl[req + 1])
        out_lens[token] = int(seq_lens[req]) - (end - start) + token - start + 1 if valid else 0
        decode_lens[token] = 1
        indices[token] = req if valid else num_reqs + token - actual
        out_table[token, :cols] = block_table[req, :cols] if valid else 0
    out_lens[num_tokens:capacity] = 0
    for r in range(num_reqs):
        per_req[r] = int(qsl[r + 1]) - int(qsl[r])


def check_indexer_decode(g) -> int:
    bad = 0
    for _ in range(12):
        num_reqs = int(torch.randint(1, 6, (1,), generator=g))
        qlens = torch.randint(1, 3, (num_reqs,), generator=g)
        qsl = torch.tensor([0, *qlens.cumsum(0).tolist()], dtype=torch.int32)
        actual = int(qsl[-1])
        num_tokens = actual + int(torch.randint(0, 3, (1,), generator=g))  # padded rows after the real ones
        seq_lens = (qlens + torch.randint(0, 500, (num_reqs,), generator=g)).to(torch.int32)
        cols = 9
        block_table = torch.randint(0, 100, (num_reqs, cols), generator=g, dtype=torch.int32)
        capacity = num_tokens + int(torch.randint(0, 600, (1,), generator=g))
        outs = [[poisoned(capacity), poisoned(capacity, cols + 2), poisoned(capacity), poisoned(capacity),
                 poisoned(num_reqs + 2)] for _ in range(2)]
        indexer_decode_loop(qsl, seq_lens, block_table, *outs[0], num_reqs, num_tokens, capacity, cols)
        eager.indexer_decode_metadata(qsl, seq_lens, block_table, *outs[1][:4], outs[1][4], num_reqs, num_tokens,
                                      capacity, block_table.stride(0), outs[1][1].stride(0), BLOCK_COLS=cols)
        bad += not all(same(a, b) for a, b in zip(*outs, strict=True))
    return bad


def check_prefill_gather(g) -> int:
    bad = 0
    for _ in range(12):
        nd, np_ = int(torch.randint(0, 4, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        qsl, seq_lens, _ = batch(g, nd, np_)
        replay = torch.randint(0, 200, (nd + np_,), generator=g, dtype=torch.int32)
        want, got = poisoned(np_ + 2), poisoned(np_ + 2)
        sparse_swa.ComputePrefillMetadataKernel()(want, seq_lens, qsl, replay, np_, nd, 128)
        eager.prefill_gather_lens(got, seq_lens, qsl, replay, np_, nd, 128)
        bad += not same(want, got)
    return bad


def check_swa(g) -> int:
    bad, window, width = 0, 128, 128
    for has_image in (False,):  # the image variant (vision models) crashes Triton's interpreter; not compared
        for _ in range(8):
            nd, np_ = int(torch.randint(0, 4, (1,), generator=g)), int(torch.randint(0, 3, (1,), generator=g))
            qsl, seq_lens, block_table = batch(g, nd, np_, max_prefill=150)
            tokens = int(qsl[-1])
            if tokens == 0:
                continue
            reqs = torch.repeat_interleave(torch.arange(nd + np_), (qsl[1:] - qsl[:-1]).long()).to(torch.int32)
            valid = torch.rand(tokens, generator=g) > 0.15  # some padding tokens
            replay = torch.randint(0, 50, (nd + np_,), generator=g, dtype=torch.int32)
            left = torch.randint(0, 40, (tokens,), generator=g, dtype=torch.int32)
            right = torch.randint(0, 4, (tokens,), generator=g, dtype=torch.int32)
            index_width = width + (44 if has_image else 0)
            for offset, rows in ((0, nd), (nd, tokens - nd)):
                if rows == 0:
                    continue
                outs = [(poisoned(rows + 2, 1, index_width), poisoned(rows + 2)) for _ in range(2)]
                for fn, (idx, lens) in ((sparse_swa.ComputeSWAIndicesAndLensKernel(), outs[0]),
                                        (eager.swa_indices_and_lens, outs[1])):
                    fn(idx, lens, window, index_width, left if has_image else lens, right if has_image else lens,
                       qsl, seq_lens, reqs, valid, block_table, BLOCK, replay, num_tokens=rows,
                       token_offset=offset, has_image=has_image)
                bad += not (same(outs[0][0], outs[1][0]) and same(outs[0][1], outs[1][1]))
    return bad


def check_compressed_slots(g) -> int:
    bad = 0
    for ratio in (4, 128):
        for _ in range(8):
            qsl, seq_lens, block_table = batch(g, int(torch.randint(0, 4, (1,), generator=g)),
                                               int(torch.randint(1, 4, (1,), generator=g)))
            tokens = int(qsl[-1])
            slots = torch.randint(0, 10_000, (tokens,), generator=g)
            slots[torch.rand(tokens, generator=g) < 0.1] = -1
            storage = BLOCK // 4 if ratio == 4 else 2
            want, got = (torch.full((tokens + 2,), -1, dtype=torch.int64) for _ in range(2))
            compressor_utils.CompressedSlotMappingKernel()(want, slots, qsl, seq_lens, block_table, storage, ratio,
                                                           1, 1)
            eager.compressed_slot_mapping(got, slots, qsl, seq_lens, block_table, storage, ratio, 1, 1)
            bad += not same(want, got)
    return bad


def check_prefill_chunks(g) -> int:
    bad = 0
    for ratio in (4, 128):
        for _ in range(8):
            qsl, seq_lens, _ = batch(g, 0, int(torch.randint(1, 5, (1,), generator=g)))
            num_reqs, tokens = qsl.numel() - 1, int(qsl[-1])
            compressed = (seq_lens // ratio).to(torch.int32)
            cu = torch.tensor([0, *compressed.cumsum(0).tolist()], dtype=torch.int32)
            start = int(torch.randint(0, max(tokens, 1), (1,), generator=g))
            stop = min(tokens, start + int(torch.randint(1, 400, (1,), generator=g)))
            outs = [(poisoned(int(cu[-1]) + 2), poisoned(max(stop - start, 0) + 2), poisoned(max(stop - start, 0) + 2))
                    for _ in range(2)]
            for fn, (t2s, ks, ke) in ((indexer.BuildPrefillChunkMetadataKernel(), outs[0]),
                                      (eager.prefill_chunk_metadata, outs[1])):
                fn(qsl, seq_lens, cu, cu, t2s, ks, ke, start, stop, 0, 1, 1, num_reqs=num_reqs, COMPRESS_RATIO=ratio)
            bad += not all(same(a, b) for a, b in zip(*outs, strict=True))
    return bad


def check_uniform_decode(g) -> int:
    bad = 0
    for next_n in (1, 2, 3):
        num_reqs = int(torch.randint(1, 6, (1,), generator=g))
        seq_lens = torch.randint(0, 700, (num_reqs,), generator=g, dtype=torch.int32)
        block_table = torch.randint(0, 100, (num_reqs, 11), generator=g, dtype=torch.int32)
        rows = num_reqs * next_n
        outs = [(poisoned(rows + 2), poisoned(rows + 2, 11), poisoned(rows + 2)) for _ in range(2)]
        for fn, (lens, table, dlens) in ((indexer.PrepareUniformDecodeKernel(), outs[0]),
                                         (eager.uniform_decode, outs[1])):
            fn(seq_lens, lens, block_table, table, dlens, rows, next_n)
        bad += not all(same(a, b) for a, b in zip(*outs, strict=True))
    return bad


CHECKS = {
    "token_request_mapping": check_token_request,
    "indexer_decode_metadata": check_indexer_decode,
    "prefill_gather_lens": check_prefill_gather,
    "swa_indices_and_lens": check_swa,
    "compressed_slot_mapping": check_compressed_slots,
    "prefill_chunk_metadata": check_prefill_chunks,
    "uniform_decode": check_uniform_decode,
}

if __name__ == "__main__":
    generator = torch.Generator().manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for name, check in CHECKS.items():
        try:
            print(json.dumps({"kernel": name, "mismatches": check(generator)}), flush=True)
        except triton.runtime.errors.InterpreterError as error:  # vLLM's kernel cannot run in the interpreter
            print(json.dumps({"kernel": name, "interpreter_error": str(error)[:200]}), flush=True)
