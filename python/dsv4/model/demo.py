"""``python -m dsv4 demo``: DeepSeek-V4-Flash-shaped attention layers serving a batch of requests.

The first layers of V4-Flash (two sliding-window-only, then C4A and C128A) run on a residual stream
(``h += layer(rms_norm(h))``): a chunked prefill of every prompt under a per-step token budget, then
decode steps of one token per request (each new token's input is the normalised last hidden state, an
autoregressive loop without a language-model head). Prints tokens/s per phase and the time of every
op, then checks the last decode step of every layer against the dense float reference given the entries the
kernels selected, and each C4A selection on its own terms against the float indexer scores (fp8 and float
scores rank near-tied entries differently, so comparing against the float reference's own top-k would charge
the kernels with the indexer's rounding at long prompts).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace

import torch

import dsv4

from ..constants import MODEL1_NOPE_DIM, MODEL1_ROPE_DIM
from ..metadata import LayerType
from ..reference import layer_v41 as reference_v41
from ..reference.layer import (
    MAX_RELATIVE_ERROR,
    MAX_RELATIVE_ERROR_FP8_STORAGE,
    MIN_COSINE,
    agreement,
    dense_attention,
    indexer_scores,
    selection_mask,
    top_entries,
)
from .cache_manager import ScheduledBatch
from .config import get_config
from .layer import rms_norm
from .stack import AttentionStack
from .timing import OpTimer

# fp8 indexer scores (the kernels) rank near-tied entries unlike float ones: a swapped-in entry may score this
# fraction of its row's score range below the float cut-off. Measured: up to 2 % (V4-Flash, prompts of 5,000 and
# 8,000 tokens); the lowest-scoring entries taken instead (a planted fault) sit 34 % below.
SELECTION_MARGIN = 0.05

PROGRESS_WIDTH = 30
MIB = 1 << 20


@dataclass
class Request:
    """A request's per-layer inputs so far (for the reference check) and the input of its next token."""

    prompt: torch.Tensor  # [prompt_len, hidden] bf16 token embeddings
    computed: int = 0  # tokens whose outputs exist
    layer_inputs: list[list[torch.Tensor]] = field(default_factory=list)
    next_input: torch.Tensor | None = None


def progress(label: str, done: int, total: int, unit: str, seconds: float, tokens_per_second: float) -> None:
    """A plain-text bar redrawn in place on a terminal; in a log only the finished bar is written."""
    if done < total and not sys.stdout.isatty():
        return
    filled = PROGRESS_WIDTH * done // max(total, 1)
    bar = "#" * filled + "." * (PROGRESS_WIDTH - filled)
    rate = f"{tokens_per_second:8.1f} tokens/s"
    sys.stdout.write(f"\r{label:8s}[{bar}] {done:5d}/{total} {unit}  {seconds:6.1f} s  {rate}")
    sys.stdout.flush()


def prefill_batches(prompt_lens: list[int], budget: int) -> list[ScheduledBatch]:
    """First-come first-served chunked prefill: each step takes prompt tokens in order up to the budget."""
    done = [0] * len(prompt_lens)
    batches = []
    while any(d < n for d, n in zip(done, prompt_lens, strict=True)):
        ids, query_lens, seq_lens, room = [], [], [], budget
        for request, (finished, length) in enumerate(zip(done, prompt_lens, strict=True)):
            take = min(length - finished, room)
            if take > 0:
                ids.append(request)
                query_lens.append(take)
                seq_lens.append(finished + take)
                done[request] += take
                room -= take
        batches.append(ScheduledBatch(tuple(ids), tuple(query_lens), tuple(seq_lens)))
    return batches


