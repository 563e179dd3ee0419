"""save_partial_states, compress_norm_rope_store (head 512) and _indexer (head 128) vs reference/compressor.py.

save_partial_states is exact. The compressors pool with a different summation order than the
reference, so written entries are compared within one fp8 code / one bf16 ULP / one scale byte;
every other byte of the cache storage (page padding included) must equal the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from conftest import (
    PAGE_SIZES,
    assert_equal_outside,
    assert_rejects,
    clone_storage,
    column_slice,
    distinct_slots,
    entry_byte_index,
    random_pages,
    rope_table,
    storage_bytes,
    ulp_distance,
)
from dsv4 import ops
from dsv4.constants import (
    INDEXER_HEAD_DIM,
    INDEXER_K_BYTES_PER_ENTRY,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_DATA_BYTES,
    MODEL1_HEAD_DIM,
    MODEL1_NOPE_DIM,
    MODEL1_SCALE_BYTES,
    MODEL1_TILE,
)
from dsv4.reference import compressor as ref

COFF = {4: 2, 128: 1}  # compress ratio -> state row halves (C4 windows overlap the previous group)
STATE_BLOCK_SIZE = {4: 4, 128: 8}  # vLLM's state block sizes per ratio
STATE_BLOCKS = 40
STATE_PAD = (1, 24)  # extra rows per state block, extra floats per state row: strides larger than the data
CACHE_PAD_BYTES = 40
MAX_POSITION = 1024
NUM_TOKENS = 16
INVALID_WINDOW_FRACTION = 0.1  # window slots set to -1
OUT_OF_CACHE_FRACTION = 0.03  # window slots past the state cache (also invalid)
SKIP_FRACTION = 0.1  # kv slots set to -1
SCORE_SPREAD = 3.0  # std of the scores, so the softmax is far from uniform
RMS_NORM_EPS = 1e-6
NO_ROW_TOKEN = 3  # this token's window addresses no state row
# Head 512: fp8 codes within 1, bf16 within 1 ULP, scale byte within 1; most bytes identical.
MIN_EQUAL_SCALE_TILES = 0.99
MIN_EXACT_BYTES = 0.995
HEAD_CONFIGS = [(MODEL1_HEAD_DIM, 4), (MODEL1_HEAD_DIM, 128), (INDEXER_HEAD_DIM, 4), (INDEXER_HEAD_DIM, 128)]
HEAD_IDS = ["main-c4", "main-c128", "indexer-c4", "indexer-c128"]


def random_floats(*shape: int) -> torch.Tensor:
    """Random bytes viewed as fp32 (NaN and inf included): poison for storage that must not change."""
    return torch.randint(0, 256, (*shape, 4), dtype=torch.uint8).view(torch.float32).squeeze(-1)


def strided_state_cache(ratio: int, head_dim: int) -> torch.Tensor:
    """fp32 [blocks, bs, 2*coff*D] whose block and row strides exceed the data; random kv, spread scores."""
    block_size, width = STATE_BLOCK_SIZE[ratio], COFF[ratio] * head_dim
    backing = random_floats(STATE_BLOCKS, block_size + STATE_PAD[0], 2 * width + STATE_PAD[1])
    state = backing[:, :block_size, : 2 * width]
    state[..., :width] = torch.randn(STATE_BLOCKS, block_size, width)
    state[..., width:] = torch.randn(STATE_BLOCKS, block_size, width) * SCORE_SPREAD
    return state


# ---------------------------------------------------------------------------------------------
# save_partial_states
# ---------------------------------------------------------------------------------------------


def run_save_partial_states(ratio, head_dim, num_tokens, index_dtype):
    width = COFF[ratio] * head_dim
    state = strided_state_cache(ratio, head_dim)
    expected = clone_storage(state)
    kv = column_slice(torch.randn(num_tokens, width))
    score = column_slice(torch.randn(num_tokens, width))
    ape = torch.randn(ratio, width)
    positions = torch.randint(0, MAX_POSITION, (num_tokens,)).to(index_dtype)
    slots = distinct_slots(num_tokens, state.shape[0] * state.shape[1], SKIP_FRACTION).to(index_dtype)
    ops.save_partial_states(kv, score, ape, positions, state, slots)
    ref.save_partial_states(kv, score, ape, positions, expected, slots)
    assert torch.equal(storage_bytes(state), storage_bytes(expected))


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(("head_dim", "ratio"), HEAD_CONFIGS, ids=HEAD_IDS)
def test_save_partial_states_exact(isa, head_dim, ratio, index_dtype):
    run_save_partial_states(ratio, head_dim, NUM_TOKENS, index_dtype)


def test_save_partial_states_empty_batch():
    run_save_partial_states(4, MODEL1_HEAD_DIM, 0, torch.int64)


# ---------------------------------------------------------------------------------------------
# compress_norm_rope_store / _indexer: inputs
# ---------------------------------------------------------------------------------------------


@dataclass
class CompressCase:
    state_cache: torch.Tensor
    gather_slots: torch.Tensor
    positions: torch.Tensor
    kv_slot_mapping: torch.Tensor
    rms_norm_weight: torch.Tensor
    rms_norm_eps: float
    cos_sin_cache: torch.Tensor
    kv_cache: torch.Tensor
    block_size: int
    compress_ratio: int

    def args(self, kv_cache: torch.Tensor | None = None) -> tuple:
        cache = self.kv_cache if kv_cache is None else kv_cache
        return (self.state_cache, self.gather_slots, self.positions, self.kv_slot_mapping, self.rms_norm_weight,
                self.rms_norm_eps, self.cos_sin_cache, cache, self.block_size, self.compress_ratio)


def boundary_and_other_positions(num_tokens: int, ratio: int) -> torch.Tensor:
    """Group-closing positions ((p+1) % R == 0, the first groups included) mixed with others."""
    first = [ratio - 1, ratio, 2 * ratio - 1]  # first group (C4: half its window precedes 0), off-boundary, second
    closing = (torch.randint(1, MAX_POSITION // ratio, (num_tokens,)) * ratio - 1).tolist()
    other = torch.randint(0, MAX_POSITION, (num_tokens,)).tolist()
    mixed = [c if i % 3 else o for i, (c, o) in enumerate(zip(closing, other, strict=True))]
    return torch.tensor((first + mixed)[:num_tokens])


def window_slots(positions: torch.Tensor, ratio: int, capacity: int) -> torch.Tensor:
    """State slots of positions p-coff*R+1 .. p: -1 before position 0, 10% -1, a few past the cache."""
    window = COFF[ratio] * ratio
    window_pos = positions[:, None] - window + 1 + torch.arange(window)
    slots = torch.randint(0, capacity, window_pos.shape)
    slots[torch.rand(slots.shape) < OUT_OF_CACHE_FRACTION] += capacity
    slots[(window_pos < 0) | (torch.rand(slots.shape) < INVALID_WINDOW_FRACTION)] = -1
    return slots


def make_case(head_dim, ratio, block_size, num_tokens=NUM_TOKENS, index_dtype=torch.int64, strided_gather=False):
    state = strided_state_cache(ratio, head_dim)
    bytes_per_entry = MODEL1_BYTES_PER_TOKEN if head_dim == MODEL1_HEAD_DIM else INDEXER_K_BYTES_PER_ENTRY
    num_blocks = -(-2 * num_tokens // block_size) + 1  # about half the cache stays unwritten
    cache = random_pages(num_blocks, block_size * bytes_per_entry, CACHE_PAD_BYTES)
    positions = boundary_and_other_positions(num_tokens, ratio)
    gather = window_slots(positions, ratio, state.shape[0] * state.shape[1])
    kv_slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    skipped = torch.rand(num_tokens) < SKIP_FRACTION
    if num_tokens > NO_ROW_TOKEN:  # a closing token whose window has no row inside the state cache writes nothing
        gather[NO_ROW_TOKEN] = torch.where(torch.arange(gather.shape[1]) % 2 == 0, -1, state.shape[0] * state.shape[1])
        positions[NO_ROW_TOKEN], skipped[NO_ROW_TOKEN] = 2 * ratio - 1, False
    kv_slots[skipped] = -1
    gather = column_slice(gather.to(index_dtype)) if strided_gather else gather.to(index_dtype)
    weight = torch.rand(head_dim) + 0.5
    return CompressCase(state, gather, positions.to(index_dtype), kv_slots.to(index_dtype), weight,
                        RMS_NORM_EPS, rope_table(MAX_POSITION), cache, block_size, ratio)


def run_op_and_reference(head_dim: int, case: CompressCase) -> torch.Tensor:
    """Runs the op on case.kv_cache and the reference on a clone; returns the clone."""
    expected = clone_storage(case.kv_cache)
    if head_dim == MODEL1_HEAD_DIM:
        ops.compress_norm_rope_store(*case.args())
        ref.compress_norm_rope_store(*case.args(expected))
    else:
        ops.compress_norm_rope_store_indexer(*case.args())
        ref.compress_norm_rope_store_indexer(*case.args(expected))
    return expected


# ---------------------------------------------------------------------------------------------
# comparison of the written entries within tolerance, everything else exactly
# ---------------------------------------------------------------------------------------------


def written_slots(case: CompressCase) -> torch.Tensor:
    state_rows = case.state_cache.shape[0] * case.state_cache.shape[1]
    gather = case.gather_slots.long()
    has_row = ((gather >= 0) & (gather < state_rows)).any(dim=1)
    closes = (case.positions.long() + 1) % case.compress_ratio == 0
    slots = case.kv_slot_mapping.long()
    return slots[closes & has_row & (slots >= 0)]


def data_and_scale_index(cache: torch.Tensor, slots: torch.Tensor, block_size: int, data_bytes: int,
                         scale_bytes: int) -> torch.Tensor:
    """Storage byte indices [N, data_bytes + scale_bytes] of each slot's entry: its data, then its scales."""
    return torch.cat([entry_byte_index(cache, slots, block_size, 0, data_bytes),
                      entry_byte_index(cache, slots, block_size, block_size * data_bytes, scale_bytes)], dim=1)


