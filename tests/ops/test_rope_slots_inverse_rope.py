"""dsv4::inverse_rope (undo the GPT-J RoPE of the attention output) against its reference."""

from __future__ import annotations

import pytest
import torch

from conftest import INDEX_DTYPES, MAX_POSITION, assert_rejects, random_positions, rope_table, ulp_distance, with_last
from dsv4 import ops
from dsv4.constants import MODEL1_HEAD_DIM, ROPE_DIM, V32_HEAD_DIM
from dsv4.reference import rope_slots

MAX_ULP = 1  # in the output dtype, fp32 included: the op is one rotation in fp32
MIN_EXACT_FRACTION = 0.99
ROUND_TRIP_TOL = 1e-5

HEAD_COUNTS = [1, 8, 16, 64, 128]


def run_and_check(o, positions, cos_sin, out_dtype):
    out = torch.full(o.shape, float("nan"), dtype=out_dtype)
    assert ops.inverse_rope(o, positions, cos_sin, out=out) is out
    expected = rope_slots.inverse_rope(o, positions, cos_sin, out_dtype)
    ulp = ulp_distance(out, expected)
    assert torch.all(ulp <= MAX_ULP)
    assert ulp.numel() == 0 or (ulp == 0).float().mean() >= MIN_EXACT_FRACTION


@pytest.mark.parametrize("heads", HEAD_COUNTS)
def test_head_counts(isa, heads):
    tokens = 6
    o = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    run_and_check(o, random_positions(tokens), rope_table(MAX_POSITION), torch.float32)


@pytest.mark.parametrize(
    "dtype,out_dtype,head_dim,rope_dim",
    [
        (torch.bfloat16, torch.bfloat16, MODEL1_HEAD_DIM, ROPE_DIM),
        (torch.float16, torch.float32, ROPE_DIM, ROPE_DIM),  # the whole head is rotated
        (torch.float32, torch.float32, V32_HEAD_DIM, ROPE_DIM),
        (torch.float32, torch.float16, 128, 32),  # a narrower rope table
    ],
)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_dtypes_and_head_dims(isa, dtype, out_dtype, head_dim, rope_dim, index_dtype):
    tokens, heads = 5, 8
    o = torch.randn(tokens, heads, head_dim).to(dtype)
    run_and_check(o, random_positions(tokens, index_dtype), rope_table(MAX_POSITION, rope_dim), out_dtype)


def test_strided_inputs(isa):
    tokens, heads = 7, 16
    o = torch.randn(heads, tokens, MODEL1_HEAD_DIM).bfloat16().transpose(0, 1)  # head-major storage
    cos_sin = torch.randn(MAX_POSITION, 2 * ROPE_DIM)[:, :ROPE_DIM]  # padded table rows
    cos_sin.copy_(rope_table(MAX_POSITION))
    run_and_check(o, random_positions(2 * tokens)[::2], cos_sin, torch.float32)


def test_empty_batch(isa):
    run_and_check(torch.randn(0, 8, MODEL1_HEAD_DIM).bfloat16(), random_positions(0), rope_table(MAX_POSITION),
                  torch.float32)


def test_wrapper_default_dtype():
    o, positions, cos_sin = torch.randn(3, 2, MODEL1_HEAD_DIM).bfloat16(), random_positions(3), rope_table(MAX_POSITION)
    out = ops.inverse_rope(o, positions, cos_sin)
    assert out.dtype == torch.bfloat16
    assert torch.all(ulp_distance(out, rope_slots.inverse_rope(o, positions, cos_sin)) <= MAX_ULP)


def test_undoes_forward_rope(isa):
    """Independent of the reference's inverse: the op recovers x from the forward-rotated x."""
    tokens, heads = 5, 4
    x = torch.randn(tokens, heads, MODEL1_HEAD_DIM)
    positions, cos_sin = random_positions(tokens), rope_table(MAX_POSITION)
    rotated = rope_slots.apply_rope(x, positions, cos_sin)
    assert not torch.allclose(rotated, x, rtol=ROUND_TRIP_TOL, atol=ROUND_TRIP_TOL)
    torch.testing.assert_close(ops.inverse_rope(rotated, positions, cos_sin), x, rtol=ROUND_TRIP_TOL,
                               atol=ROUND_TRIP_TOL)