def run_step(stack: AttentionStack, batch: ScheduledBatch, requests: list[Request], timer: OpTimer
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One scheduled step through every layer, recording each layer's inputs per request.

    Returns the residual stream ``[T, hidden]`` and every layer's output.
    """
    pieces = []
    for request_id, query_len in zip(batch.request_ids, batch.query_lens, strict=True):
        request = requests[request_id]
        if request.computed < request.prompt.shape[0]:
            pieces.append(request.prompt[request.computed : request.computed + query_len])
        else:
            pieces.append(request.next_input[None])
    hidden = torch.cat(pieces)
    step = stack.prepare(batch, timer)
    starts = [0, *torch.tensor(batch.query_lens).cumsum(0).tolist()]
    outputs = []
    for index in range(len(stack.layers)):
        layer_input = rms_norm(hidden, None, stack.config.rms_norm_eps)
        for request_id, start, end in zip(batch.request_ids, starts[:-1], starts[1:], strict=True):
            requests[request_id].layer_inputs[index].append(layer_input[start:end])
        outputs.append(stack.run_layer(index, layer_input, step, timer))
        hidden = hidden + outputs[-1]
    for request_id, query_len in zip(batch.request_ids, batch.query_lens, strict=True):
        requests[request_id].computed += query_len
    return hidden, outputs


def report_ops(prefill: OpTimer, decode: OpTimer) -> None:
    names = sorted(set(prefill.seconds) | set(decode.seconds), key=lambda n: -(prefill.seconds[n] + decode.seconds[n]))
    total = sum(prefill.seconds.values()) + sum(decode.seconds.values())
    print("\nper-op time, all layers of all steps")
    print(f"  {'op':34s} {'calls':>7s} {'prefill s':>10s} {'decode s':>9s} {'share':>6s}")
    for name in names:
        seconds = prefill.seconds[name] + decode.seconds[name]
        print(f"  {name:34s} {prefill.calls[name] + decode.calls[name]:7d} {prefill.seconds[name]:10.2f} "
              f"{decode.seconds[name]:9.2f} {100 * seconds / total:5.1f}%")


def check_selection(layer, inputs: torch.Tensor, position: int, chosen_indices: torch.Tensor) -> tuple[bool, str]:
    """The kernels' top-k of one query (fp8 indexer) against the float indexer scores: the right number of visible
    entries, and every entry the float top-k lacks scores within SELECTION_MARGIN (a fraction of the row's score
    range) of the float cut-off; near-tied entries may swap, a wrong one may not. Returns (ok, summary)."""
    return selection_verdict(indexer_scores(layer, inputs, torch.tensor([position]))[0], layer.config.index_topk,
                             chosen_indices)


def selection_verdict(scores: torch.Tensor, topk: int, chosen_indices: torch.Tensor) -> tuple[bool, str]:
    """:func:`check_selection` given the float scores ``[count]`` of the query (-inf: not visible)."""
    visible = scores > float("-inf")
    floats = top_entries(scores[None], topk)[0]
    kernels = selection_mask(chosen_indices[None], scores.shape[0])[0]
    if not visible.any():
        return bool(not kernels.any()), "no entries"
    cutoff = scores[floats].min()
    spread = float(scores[visible].max() - scores[visible].min()) or 1.0
    swapped = kernels & ~floats
    shortfall = float((cutoff - scores[swapped]).max().clamp(min=0)) / spread if swapped.any() else 0.0
    ok = (bool((kernels & ~visible).sum() == 0) and int(kernels.sum()) == int(floats.sum())
          and shortfall <= SELECTION_MARGIN)
    recall = float((kernels & floats).sum()) / max(int(floats.sum()), 1)
    return ok, f"recall {recall:.3f}, {int(swapped.sum())} swapped, worst {shortfall:.4f} of the score range below"


def candidate_mask(blocks: torch.Tensor, block_size: int, count: int) -> torch.Tensor:
    """bool ``[count]``: the entries inside the published candidate blocks (int ``[n]``, -1 pads)."""
    return torch.isin(torch.arange(count) // block_size, blocks[blocks >= 0].long().cpu())


def block_scores(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """fp32 ``[blocks]``: each block's best visible score (-inf: none visible); the newest visible block gets the
    row's best score, as the kernels always keep it."""
    visible = scores > float("-inf")
    blocks = -(-scores.shape[0] // block_size)
    padded = torch.nn.functional.pad(scores, (0, blocks * block_size - scores.shape[0]), value=float("-inf"))
    best = padded.view(blocks, block_size).amax(dim=-1)
    if visible.any():
        best[int(visible.nonzero().max()) // block_size] = scores[visible].max()
    return best


def check_last_step_v41(stack: AttentionStack, requests: list[Request], batch: ScheduledBatch,
                        outputs: list[torch.Tensor]) -> bool:
    """:func:`check_last_step` for V4.1 layers: each compressed layer against the dense reference built from its
    kv source's inputs, given the selection of its index source; each index source's selection against the float
    scores of its kv source's keys (inside the published candidate blocks for a two-level layer)."""
    config = stack.config
    print(f"\ncheck: the last decode step of every layer vs the dense float reference on the stored records given "
          f"the same selected entries and the kv source's inputs (cosine >= {MIN_COSINE} per token, relative error "
          f"<= {MAX_RELATIVE_ERROR_FP8_STORAGE:.0%}); every index source's selection vs the float indexer on the "
          f"stored keys and queries (swapped entries within "
          f"{SELECTION_MARGIN:.0%} of the score range of its cut-off)")
    passed = True
    for index, layer in enumerate(stack.layers):
        compressed = layer.selection_source is not None
        kv_source = config.kv_source_of(index) if compressed else None
        chosen = layer.selection_source.topk_indices_buffer[: len(batch.request_ids)].cpu() if compressed else None
        expected, notes = [], []
        for row, (r, seq_len) in enumerate(zip(batch.request_ids, batch.seq_lens, strict=True)):
            inputs = torch.cat(requests[r].layer_inputs[index])
            source_inputs = torch.cat(requests[r].layer_inputs[kv_source]) if compressed else None
            expected.append(reference_v41.dense_attention(
                layer, inputs, torch.tensor([seq_len - 1]), stack.layers[kv_source] if compressed else None,
                source_inputs, chosen[row : row + 1] if compressed else None, stored=True))
            if layer.is_index_source:
                allowed = None
                if layer.uses_candidates:
                    count = seq_len // layer.compress_ratio
                    blocks = layer.candidate_source.candidate_blocks[row]
                    allowed = candidate_mask(blocks, config.candidate_block_size, count)[None]
                scores = reference_v41.indexer_scores(layer, inputs, stack.layers[kv_source], source_inputs,
                                                      torch.tensor([seq_len - 1]), allowed, stored=True)[0]
                ok, note = selection_verdict(scores, config.index_topk, chosen[row])
                passed &= ok
                kind = "two-level selection" if layer.uses_candidates else "selection"
                notes.append(f"    request {r}: {kind} {note}  {'PASS' if ok else 'FAIL'}")
                if layer.is_candidate_source and scores.shape[0] > config.index_topk:
                    ok, note = selection_verdict(block_scores(scores, config.candidate_block_size),
                                                 config.candidate_topk_blocks, layer.candidate_blocks[row].cpu())
                    passed &= ok
                    notes.append(f"    request {r}: candidate blocks {note}  {'PASS' if ok else 'FAIL'}")
        cosine, error = agreement(outputs[index], torch.cat(expected))
        ok = cosine >= MIN_COSINE and error <= MAX_RELATIVE_ERROR_FP8_STORAGE
        passed &= ok
        sources = f" (kv {kv_source}, index {config.index_source_of(index)})" if compressed else ""
        print(f"  layer {index} {layer.layer_type.value:8s}{sources} min cosine {cosine:.5f}  relative error "
              f"{error:6.2%}  {'PASS' if ok else 'FAIL'}")
        for note in notes:
            print(note)
    return passed


def check_last_step(stack: AttentionStack, requests: list[Request], batch: ScheduledBatch,
                    outputs: list[torch.Tensor]) -> bool:
    print(f"\ncheck: the last decode step of every layer vs the dense float reference given the same selected "
          f"entries (cosine >= {MIN_COSINE} per token, relative error <= {MAX_RELATIVE_ERROR:.0%}); the C4A "
          f"selection vs the float indexer (swapped entries within {SELECTION_MARGIN:.0%} of the score range "
          f"of its cut-off)")
    passed = True
    for index, layer in enumerate(stack.layers):
        c4a = layer.layer_type is LayerType.C4A
        chosen = layer.topk_indices_buffer[: len(batch.request_ids)].cpu() if c4a else None
        expected, notes = [], []
        for row, (r, seq_len) in enumerate(zip(batch.request_ids, batch.seq_lens, strict=True)):
            inputs = torch.cat(requests[r].layer_inputs[index])
            selection = chosen[row : row + 1] if c4a else None
            expected.append(dense_attention(layer, inputs, torch.tensor([seq_len - 1]), selection=selection))
            if c4a:
                ok, note = check_selection(layer, inputs, seq_len - 1, chosen[row])
                passed &= ok
                notes.append(f"    request {r}: selection {note}  {'PASS' if ok else 'FAIL'}")
        cosine, error = agreement(outputs[index], torch.cat(expected))
        ok = cosine >= MIN_COSINE and error <= MAX_RELATIVE_ERROR
        passed &= ok
        print(f"  layer {index} {layer.layer_type.value:8s} min cosine {cosine:.5f}  relative error {error:6.2%}  "
              f"{'PASS' if ok else 'FAIL'}")
        for note in notes:
            print(note)
    return passed


def run_demo(prompt_lens: list[int], decode_steps: int, num_layers: int, step_tokens: int, preset: str,
             seed: int, **overrides) -> bool:
    """The demo of ``preset``'s first ``num_layers`` layers; ``overrides`` replace configuration fields (the V4.1
    ``kv_cache_dtype`` and ``index_key_format``). Returns whether the check passed."""
    torch.manual_seed(seed)
    config = replace(get_config(preset).first_layers(num_layers), **overrides)
    max_model_len = max(prompt_lens) + decode_steps
    kinds = ", ".join(f"{i}:{t.value}" for i, t in enumerate(config.layer_types))
    print(f"DeepSeek-V4 attention demo: {config.name} (layers {kinds})")
    if config.model_version == "v4.1":
        records = (f"window {config.cache_record('window')}, compressed {config.cache_record('compressed')} records, "
                   f"{config.index_key_format} indexer keys; kv sources {list(config.kv_source_layer_ids)}, index "
                   f"sources {list(config.index_source_layer_ids)}")
    else:
        records = f"{MODEL1_NOPE_DIM} fp8 + {MODEL1_ROPE_DIM} bf16 rope"
    print(f"  {config.num_attention_heads} heads x {config.head_dim} ({records}), hidden "
          f"{config.hidden_size}, window {config.sliding_window}, indexer {config.index_n_heads} x "
          f"{config.index_head_dim} top-{config.index_topk}")
    print(f"  CPU tier {dsv4.cpu_isa()}, {torch.get_num_threads()} threads; ops on the reference: "
          f"{', '.join(sorted(dsv4.REFERENCE_BACKED_CPU_OPS)) or 'none'}")
    print(f"  {len(prompt_lens)} requests, prompts {'/'.join(map(str, prompt_lens))} tokens, {decode_steps} decode "
          f"steps, step budget {step_tokens} tokens")
    start = time.perf_counter()
    stack = AttentionStack(config, max_model_len=max_model_len, max_num_reqs=len(prompt_lens),
                           max_num_batched_tokens=step_tokens, seed=seed)
    cache_bytes = sum(t.untyped_storage().nbytes() for c in stack.manager.layer_caches
                      for t in vars(c).values() if isinstance(t, torch.Tensor))
    weight_bytes = sum(t.nbytes for layer in stack.layers for t in layer.state_dict().values())
    requests = [Request(torch.randn(n, config.hidden_size).bfloat16(), layer_inputs=[[] for _ in stack.layers])
                for n in prompt_lens]
    print(f"  setup {time.perf_counter() - start:.1f} s: weights {weight_bytes / MIB:.0f} MiB, paged caches "
          f"{cache_bytes / MIB:.0f} MiB\n")

    prefill_timer, decode_timer = OpTimer(), OpTimer()
    total_prompt, done, start = sum(prompt_lens), 0, time.perf_counter()
    for batch in prefill_batches(prompt_lens, step_tokens):
        hidden, _ = run_step(stack, batch, requests, prefill_timer)
        ends = torch.tensor(batch.query_lens).cumsum(0) - 1
        for request_id, end, seq_len in zip(batch.request_ids, ends.tolist(), batch.seq_lens, strict=True):
            if seq_len == prompt_lens[request_id]:
                requests[request_id].next_input = rms_norm(hidden[end], None, config.rms_norm_eps)
        done += batch.num_tokens
        elapsed = time.perf_counter() - start
        progress("prefill", done, total_prompt, "tokens", elapsed, done / elapsed)
    print()

    start = time.perf_counter()
    ids = tuple(range(len(prompt_lens)))
    for step_index in range(decode_steps):
        batch = ScheduledBatch(ids, (1,) * len(ids), tuple(r.computed + 1 for r in requests))
        hidden, layer_outputs = run_step(stack, batch, requests, decode_timer)
        for request, row in zip(requests, hidden, strict=True):
            request.next_input = rms_norm(row, None, config.rms_norm_eps)
        elapsed = time.perf_counter() - start
        progress("decode", step_index + 1, decode_steps, "steps ", elapsed, (step_index + 1) * len(ids) / elapsed)
    print()
    report_ops(prefill_timer, decode_timer)
    check = check_last_step_v41 if config.model_version == "v4.1" else check_last_step
    return check(stack, requests, batch, layer_outputs)