def e4m3_steps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Steps between e4m3 codes given as bytes (+0 and -0 both 0)."""
    return ulp_distance(got.view(torch.float8_e4m3fn), want.view(torch.float8_e4m3fn))


def bf16_steps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Steps between bf16 values given as byte pairs."""
    return ulp_distance(got.contiguous().view(torch.bfloat16), want.contiguous().view(torch.bfloat16))


def assert_model1_entries_close(got: torch.Tensor, want: torch.Tensor):
    """got/want [N, 584]: 448 fp8 codes, 128 bytes of bf16 RoPE, 7 scale bytes, pad byte."""
    scale_at = MODEL1_DATA_BYTES
    got_scale = got[:, scale_at : scale_at + 7].int()
    want_scale = want[:, scale_at : scale_at + 7].int()
    assert (got_scale - want_scale).abs().max() <= 1, "scale byte differs by more than 1"
    assert got[:, -1].eq(0).all() and want[:, -1].eq(0).all(), "pad byte must be 0"
    same_scale = got_scale == want_scale
    assert same_scale.float().mean() >= MIN_EQUAL_SCALE_TILES
    code_diff = e4m3_steps(got[:, :MODEL1_NOPE_DIM], want[:, :MODEL1_NOPE_DIM])
    tile_diff = code_diff.view(-1, MODEL1_NOPE_DIM // MODEL1_TILE, MODEL1_TILE).amax(dim=-1)
    assert tile_diff[same_scale].max() <= 1, "fp8 code differs by more than 1 in a tile with the same scale"
    rope_diff = bf16_steps(got[:, MODEL1_NOPE_DIM:scale_at], want[:, MODEL1_NOPE_DIM:scale_at])
    assert rope_diff.max() <= 1, "bf16 RoPE value differs by more than 1 ULP"
    exact = (got == want).float().mean().item()
    assert exact >= MIN_EXACT_BYTES, f"only {exact:.4f} of the written bytes are exactly the reference's"


def assert_indexer_entries_close(got: torch.Tensor, want: torch.Tensor):
    """got/want [N, 132]: 128 fp8 codes, then the fp32 scale."""
    got_scale = got[:, INDEXER_HEAD_DIM:].contiguous().view(torch.float32)
    want_scale = want[:, INDEXER_HEAD_DIM:].contiguous().view(torch.float32)
    torch.testing.assert_close(got_scale, want_scale)
    code_diff = e4m3_steps(got[:, :INDEXER_HEAD_DIM], want[:, :INDEXER_HEAD_DIM])
    assert code_diff.max() <= 1, "fp8 code differs by more than 1"


def assert_cache_matches(head_dim: int, case: CompressCase, expected: torch.Tensor):
    slots = written_slots(case)
    if head_dim == MODEL1_HEAD_DIM:
        index = data_and_scale_index(case.kv_cache, slots, case.block_size, MODEL1_DATA_BYTES, MODEL1_SCALE_BYTES)
    else:
        index = data_and_scale_index(case.kv_cache, slots, case.block_size, INDEXER_HEAD_DIM, 4)
    got_all, want_all = storage_bytes(case.kv_cache), storage_bytes(expected)
    if slots.numel():
        check = assert_model1_entries_close if head_dim == MODEL1_HEAD_DIM else assert_indexer_entries_close
        check(got_all[index], want_all[index])
    assert_equal_outside(case.kv_cache, expected, [index])


# ---------------------------------------------------------------------------------------------
# compress_norm_rope_store / _indexer: tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", PAGE_SIZES)
@pytest.mark.parametrize(("head_dim", "ratio"), HEAD_CONFIGS, ids=HEAD_IDS)
def test_compress_matches_reference(isa, head_dim, ratio, block_size):
    case = make_case(head_dim, ratio, block_size)
    assert written_slots(case).numel() > 0
    assert_cache_matches(head_dim, case, run_op_and_reference(head_dim, case))


@pytest.mark.parametrize(("head_dim", "ratio"), HEAD_CONFIGS, ids=HEAD_IDS)
def test_compress_int32_indices_and_strided_gather_slots(isa, head_dim, ratio):
    case = make_case(head_dim, ratio, 64, index_dtype=torch.int32, strided_gather=True)
    assert case.gather_slots.stride(0) > case.gather_slots.shape[1]
    assert_cache_matches(head_dim, case, run_op_and_reference(head_dim, case))


@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, INDEXER_HEAD_DIM], ids=["main", "indexer"])
def test_compress_empty_batch(head_dim):
    case = make_case(head_dim, 4, 64, num_tokens=0)
    assert_cache_matches(head_dim, case, run_op_and_reference(head_dim, case))