def test_apply_rope_is_complex_rotation():
    """The shared reference helper: pair (x[2i], x[2i+1]) times exp(i * theta) with (cos, sin) from the table."""
    tokens, heads, nope = 4, 3, 16
    x = torch.randn(tokens, heads, nope + ROPE_DIM, dtype=torch.float64)
    positions, cos_sin = random_positions(tokens), rope_table(MAX_POSITION)
    rows = cos_sin[positions].double()
    phase = torch.complex(rows[:, : ROPE_DIM // 2], rows[:, ROPE_DIM // 2 :])[:, None, :]
    pairs = torch.view_as_complex(x[..., nope:].reshape(tokens, heads, -1, 2).contiguous())
    expected = torch.cat([x[..., :nope], torch.view_as_real(pairs * phase).flatten(-2)], dim=-1)
    torch.testing.assert_close(rope_slots.apply_rope(x, positions, cos_sin), expected.float())
    inverse = torch.view_as_real(pairs * phase.conj()).flatten(-2)
    torch.testing.assert_close(rope_slots.apply_rope(x, positions, cos_sin, inverse=True)[..., nope:], inverse.float())


def test_opcheck(opcheck):
    o = torch.randn(3, 2, MODEL1_HEAD_DIM).bfloat16()
    out = torch.full(o.shape, float("nan"))
    args = (o, random_positions(3), rope_table(MAX_POSITION), out)
    opcheck(torch.ops.dsv4.inverse_rope.default, args)


# ---- bad inputs: a RuntimeError naming the op and the argument ----


def valid_args() -> dict:
    o = torch.randn(4, 2, MODEL1_HEAD_DIM).bfloat16()
    return dict(o=o, positions=random_positions(4), cos_sin_cache=rope_table(MAX_POSITION),
                out=torch.full(o.shape, float("nan")))


BAD_INPUTS = {
    "o dtype": (lambda a: {**a, "o": a["o"].to(torch.int32)}, "argument 'o' must have dtype"),
    "o rank": (lambda a: {**a, "o": a["o"][:, 0]}, "argument 'o' must have 3 dimensions"),
    "o last dim strided": (lambda a: {**a, "o": a["o"].repeat_interleave(2, -1)[..., ::2]},
                           "argument 'o' must be contiguous in its last dimension"),
    "o head dim below rope dim": (lambda a: {**a, "o": a["o"][..., :32], "out": a["out"][..., :32].contiguous()},
                                  "argument 'o' head dim 32 must be in"),
    "o head dim too large": (lambda a: {**a, "o": torch.randn(4, 2, 640), "out": torch.randn(4, 2, 640)},
                             "argument 'o' head dim 640 must be in"),
    "positions dtype": (lambda a: {**a, "positions": a["positions"].float()}, "argument 'positions' must have dtype"),
    "positions length": (lambda a: {**a, "positions": a["positions"][:-1]}, "argument 'positions' must have size"),
    "position past the rope table": (lambda a: {**a, "positions": with_last(a["positions"], MAX_POSITION)},
                                     "argument 'positions' entry 3 is 300"),
    "cos_sin_cache odd width": (lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"][:, :63].contiguous()},
                                "argument 'cos_sin_cache' must have an even, positive width"),
    "cos_sin_cache dtype": (lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"].double()},
                            "argument 'cos_sin_cache' must have dtype"),
    "out dtype": (lambda a: {**a, "out": a["out"].int()}, "argument 'out' must have dtype"),
    "out shape": (lambda a: {**a, "out": a["out"][1:]}, "argument 'out' must have o's shape"),
    "out not contiguous": (lambda a: {**a, "out": a["out"].transpose(0, 1).contiguous().transpose(0, 1)},
                           "argument 'out' must be contiguous"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_rejects_bad_input(case):
    mutate, message = BAD_INPUTS[case]
    assert_rejects(torch.ops.dsv4.inverse_rope, mutate(valid_args()), f"dsv4::inverse_rope: {message}")
