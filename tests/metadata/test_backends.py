"""dsv4.backends: names and builders of the backends, implementation selection, KV-cache dtype resolution."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from dsv4 import backends
from dsv4.backends import (
    AttentionBackendEnum,
    AttentionConfig,
    DeepseekV4CPUIndexerBackend,
    DeepseekV4CPUSparseBackend,
    DeepseekV4FlashInferMLASparseBackend,
    DeepseekV4IndexerBackend,
    DeepseekV4SparseMLABackend,
    resolve_backend,
    resolve_kv_cache_dtype,
    select_sparse_impl,
)
from dsv4.metadata import (
    DeepseekV4CPUFlashMLAMetadataBuilder,
    DeepseekV4CPUIndexerMetadataBuilder,
    DeepseekV4CPUSparseSWAMetadataBuilder,
    DeepseekV4SparseMLAMetadataBuilder,
    DeepseekV32IndexerMetadataBuilder,
)


def test_cpu_backends():
    assert issubclass(DeepseekV4CPUSparseBackend, DeepseekV4SparseMLABackend)
    assert DeepseekV4CPUSparseBackend.get_name() == "CPU_V4_MLA_SPARSE"
    assert DeepseekV4CPUSparseBackend.get_builder_cls() is DeepseekV4CPUFlashMLAMetadataBuilder
    assert issubclass(DeepseekV4CPUIndexerBackend, DeepseekV4IndexerBackend)
    assert DeepseekV4CPUIndexerBackend.get_name() == "CPU_V4_INDEXER"
    assert DeepseekV4CPUIndexerBackend.get_builder_cls() is DeepseekV4CPUIndexerMetadataBuilder
    assert issubclass(DeepseekV4CPUFlashMLAMetadataBuilder, DeepseekV4SparseMLAMetadataBuilder)
    assert issubclass(DeepseekV4CPUIndexerMetadataBuilder, DeepseekV32IndexerMetadataBuilder)


def test_every_backend_name_is_an_enum_member():
    assert set(backends.BACKENDS) == {member.value for member in AttentionBackendEnum}
    assert DeepseekV4SparseMLABackend.get_kv_cache_shape(10, 64) == (10, 64, 584)
    assert DeepseekV4SparseMLABackend.get_kv_cache_shape(10, 64, 512, "bfloat16") == (10, 64, 512)
    assert DeepseekV4SparseMLABackend.get_supported_kernel_block_sizes() == [256]
    assert DeepseekV4SparseMLABackend.get_kv_cache_shape(10, 64, 512, "fp8", "v4.1") == (10, 64, 528)
    assert DeepseekV4SparseMLABackend.get_kv_cache_shape(10, 64, 512, "nvfp4_ds_mla", "v4.1") == (10, 64, 288)
    assert DeepseekV4SparseMLABackend.get_kv_cache_shape(10, 64, 512, "nvfp4_ds_mla", "v4.1", "window") == (10, 64,
                                                                                                          528)


@pytest.mark.parametrize("dtype, version, kind, record", [
    ("fp8", "v4", "window", "model1"), ("fp8_ds_mla", "v4", "compressed", "model1"),
    ("fp8", "v4.1", "window", "v41_fp8"), ("fp8_ds_mla", "v4.1", "compressed", "v41_fp8"),
    ("fp8_e4m3", "v4.1", "compressed", "v41_fp8"), ("nvfp4_ds_mla", "v4.1", "window", "v41_fp8"),
    ("nvfp4_ds_mla", "v4.1", "compressed", "v41_fp4"),
])
def test_kv_cache_records_per_model_version_and_layer_kind(dtype, version, kind, record):
    assert backends.resolve_kv_cache_record(dtype, version, kind) == record


def test_unsupported_records_list_what_each_version_takes():
    with pytest.raises(ValueError, match=r"not supported for DeepSeek v4; supported: v4: 'fp8'.*v4.1: .*nvfp4_ds_mla"):
        backends.resolve_kv_cache_record("nvfp4_ds_mla", "v4")
    with pytest.raises(ValueError, match="unknown DeepSeek model version"):
        backends.resolve_kv_cache_record("fp8", "v5")
    with pytest.raises(ValueError, match="unknown layer kind"):
        backends.resolve_kv_cache_record("fp8", "v4.1", "indexer")
    assert resolve_kv_cache_dtype("CPU_V4_MLA_SPARSE", "nvfp4_ds_mla", None, "v4.1") == ("nvfp4_ds_mla", torch.uint8)
    with pytest.raises(ValueError, match="DeepSeek-V4.1 also takes 'nvfp4_ds_mla'"):
        resolve_kv_cache_dtype("CPU_V4_MLA_SPARSE", "nvfp4_ds_mla", None)


@pytest.mark.parametrize("requested, expected", [
    (None, None),
    ("FLASHINFER_MLA_SPARSE_DSV4", AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV4),
    (AttentionBackendEnum.CPU_V4_MLA_SPARSE, AttentionBackendEnum.CPU_V4_MLA_SPARSE),
])
def test_resolve_backend(requested, expected):
    assert resolve_backend(AttentionConfig(backend=requested)) is expected


def test_unknown_backend_names_the_supported_ones():
    with pytest.raises(ValueError, match="FLASHMLA_SPARSE_DSV4"):
        resolve_backend(AttentionConfig(backend="FLASHINFER_MLA_SPARSE"))


@pytest.mark.parametrize("requested, device, platform, impl", [
    (None, "cpu", "cpu", backends.CPU_IMPL),
    ("CPU_V4_MLA_SPARSE", "cpu", "cpu", backends.CPU_IMPL),
    ("FLASHINFER_MLA_SPARSE_DSV4", "cpu", "cpu", backends.FLASHINFER_IMPL),
    (None, "cuda", "cuda", backends.FLASHMLA_IMPL),
    ("FLASHMLA_SPARSE_DSV4", "cuda", "cuda", backends.FLASHMLA_IMPL),
    ("FLASHINFER_MLA_SPARSE_DSV4", "cuda", "cuda", backends.FLASHINFER_IMPL),
    (None, "cuda", "rocm", backends.ROCM_IMPL),
    (None, "xpu", "xpu", backends.XPU_IMPL),
])
def test_select_sparse_impl(monkeypatch, requested, device, platform, impl):
    monkeypatch.setattr(backends, "platform_of", lambda _: platform)
    assert select_sparse_impl(AttentionConfig(backend=requested, device=device)) is impl


def test_cpu_impl_runs_the_cpu_builders():
    impl = select_sparse_impl(AttentionConfig())
    assert impl.mla_backend.get_builder_cls() is DeepseekV4CPUFlashMLAMetadataBuilder
    assert impl.indexer_backend.get_builder_cls() is DeepseekV4CPUIndexerMetadataBuilder
    assert impl.swa_builder_cls is DeepseekV4CPUSparseSWAMetadataBuilder
    assert impl.use_fp8_ds_mla_layout


def test_selection_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(backends, "_logged", set())
    with caplog.at_level(logging.INFO, logger="dsv4.backends"):
        for _ in range(3):
            select_sparse_impl(AttentionConfig())
    assert [r.levelname for r in caplog.records] == ["INFO"] and "cpu implementation" in caplog.text


@pytest.mark.parametrize("kv_cache_dtype, torch_dtype", [
    ("fp8", torch.float8_e4m3fn),
    ("fp8_e4m3", torch.float8_e4m3fn),
    ("fp8_ds_mla", torch.float8_e4m3fn),
    ("auto", torch.bfloat16),
    ("bfloat16", torch.bfloat16),
])
def test_plain_row_dtypes(kv_cache_dtype, torch_dtype):
    config = SimpleNamespace(cache_dtype=kv_cache_dtype)
    for backend in ("FLASHINFER_MLA_SPARSE_DSV4", DeepseekV4FlashInferMLASparseBackend):
        assert resolve_kv_cache_dtype(backend, kv_cache_dtype, config) == (kv_cache_dtype, torch_dtype)
    assert config.cache_dtype == kv_cache_dtype


def test_plain_row_rejects_other_dtypes():
    with pytest.raises(ValueError, match=r"supported: \['auto', 'bfloat16'\] or any 'fp8\*'"):
        resolve_kv_cache_dtype("FLASHINFER_MLA_SPARSE_DSV4", "float16", None)


@pytest.mark.parametrize("backend", ["FLASHMLA_SPARSE_DSV4", "CPU_V4_MLA_SPARSE", "ROCM_FLASHMLA_SPARSE_DSV4",
                                     "XPU_V4_MLA_SPARSE", AttentionBackendEnum.CPU_V4_MLA_SPARSE,
                                     DeepseekV4CPUSparseBackend])
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_ds_mla"])
def test_flashmla_layout_canonicalises(backend, kv_cache_dtype):
    config = SimpleNamespace(cache_dtype=kv_cache_dtype)
    assert resolve_kv_cache_dtype(backend, kv_cache_dtype, config) == ("fp8_ds_mla", torch.uint8)
    assert config.cache_dtype == "fp8_ds_mla"
    assert resolve_kv_cache_dtype(backend, kv_cache_dtype, None) == ("fp8_ds_mla", torch.uint8)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16"])
def test_flashmla_layout_needs_fp8(kv_cache_dtype):
    with pytest.raises(ValueError, match=r"needs an fp8 kv_cache_dtype \('fp8', 'fp8_ds_mla', 'fp8_e4m3'\)"):
        resolve_kv_cache_dtype("CPU_V4_MLA_SPARSE", kv_cache_dtype, None)


def test_canonicalisation_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(backends, "_logged", set())
    with caplog.at_level(logging.INFO, logger="dsv4.backends"):
        for _ in range(2):
            resolve_kv_cache_dtype("FLASHMLA_SPARSE_DSV4", "fp8", SimpleNamespace(cache_dtype="fp8"))
    assert caplog.text.count("canonicalised") == 1


def test_indexer_backends_have_no_kv_dtype():
    with pytest.raises(ValueError, match="stores no KV cache"):
        resolve_kv_cache_dtype("CPU_V4_INDEXER", "fp8", None)