def test_reference_pools_the_projection_half_of_each_window_row():
    """With one dominant score per channel, the pooled entry is that row's kv in half w // R."""
    ratio, head_dim = 4, INDEXER_HEAD_DIM
    state = strided_state_cache(ratio, head_dim)
    width, window = COFF[ratio] * head_dim, COFF[ratio] * ratio
    gather = torch.randperm(state.shape[0] * state.shape[1])[:window].view(1, window)
    rows = gather[0] // state.shape[1], gather[0] % state.shape[1]
    winner = torch.randint(0, window, (head_dim,))  # per channel, the window row that dominates
    half = winner // ratio
    channel = torch.arange(head_dim)
    state[..., width:] = 0.0
    state[rows[0][winner], rows[1][winner], width + half * head_dim + channel] = 100.0
    weight = torch.rand(head_dim) + 0.5
    pooled, has_row = ref.pooled_normed_entries(state, gather, weight, RMS_NORM_EPS, ratio, head_dim)
    kv = state[rows[0][winner], rows[1][winner], half * head_dim + channel]
    expected = kv * torch.rsqrt(kv.square().mean() + RMS_NORM_EPS) * weight
    torch.testing.assert_close(pooled[0], expected)
    assert has_row.tolist() == [True]


def test_opcheck(opcheck):
    kv, score = torch.randn(3, 256), torch.randn(3, 256)
    state = strided_state_cache(4, INDEXER_HEAD_DIM)
    positions, slots = torch.tensor([3, 4, 7]), torch.tensor([0, -1, 9])
    opcheck(torch.ops.dsv4.save_partial_states.default,
                          (kv, score, torch.randn(4, 256), positions, state, slots))
    for head_dim, op in [(MODEL1_HEAD_DIM, torch.ops.dsv4.compress_norm_rope_store.default),
                         (INDEXER_HEAD_DIM, torch.ops.dsv4.compress_norm_rope_store_indexer.default)]:
        case = make_case(head_dim, 4, 2, num_tokens=4)
        opcheck(op, case.args())


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------


