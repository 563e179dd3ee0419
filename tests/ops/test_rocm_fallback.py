"""ROCm fallback on a simulated ROCm torch: ops without a kernel reach their reference, warning once per op.

A CPU-only torch has no device behind the CUDA key, so the fallbacks are registered in a test-only namespace that
carries dsv4's schemas, for the CPU key; the code path (kernel lookup, registration, warning, reference call) is the
one dsv4 runs on ROCm for the CUDA key.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import dsv4  # noqa: F401  (defines the dsv4 schemas the test namespace copies)
from dsv4 import rocm_fallback
from dsv4.reference import sparse_mla as ref_sparse_mla
from dsv4.reference import topk as ref_topk

TEST_NAMESPACE = "dsv4_rocm_fallback_test"
NATIVE_OP = "fp8_mqa_logits"  # given a kernel of its own in the test namespace: must not be replaced


def _define_test_namespace() -> list[torch.library.Library]:
    """The schemas of every fallback op under TEST_NAMESPACE, and a native kernel for NATIVE_OP only."""
    defs = torch.library.Library(TEST_NAMESPACE, "DEF")
    for name in rocm_fallback.OP_IMPLS:
        schema = str(getattr(torch.ops.dsv4, name).default._schema)
        defs.define(schema.removeprefix("dsv4::"))
    native = torch.library.Library(TEST_NAMESPACE, "IMPL")
    native.impl(NATIVE_OP, lambda *args: torch.zeros(args[0].shape[0], args[1].shape[0]), "CPU")
    return [defs, native]


@pytest.fixture(scope="module")
def fallback_ops():
    """Simulates a ROCm torch and registers the fallbacks once (registrations live as long as the process)."""
    libraries = _define_test_namespace()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.version, "hip", "6.4.0", raising=False)
        registered = rocm_fallback.register_reference_fallbacks(TEST_NAMESPACE, "CPU")
    yield registered
    del libraries


def _topk_inputs():
    scores = torch.randn(6, 1500)
    scores[0, 7] = float("nan")
    lengths = torch.tensor([1500, 600, 512, 3, 0, 1400], dtype=torch.int32)
    page_table = torch.randint(-1, 40, (6, 24), dtype=torch.int32)
    return scores, lengths, page_table


def test_registers_only_ops_without_a_kernel(fallback_ops):
    assert fallback_ops == frozenset(rocm_fallback.OP_IMPLS) - {NATIVE_OP}
    for name in rocm_fallback.OP_IMPLS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{TEST_NAMESPACE}::{name}", "CPU")


def test_nothing_registered_without_rocm(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert rocm_fallback.register_reference_fallbacks(TEST_NAMESPACE, "CPU") == frozenset()


def test_fallback_matches_reference_and_warns_once(fallback_ops):
    scores, lengths, page_table = _topk_inputs()
    raw = torch.full((6, 512), 7, dtype=torch.int32)
    slots = torch.full_like(raw, 7)
    op = getattr(torch.ops, TEST_NAMESPACE).topk_transform
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op(scores, lengths, None, page_table, 64, raw, slots)
        op(scores, lengths, None, page_table, 64, raw, slots)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1
    assert f"{TEST_NAMESPACE}::topk_transform" in messages[0] and "no ROCm kernel" in messages[0]
    expected_raw, expected_slots = ref_topk.topk_transform(scores, lengths, 512, None, page_table, 64)
    assert torch.equal(raw, expected_raw)
    assert torch.equal(slots, expected_slots)


def test_fallback_returns_reference_outputs(fallback_ops):
    s_q, heads, s_kv, topk = 5, 16, 40, 64
    q = torch.randn(s_q, heads, 512).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 512).to(torch.bfloat16)
    indices = torch.randint(-1, s_kv + 3, (s_q, 1, topk), dtype=torch.int32)
    sink = torch.randn(heads)
    topk_length = torch.tensor([64, 10, 0, 33, 64], dtype=torch.int32)
    op = getattr(torch.ops, TEST_NAMESPACE).sparse_mla_prefill
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = op(q, kv, indices, 0.04, 512, sink, topk_length)
        again = op(q, kv, indices, 0.04, 512, sink, topk_length)
    assert sum(f"{TEST_NAMESPACE}::sparse_mla_prefill" in str(w.message) for w in caught) == 1
    expected = ref_sparse_mla.sparse_mla_prefill(q, kv, indices, 0.04, 512, sink, topk_length)
    for got, second, want in zip(out, again, expected, strict=True):
        assert torch.equal(got, want)
        assert torch.equal(second, want)


def test_native_kernel_kept(fallback_ops):
    q = torch.zeros(3, 2, 128).to(torch.float8_e4m3fn)
    k = torch.zeros(5, 128).to(torch.float8_e4m3fn)
    ks = torch.zeros(3, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = getattr(torch.ops, TEST_NAMESPACE).fp8_mqa_logits(q, k, torch.ones(5), torch.ones(3, 2), ks, ks, True)
    assert torch.equal(out, torch.zeros(3, 5))
