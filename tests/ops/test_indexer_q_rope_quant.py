"""dsv4::indexer_q_rope_quant (indexer q RoPE + per-head fp8 quant, scale folded into weights) against its reference."""

from __future__ import annotations

import pytest
import torch

from conftest import INDEX_DTYPES, MAX_POSITION, assert_rejects, random_positions, rope_table, ulp_distance, with_last
from dsv4 import ops
from dsv4.constants import FP8_MAX, INDEXER_AMAX_FLOOR, INDEXER_HEAD_DIM
from dsv4.reference import indexer, rope_slots

SOFTMAX_SCALE = INDEXER_HEAD_DIM**-0.5
MAX_ULP = 1  # fp8 codes: at most one step from the reference
MIN_EXACT_FRACTION = 0.99
WEIGHTS_RTOL, WEIGHTS_ATOL = 1e-5, 1e-6
FP8_RELATIVE_STEP = 2**-3  # e4m3 normal spacing (3 mantissa bits) plus the bf16 rounding of the RoPE dims
FP8_SUBNORMAL_STEP = 2**-9  # e4m3 subnormal spacing, in units of the scale
# Per-head magnitudes: below the 1e-4 amax floor, ordinary, and large enough to need scales > 1.
HEAD_MAGNITUDES = torch.tensor([1e-6, 1.0, 30.0, 1e3])

HEAD_COUNTS = [1, 8, 16, 64, 128]


def random_q(tokens: int, heads: int, dtype=torch.float32) -> torch.Tensor:
    magnitude = HEAD_MAGNITUDES[torch.randint(0, len(HEAD_MAGNITUDES), (tokens, heads, 1))]
    return (torch.randn(tokens, heads, INDEXER_HEAD_DIM) * magnitude).to(dtype)