def save_args(**overrides):
    args = {"kv": torch.randn(3, 256), "score": torch.randn(3, 256), "ape": torch.randn(4, 256),
            "positions": torch.tensor([3, 4, 7]), "state_cache": strided_state_cache(4, INDEXER_HEAD_DIM),
            "slot_mapping": torch.tensor([0, -1, 9])}
    args.update(overrides)
    return args


SAVE_BAD_INPUTS = {
    "kv dtype": ({"kv": torch.randn(3, 256).bfloat16()}, "'kv'"),
    "kv rank": ({"kv": torch.randn(3, 256, 1)}, "'kv'"),
    "kv last dim strided": ({"kv": torch.randn(3, 512)[:, ::2]}, "'kv'"),
    "score shape": ({"score": torch.randn(3, 128)}, "'score'"),
    "ape width": ({"ape": torch.randn(4, 128)}, "'ape'"),
    "ape non-contiguous": ({"ape": torch.randn(256, 4).t()}, "'ape'"),
    "positions length": ({"positions": torch.tensor([3, 4])}, "'positions'"),
    "negative position": ({"positions": torch.tensor([3, -4, 7])}, "'positions'"),
    "slots dtype": ({"slot_mapping": torch.tensor([0.0, 1.0, 2.0])}, "'slot_mapping'"),
    "slot past state": ({"slot_mapping": torch.tensor([0, STATE_BLOCKS * 4, 1])}, "'slot_mapping'"),
    "state dtype": ({"state_cache": torch.randn(4, 4, 512).bfloat16()}, "'state_cache'"),
    "state rank": ({"state_cache": torch.randn(16, 512)}, "'state_cache'"),
    "state width": ({"state_cache": torch.randn(4, 4, 384)}, "'state_cache'"),
    "two tokens, one slot": ({"slot_mapping": torch.tensor([9, -1, 9])}, "'slot_mapping' entries 0 and 2 both write"),
}


