"""torch.compile(fullgraph=True) and meta-device tracing through the typed wrappers."""

import pytest
import torch

from conftest import CUDA_TIERS, rope_table
from dsv4 import cache, ops

BLOCK = 16


def writer_step(q, kv, k, positions, slots, rope, swa_cache, k_cache, req_ids, block_table):
    q_out = ops.qnorm_rope_kv_insert(q, kv, positions, rope, slots, swa_cache, BLOCK, padded_heads=8)
    ops.indexer_k_quant_insert(k, slots, k_cache, BLOCK)
    rows = ops.dequantize_kv_gather(swa_cache, slots, BLOCK)
    global_slots = ops.map_local_to_global_slots(positions.view(-1, 1), req_ids, block_table, BLOCK)
    o = ops.inverse_rope(q_out, positions, rope, out_dtype=torch.float32)
    return q_out, rows, global_slots, o


def make_inputs(device="cpu"):
    t = 5
    args = dict(
        q=torch.randn(t, 4, 512).bfloat16(),
        kv=torch.randn(t, 512).bfloat16(),
        k=torch.randn(t, 128).bfloat16(),
        positions=torch.arange(t) + 30,
        slots=torch.tensor([3, -1, 17, 18, 40]),
        rope=rope_table(64),
        swa_cache=cache.allocate_kv_cache(4, BLOCK),
        k_cache=cache.allocate_indexer_k_cache(4, BLOCK),
        req_ids=torch.zeros(t, dtype=torch.int32),
        block_table=torch.tensor([[2, 0, 1, 3]], dtype=torch.int32),
    )
    return {name: value.to(device) for name, value in args.items()}


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA_TIERS else []))
def test_compile_fullgraph_matches_eager(device):
    eager_inputs, compiled_inputs = make_inputs(device), make_inputs(device)
    for name in ("swa_cache", "k_cache"):
        compiled_inputs[name].copy_(eager_inputs[name])
    for name in ("q", "kv", "k"):
        compiled_inputs[name] = eager_inputs[name].clone()
    expected = writer_step(**eager_inputs)
    got = torch.compile(writer_step, fullgraph=True)(**compiled_inputs)
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)
    assert torch.equal(eager_inputs["swa_cache"], compiled_inputs["swa_cache"])
    assert torch.equal(eager_inputs["k_cache"], compiled_inputs["k_cache"])


def test_meta_device_shapes():
    q_out, rows, global_slots, o = writer_step(**make_inputs("meta"))
    assert q_out.shape == (5, 8, 512) and q_out.dtype == torch.bfloat16
    assert rows.shape == (5, 512) and rows.dtype == torch.bfloat16
    assert global_slots.shape == (5, 1) and global_slots.dtype == torch.int64
    assert o.shape == (5, 8, 512) and o.dtype == torch.float32


@pytest.mark.parametrize("moved", ["swa_cache", "positions", "q"])
def test_mixed_devices_are_rejected(moved):
    """A tensor on another device than the rest is a clean error naming the op and the argument."""
    inputs = make_inputs()
    inputs[moved] = inputs[moved].to("meta")
    names = {"swa_cache": "kv_cache", "positions": "positions", "q": "kv"}  # the schema name reported
    message = f"dsv4::qnorm_rope_kv_insert: argument '{names[moved]}' must be on the same device"
    with pytest.raises(RuntimeError, match=message):
        ops.qnorm_rope_kv_insert(inputs["q"], inputs["kv"], inputs["positions"], inputs["rope"], inputs["slots"],
                                 inputs["swa_cache"], BLOCK)
