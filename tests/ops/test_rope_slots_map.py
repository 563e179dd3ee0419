"""dsv4::map_local_to_global_slots (request-local positions -> global slot ids) against its reference."""

from __future__ import annotations

import pytest
import torch

from conftest import INDEX_DTYPES, PAGE_SIZES, assert_rejects
from dsv4 import ops
from dsv4.reference import rope_slots

NUM_REQUESTS, MAX_BLOCKS, NUM_PHYSICAL_BLOCKS = 4, 6, 40
UNALLOCATED = -1  # block-table entry of a block the request does not own


def random_block_table(dtype=torch.int32) -> torch.Tensor:
    """Distinct physical blocks per request, with the trailing blocks of some requests unallocated."""
    table = torch.randperm(NUM_PHYSICAL_BLOCKS)[: NUM_REQUESTS * MAX_BLOCKS].reshape(NUM_REQUESTS, MAX_BLOCKS)
    table[1, MAX_BLOCKS - 2 :] = UNALLOCATED
    table[3, MAX_BLOCKS - 1] = UNALLOCATED
    return table.to(dtype)


def random_local(rows: int, cols: int, block_size: int, dtype) -> torch.Tensor:
    """Local positions from just below 0 to past the table's reach, so every unmapped case occurs."""
    return torch.randint(-3, (MAX_BLOCKS + 1) * block_size, (rows, cols)).to(dtype)


def run_and_check(local, req_ids, block_table, block_size):
    out = ops.map_local_to_global_slots(local, req_ids, block_table, block_size)
    expected = rope_slots.map_local_to_global_slots(local, req_ids, block_table, block_size)
    assert out.dtype == local.dtype and out.is_contiguous()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("local_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("block_size", PAGE_SIZES)
def test_page_sizes(isa, block_size, local_dtype):
    rows, cols = 9, 130  # a sliding window's worth of columns
    req_ids = torch.randint(0, NUM_REQUESTS, (rows,), dtype=torch.int64)
    run_and_check(random_local(rows, cols, block_size, local_dtype), req_ids, random_block_table(), block_size)


def test_strided_inputs(isa):
    rows, cols, block_size = 8, 40, 4
    local = random_local(rows, 2 * cols, block_size, torch.int64)[:, ::2]
    req_ids = torch.randint(0, NUM_REQUESTS, (2 * rows,), dtype=torch.int32)[::2]
    block_table = random_block_table(torch.int64).t().contiguous().t()  # column-major table
    run_and_check(local, req_ids, block_table, block_size)


def test_out_of_range_requests_map_to_invalid(isa):
    rows, cols, block_size = 4, 16, 2
    req_ids = torch.tensor([-1, NUM_REQUESTS, 0, NUM_REQUESTS - 1])
    local, block_table = random_local(rows, cols, block_size, torch.int32).abs(), random_block_table()
    assert torch.all(ops.map_local_to_global_slots(local, req_ids, block_table, block_size)[:2] == -1)
    run_and_check(local, req_ids, block_table, block_size)


@pytest.mark.parametrize("rows,cols", [(0, 16), (3, 0)])
def test_empty(isa, rows, cols):
    run_and_check(random_local(rows, cols, 4, torch.int64), torch.zeros(rows, dtype=torch.int64),
                  random_block_table(), 4)


@pytest.mark.parametrize("num_requests,max_blocks", [(NUM_REQUESTS, 0), (0, MAX_BLOCKS)])
def test_empty_block_table_maps_nothing(isa, num_requests, max_blocks):
    local = random_local(3, 16, 4, torch.int64)
    block_table = torch.empty(num_requests, max_blocks, dtype=torch.int32)
    out = ops.map_local_to_global_slots(local, torch.zeros(3, dtype=torch.int64), block_table, 4)
    assert torch.all(out == -1)
    run_and_check(local, torch.zeros(3, dtype=torch.int64), block_table, 4)


def test_reference_by_hand():
    block_table = torch.tensor([[5, 2, UNALLOCATED], [7, 0, 1]])
    local = torch.tensor([[0, 3, 4, 7, 8, 12, -1], [0, 5, 11, 12, -1, 2, 9]], dtype=torch.int32)
    req_ids = torch.tensor([0, 1])
    expected = torch.tensor([[20, 23, 8, 11, -1, -1, -1], [28, 1, 7, -1, -1, 30, 5]], dtype=torch.int32)
    assert torch.equal(rope_slots.map_local_to_global_slots(local, req_ids, block_table, 4), expected)
    assert torch.equal(ops.map_local_to_global_slots(local, req_ids, block_table, 4), expected)


def test_int64_slots_past_2_to_the_32(isa):
    """A block id of 2^30 at block size 4: slot 4,294,967,297 needs (and gets) 64 bits."""
    table = torch.tensor([[2**30, 5]])
    local = torch.tensor([[1, 6, -1]])
    out = ops.map_local_to_global_slots(local, torch.tensor([0]), table, 4)
    assert out.tolist() == [[4 * 2**30 + 1, 22, -1]]


def test_block_size_2_to_the_62_with_small_pages(isa):
    table = torch.tensor([[0, 1]])
    out = ops.map_local_to_global_slots(torch.tensor([[5, 2**62 + 3]]), torch.tensor([0]), table, 2**62)
    assert out.tolist() == [[5, 2**62 + 3]]


def test_opcheck(opcheck):
    args = (random_local(3, 8, 4, torch.int64), torch.randint(0, NUM_REQUESTS, (3,)), random_block_table(), 4)
    opcheck(torch.ops.dsv4.map_local_to_global_slots.default, args)


# ---- bad inputs: a RuntimeError naming the op and the argument ----


def valid_args() -> dict:
    return dict(local_indices=random_local(3, 8, 4, torch.int64), req_ids=torch.randint(0, NUM_REQUESTS, (3,)),
                block_table=random_block_table(), block_size=4)


BAD_INPUTS = {
    "local dtype": (lambda a: {**a, "local_indices": a["local_indices"].float()},
                    "argument 'local_indices' must have dtype"),
    "local rank": (lambda a: {**a, "local_indices": a["local_indices"][0]},
                   "argument 'local_indices' must have 2 dimensions"),
    "req_ids dtype": (lambda a: {**a, "req_ids": a["req_ids"].to(torch.int16)}, "argument 'req_ids' must have dtype"),
    "req_ids length": (lambda a: {**a, "req_ids": a["req_ids"][:2]}, "argument 'req_ids' must have size 3"),
    "block_table rank": (lambda a: {**a, "block_table": a["block_table"][0]},
                         "argument 'block_table' must have 2 dimensions"),
    "block_table dtype": (lambda a: {**a, "block_table": a["block_table"].double()},
                          "argument 'block_table' must have dtype"),
    "block_size zero": (lambda a: {**a, "block_size": 0}, "argument 'block_size' must be positive"),
    "int32 slots past 2^31": (lambda a: {**a, "local_indices": a["local_indices"].int(),
                                         "block_table": torch.full((NUM_REQUESTS, MAX_BLOCKS), 2**30)},
                              "argument 'block_table' entry \\[0, 0\\] is 1073741824.*int32 slot"),
    "int64 slots past 2^63": (lambda a: {**a, "block_size": 2**62}, "argument 'block_table' entry.*int64 slot"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_rejects_bad_input(case):
    mutate, message = BAD_INPUTS[case]
    assert_rejects(torch.ops.dsv4.map_local_to_global_slots, mutate(valid_args()),
                   f"dsv4::map_local_to_global_slots: {message}")