@pytest.mark.parametrize("case", SAVE_BAD_INPUTS, ids=list(SAVE_BAD_INPUTS))
def test_save_partial_states_rejects(case):
    overrides, pattern = SAVE_BAD_INPUTS[case]
    assert_rejects(ops.save_partial_states, save_args(**overrides), f"dsv4::save_partial_states.*{pattern}")


def compress_args(head_dim: int, **overrides) -> dict:
    case = make_case(head_dim, 4, 2, num_tokens=4)
    names = ["state_cache", "gather_slots", "positions", "kv_slot_mapping", "rms_norm_weight", "rms_norm_eps",
             "cos_sin_cache", "kv_cache", "block_size", "compress_ratio"]
    args = dict(zip(names, case.args(), strict=True))
    args.update(overrides)
    return args


def compress_bad_inputs(head_dim: int) -> dict:
    width = COFF[4] * head_dim
    slots = torch.tensor([0, 1, -1, 2])
    return {
        "state dtype": ({"state_cache": torch.randn(4, 4, 2 * width).bfloat16()}, "'state_cache'"),
        "state rank": ({"state_cache": torch.randn(16, 2 * width)}, "'state_cache'"),
        "state width not 2*coff*D": ({"state_cache": torch.randn(4, 4, 2 * width + 8)}, "'state_cache'"),
        "state width implies coff 3": ({"state_cache": torch.randn(4, 4, 6 * head_dim)}, "'state_cache'"),
        "state row strided": ({"state_cache": torch.randn(4, 4, 4 * width)[..., ::2]}, "'state_cache'"),
        "gather width not coff*R": ({"gather_slots": torch.zeros(4, 4, dtype=torch.long)}, "'gather_slots'"),
        "gather dtype": ({"gather_slots": torch.zeros(4, 8)}, "'gather_slots'"),
        "gather rank": ({"gather_slots": torch.zeros(4, 8, 1, dtype=torch.long)}, "'gather_slots'"),
        "positions length": ({"positions": torch.tensor([3, 7])}, "'positions'"),
        "negative position": ({"positions": torch.tensor([3, -1, 7, 11])}, "'positions'"),
        "position past rope table": ({"positions": torch.tensor([3, 7, MAX_POSITION + 3, 11])}, "'positions'"),
        "kv slots length": ({"kv_slot_mapping": slots[:3]}, "'kv_slot_mapping'"),
        "kv slot past cache": ({"kv_slot_mapping": torch.tensor([0, 1, 99, 2])}, "'kv_slot_mapping'.*99"),
        "kv slot below -1": ({"kv_slot_mapping": torch.tensor([0, 1, -3, 2])}, "'kv_slot_mapping'"),
        "weight dtype": ({"rms_norm_weight": torch.ones(head_dim).bfloat16()}, "'rms_norm_weight'"),
        "weight size": ({"rms_norm_weight": torch.ones(head_dim + 1)}, "'rms_norm_weight'"),
        "weight non-contiguous": ({"rms_norm_weight": torch.ones(2 * head_dim)[::2]}, "'rms_norm_weight'"),
        "rope width": ({"cos_sin_cache": torch.randn(MAX_POSITION, 32)}, "'cos_sin_cache'"),
        "cache dtype": ({"kv_cache": torch.zeros(4, 2 * MODEL1_BYTES_PER_TOKEN, dtype=torch.int32)}, "'kv_cache'"),
        "page too small": ({"block_size": 64}, "'kv_cache'"),
        "ratio zero": ({"compress_ratio": 0}, "'compress_ratio'"),
        "two tokens, one entry": ({"kv_slot_mapping": torch.tensor([2, 1, -1, 2])},
                                  "'kv_slot_mapping' entries 0 and 3 both write slot 2"),
        "eps zero": ({"rms_norm_eps": 0.0}, "'eps' must be positive"),
        "eps negative": ({"rms_norm_eps": -1e-6}, "'eps' must be positive"),
    }


COMPRESS_OPS = {MODEL1_HEAD_DIM: "compress_norm_rope_store", INDEXER_HEAD_DIM: "compress_norm_rope_store_indexer"}
COMPRESS_BAD_INPUTS = {head_dim: compress_bad_inputs(head_dim) for head_dim in COMPRESS_OPS}


@pytest.mark.parametrize(("head_dim", "case"), [(h, c) for h, cases in COMPRESS_BAD_INPUTS.items() for c in cases],
                         ids=[f"{h}-{c}" for h, cases in COMPRESS_BAD_INPUTS.items() for c in cases])
def test_compress_rejects(head_dim, case):
    overrides, pattern = COMPRESS_BAD_INPUTS[head_dim][case]
    name = COMPRESS_OPS[head_dim]
    assert_rejects(getattr(ops, name), compress_args(head_dim, **overrides), f"dsv4::{name}:.*{pattern}",
                   unchanged=("kv_cache",))