def poisoned_outputs(tokens: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    q_fp8 = torch.randint(0, 256, (tokens, heads, INDEXER_HEAD_DIM), dtype=torch.uint8).view(torch.float8_e4m3fn)
    return q_fp8, torch.full((tokens, heads), float("nan"))


def run_and_check(q, positions, weights):
    cos_sin = rope_table(MAX_POSITION)
    head_scale = q.shape[1] ** -0.5
    q_fp8, weights_out = poisoned_outputs(q.shape[0], q.shape[1])
    ops.indexer_q_rope_quant(q, positions, cos_sin, weights, SOFTMAX_SCALE, head_scale, q_fp8=q_fp8,
                             weights_out=weights_out)
    expected_fp8, expected_weights = indexer.indexer_q_rope_quant(q, positions, cos_sin, weights, SOFTMAX_SCALE,
                                                                  head_scale)
    ulp = ulp_distance(q_fp8, expected_fp8)
    assert torch.all(ulp <= MAX_ULP)
    assert ulp.numel() == 0 or (ulp == 0).float().mean() >= MIN_EXACT_FRACTION
    torch.testing.assert_close(weights_out, expected_weights, rtol=WEIGHTS_RTOL, atol=WEIGHTS_ATOL)


@pytest.mark.parametrize("heads", HEAD_COUNTS)
def test_head_counts(isa, heads):
    tokens = 7
    run_and_check(random_q(tokens, heads), random_positions(tokens), torch.randn(tokens, heads))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dtypes(isa, dtype, index_dtype):
    tokens, heads = 5, 8
    run_and_check(random_q(tokens, heads, dtype), random_positions(tokens, index_dtype), torch.randn(tokens, heads))


def test_strided_inputs(isa):
    tokens, heads = 6, 16
    q = random_q(heads, tokens).transpose(0, 1)  # head-major storage
    weights = torch.randn(tokens, heads + 3)[:, :heads]  # padded weight rows
    run_and_check(q, random_positions(2 * tokens, torch.int32)[::2], weights)


def test_head_sliced_q(isa):
    tokens, heads = 4, 8
    q = random_q(tokens, heads, torch.bfloat16).repeat(1, 1, 2)[..., :INDEXER_HEAD_DIM]  # head stride 256
    run_and_check(q, random_positions(tokens), torch.randn(tokens, heads))


def test_empty_batch(isa):
    run_and_check(random_q(0, 64), random_positions(0), torch.randn(0, 64))


def test_wrapper_defaults():
    tokens, heads = 3, 64
    q, positions, weights = random_q(tokens, heads), random_positions(tokens), torch.randn(tokens, heads)
    cos_sin = rope_table(MAX_POSITION)
    q_fp8, weights_out = ops.indexer_q_rope_quant(q, positions, cos_sin, weights)
    expected_fp8, expected_weights = indexer.indexer_q_rope_quant(q, positions, cos_sin, weights, SOFTMAX_SCALE,
                                                                  heads**-0.5)
    assert q_fp8.dtype == torch.float8_e4m3fn and q_fp8.shape == q.shape
    assert torch.all(ulp_distance(q_fp8, expected_fp8) <= MAX_ULP)
    torch.testing.assert_close(weights_out, expected_weights, rtol=WEIGHTS_RTOL, atol=WEIGHTS_ATOL)


def test_reference_semantics():
    """The reference itself: power-of-two scales, the smallest that fit amax in the fp8 range, and fp8 q times
    its scale reproduces RoPE(q) to fp8 precision."""
    tokens, heads = 6, 4
    q, positions, weights = random_q(tokens, heads), random_positions(tokens), torch.rand(tokens, heads) + 0.5
    cos_sin = rope_table(MAX_POSITION)
    q_fp8, weights_out = indexer.indexer_q_rope_quant(q, positions, cos_sin, weights, 1.0, 1.0)
    scale = weights_out / weights
    assert torch.equal(torch.log2(scale), torch.log2(scale).round()), "q scales are powers of two"
    rotated = rope_slots.apply_rope(q, positions, cos_sin)
    amax = rotated.abs().amax(-1)
    fitted = amax / scale
    above_floor = amax > INDEXER_AMAX_FLOOR
    assert torch.all(fitted[above_floor] <= FP8_MAX) and torch.all(fitted[above_floor] > FP8_MAX / 2)
    error = (q_fp8.float() * scale.unsqueeze(-1) - rotated).abs()
    assert torch.all(error <= rotated.abs() * FP8_RELATIVE_STEP + scale.unsqueeze(-1) * FP8_SUBNORMAL_STEP)


def test_opcheck(opcheck):
    tokens, heads = 3, 4
    q_fp8, weights_out = poisoned_outputs(tokens, heads)
    args = (random_q(tokens, heads), random_positions(tokens), rope_table(MAX_POSITION), torch.randn(tokens, heads),
            SOFTMAX_SCALE, heads**-0.5, q_fp8.view(torch.uint8), weights_out)  # opcheck cannot compare fp8
    opcheck(torch.ops.dsv4.indexer_q_rope_quant.default, args)


# ---- bad inputs: a RuntimeError naming the op and the argument ----


def valid_args() -> dict:
    tokens, heads = 4, 2
    q_fp8, weights_out = poisoned_outputs(tokens, heads)
    return dict(q=random_q(tokens, heads), positions=random_positions(tokens), cos_sin_cache=rope_table(MAX_POSITION),
                weights=torch.randn(tokens, heads), softmax_scale=SOFTMAX_SCALE, head_scale=heads**-0.5, q_fp8=q_fp8,
                weights_out=weights_out)


BAD_INPUTS = {
    "q dtype": (lambda a: {**a, "q": a["q"].to(torch.int32)}, "argument 'q' must have dtype"),
    "q rank": (lambda a: {**a, "q": a["q"][:, 0]}, "argument 'q' must have 3 dimensions"),
    "q head dim": (lambda a: {**a, "q": a["q"][..., :64]}, "argument 'q' must have size 128"),
    "q last dim strided": (lambda a: {**a, "q": a["q"].repeat_interleave(2, -1)[..., ::2]},
                           "argument 'q' must be contiguous in its last dimension"),
    "positions dtype": (lambda a: {**a, "positions": a["positions"].float()}, "argument 'positions' must have dtype"),
    "positions length": (lambda a: {**a, "positions": a["positions"][:-1]}, "argument 'positions' must have size"),
    "position past the rope table": (lambda a: {**a, "positions": with_last(a["positions"], MAX_POSITION)},
                                     "argument 'positions' entry 3 is 300"),
    "cos_sin_cache width": (lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"][:, :32]},
                            "argument 'cos_sin_cache' must have size 64"),
    "weights dtype": (lambda a: {**a, "weights": a["weights"].bfloat16()}, "argument 'weights' must have dtype"),
    "weights heads": (lambda a: {**a, "weights": a["weights"][:, :1]}, "argument 'weights' must have size 2"),
    "weights tokens": (lambda a: {**a, "weights": a["weights"][1:]}, "argument 'weights' must have size 4"),
    "weights last dim strided": (lambda a: {**a, "weights": a["weights"].t().contiguous().t()},
                                 "argument 'weights' must be contiguous in its last dimension"),
    "q_fp8 dtype": (lambda a: {**a, "q_fp8": a["q_fp8"].float()}, "argument 'q_fp8' must have dtype"),
    "q_fp8 shape": (lambda a: {**a, "q_fp8": a["q_fp8"][1:]}, "argument 'q_fp8' must have q's shape"),
    "q_fp8 not contiguous": (lambda a: {**a, "q_fp8": a["q_fp8"].view(torch.uint8).transpose(0, 1).contiguous()
                                        .transpose(0, 1)}, "argument 'q_fp8' must be contiguous"),
    "weights_out dtype": (lambda a: {**a, "weights_out": a["weights_out"].double()},
                          "argument 'weights_out' must have dtype"),
    "weights_out shape": (lambda a: {**a, "weights_out": torch.full((4, 3), float("nan"))},
                          r"argument 'weights_out' must have shape \[4, 2\]"),
    "weights_out not contiguous": (lambda a: {**a, "weights_out": a["weights_out"].t().contiguous().t()},
                                   "argument 'weights_out' must be contiguous"),
    "weights_out is weights": (lambda a: {**a, "weights_out": a["weights"]},
                               "argument 'weights_out' overlaps argument 'weights'"),
    "q_fp8 inside q": (lambda a: {**a, "q_fp8": a["q"].view(torch.uint8).view(-1)[: a["q_fp8"].numel()]
                                  .view(a["q_fp8"].shape)}, "argument 'q_fp8' overlaps argument 'q'"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_rejects_bad_input(case):
    mutate, message = BAD_INPUTS[case]
    assert_rejects(torch.ops.dsv4.indexer_q_rope_quant, mutate(valid_args()), f"dsv4::indexer_q_rope_quant: {message}")

