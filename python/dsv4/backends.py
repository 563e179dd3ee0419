"""Attention backends of DeepSeek-V4: names, metadata builders, selection and KV-cache dtype resolution.

A sparse implementation bundles the backends one platform runs: the sparse-MLA backend (compressed
caches), the indexer backend and the sliding-window builder. FlashMLA-layout backends store the
``fp8_ds_mla`` (MODEL1) byte layout for DeepSeek-V4.0 and the V4.1 records for DeepSeek-V4.1
(:func:`resolve_kv_cache_record`); the plain-row backend (FlashInfer-style) stores bf16 or e4m3 rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

import torch

from .cache import KV_LAYOUTS
from .constants import MODEL1_HEAD_DIM
from .metadata import (
    DeepseekSparseSWAMetadataBuilder,
    DeepseekV4CPUFlashMLAMetadataBuilder,
    DeepseekV4CPUIndexerMetadataBuilder,
    DeepseekV4CPUSparseSWAMetadataBuilder,
    DeepseekV4SparseMLAMetadataBuilder,
    DeepseekV32IndexerMetadataBuilder,
)

logger = logging.getLogger(__name__)

FP8_DS_MLA = "fp8_ds_mla"
NVFP4_DS_MLA = "nvfp4_ds_mla"  # DeepSeek-V4.1: fp8 window cache, fp4 compressed cache
MODEL_VERSIONS = ("v4", "v4.1")
LAYER_KINDS = ("window", "compressed")  # the sliding-window (SWA) cache, the compressed (extra) cache
# (model version, dtype string) -> record of each layer kind's cache; every "fp8*" spelling is "fp8"
KV_CACHE_RECORDS = {
    ("v4", "fp8"): {"window": "model1", "compressed": "model1"},
    ("v4.1", "fp8"): {"window": "v41_fp8", "compressed": "v41_fp8"},
    ("v4.1", NVFP4_DS_MLA): {"window": "v41_fp8", "compressed": "v41_fp4"},
}
KERNEL_BLOCK_SIZE = 256  # logical tokens per block of every DSv4 cache group
PLAIN_ROW_DTYPES = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16}  # plus any "fp8*" spelling -> e4m3


class AttentionBackendEnum(str, Enum):
    """Backend names engines pass around (plain strings are accepted wherever a member is)."""

    FLASHMLA_SPARSE_DSV4 = "FLASHMLA_SPARSE_DSV4"
    FLASHINFER_MLA_SPARSE_DSV4 = "FLASHINFER_MLA_SPARSE_DSV4"
    ROCM_FLASHMLA_SPARSE_DSV4 = "ROCM_FLASHMLA_SPARSE_DSV4"
    XPU_V4_MLA_SPARSE = "XPU_V4_MLA_SPARSE"
    CPU_V4_MLA_SPARSE = "CPU_V4_MLA_SPARSE"
    DEEPSEEK_V4_INDEXER = "DEEPSEEK_V4_INDEXER"
    CPU_V4_INDEXER = "CPU_V4_INDEXER"
    DEEPSEEK_SPARSE_SWA = "DEEPSEEK_SPARSE_SWA"


def backend_enum(name: AttentionBackendEnum | str) -> AttentionBackendEnum:
    """The member for a name; ValueError naming the supported ones otherwise."""
    try:
        return AttentionBackendEnum(name)
    except ValueError:
        supported = [member.value for member in AttentionBackendEnum]
        raise ValueError(f"unknown DeepSeek-V4 attention backend {name!r}; supported: {supported}") from None


class DeepseekV4SparseMLABackend:
    """Sparse MLA over the FlashMLA ``fp8_ds_mla`` layout (NVIDIA SM90/SM100)."""

    use_fp8_ds_mla_layout = True

    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.FLASHMLA_SPARSE_DSV4.value

    @staticmethod
    def get_builder_cls() -> type[DeepseekV4SparseMLAMetadataBuilder]:
        return DeepseekV4SparseMLAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int]:
        return [KERNEL_BLOCK_SIZE]

    @staticmethod
    def get_supported_head_sizes() -> list[int]:
        return [MODEL1_HEAD_DIM]

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, head_size: int = MODEL1_HEAD_DIM,
                           cache_dtype_str: str = FP8_DS_MLA, model_version: str = "v4",
                           layer_kind: str = "compressed") -> tuple[int, int, int]:
        """``(num_blocks, block_size, bytes)`` of the record the dtype string gives this model version and layer
        kind (584 MODEL1; V4.1: 528 fp8, 288 fp4), else plain rows of head_size."""
        if cache_dtype_str.startswith("fp8") or cache_dtype_str == NVFP4_DS_MLA:
            record = resolve_kv_cache_record(cache_dtype_str, model_version, layer_kind)
            return (num_blocks, block_size, KV_LAYOUTS[record])
        return (num_blocks, block_size, head_size)


class DeepseekV4FlashInferMLASparseBackend(DeepseekV4SparseMLABackend):
    """Plain bf16 / e4m3 rows (FlashInfer TRT-LLM sparse MLA)."""

    use_fp8_ds_mla_layout = False

    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV4.value


class DeepseekV4ROCMSparseBackend(DeepseekV4SparseMLABackend):
    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.ROCM_FLASHMLA_SPARSE_DSV4.value


class DeepseekV4XPUSparseBackend(DeepseekV4SparseMLABackend):
    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.XPU_V4_MLA_SPARSE.value


class DeepseekV4CPUSparseBackend(DeepseekV4SparseMLABackend):
    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.CPU_V4_MLA_SPARSE.value

    @staticmethod
    def get_builder_cls() -> type[DeepseekV4CPUFlashMLAMetadataBuilder]:
        return DeepseekV4CPUFlashMLAMetadataBuilder


class DeepseekV4IndexerBackend:
    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.DEEPSEEK_V4_INDEXER.value

    @staticmethod
    def get_builder_cls() -> type[DeepseekV32IndexerMetadataBuilder]:
        return DeepseekV32IndexerMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int]:
        return [KERNEL_BLOCK_SIZE]


class DeepseekV4CPUIndexerBackend(DeepseekV4IndexerBackend):
    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.CPU_V4_INDEXER.value

    @staticmethod
    def get_builder_cls() -> type[DeepseekV4CPUIndexerMetadataBuilder]:
        return DeepseekV4CPUIndexerMetadataBuilder


class DeepseekSparseSWABackend:
    @staticmethod
    def get_name() -> str:
        return AttentionBackendEnum.DEEPSEEK_SPARSE_SWA.value

    @staticmethod
    def get_builder_cls() -> type[DeepseekSparseSWAMetadataBuilder]:
        return DeepseekSparseSWAMetadataBuilder


BACKENDS = {cls.get_name(): cls for cls in (
    DeepseekV4SparseMLABackend, DeepseekV4FlashInferMLASparseBackend, DeepseekV4ROCMSparseBackend,
    DeepseekV4XPUSparseBackend, DeepseekV4CPUSparseBackend, DeepseekV4IndexerBackend, DeepseekV4CPUIndexerBackend,
    DeepseekSparseSWABackend)}


def get_backend_cls(name: AttentionBackendEnum | str) -> type:
    return BACKENDS[backend_enum(name).value]


@dataclass(frozen=True)
class SparseImpl:
    """The backends one DeepSeek-V4 attention implementation runs."""

    name: str
    mla_backend: type[DeepseekV4SparseMLABackend]
    indexer_backend: type[DeepseekV4IndexerBackend]
    swa_builder_cls: type[DeepseekSparseSWAMetadataBuilder]

    @property
    def use_fp8_ds_mla_layout(self) -> bool:
        return self.mla_backend.use_fp8_ds_mla_layout


FLASHMLA_IMPL = SparseImpl("flashmla", DeepseekV4SparseMLABackend, DeepseekV4IndexerBackend,
                           DeepseekSparseSWAMetadataBuilder)
FLASHINFER_IMPL = SparseImpl("flashinfer", DeepseekV4FlashInferMLASparseBackend, DeepseekV4IndexerBackend,
                             DeepseekSparseSWAMetadataBuilder)
ROCM_IMPL = SparseImpl("rocm", DeepseekV4ROCMSparseBackend, DeepseekV4IndexerBackend, DeepseekSparseSWAMetadataBuilder)
XPU_IMPL = SparseImpl("xpu", DeepseekV4XPUSparseBackend, DeepseekV4IndexerBackend, DeepseekSparseSWAMetadataBuilder)
CPU_IMPL = SparseImpl("cpu", DeepseekV4CPUSparseBackend, DeepseekV4CPUIndexerBackend,
                      DeepseekV4CPUSparseSWAMetadataBuilder)


@dataclass
class AttentionConfig:
    """What selection reads: the requested backend (None = platform default) and the device."""

    backend: AttentionBackendEnum | str | None = None
    device: torch.device | str = "cpu"


def platform_of(device: torch.device | str) -> str:
    """``cpu``, ``xpu``, ``rocm`` or ``cuda`` (NVIDIA) for a device."""
    device = torch.device(device)
    if device.type == "cuda":
        return "rocm" if torch.version.hip is not None else "cuda"
    if device.type in ("cpu", "xpu"):
        return device.type
    raise ValueError(f"no DeepSeek-V4 attention implementation for device {device}; supported: cpu, cuda, xpu")


PLATFORM_IMPLS = {"cpu": CPU_IMPL, "cuda": FLASHMLA_IMPL, "rocm": ROCM_IMPL, "xpu": XPU_IMPL}

_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.info(message)


def resolve_backend(config: AttentionConfig) -> AttentionBackendEnum | None:
    """The explicitly requested backend, or None when the platform default applies."""
    return None if config.backend is None else backend_enum(config.backend)


def select_sparse_impl(config: AttentionConfig) -> SparseImpl:
    """An explicit FLASHINFER_MLA_SPARSE_DSV4 request selects the plain-row implementation; otherwise the
    platform default (ROCm, CPU, XPU, or FlashMLA layout on NVIDIA). Logs the choice once."""
    requested = resolve_backend(config)
    if requested is AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV4:
        impl = FLASHINFER_IMPL
    else:
        impl = PLATFORM_IMPLS[platform_of(config.device)]
    _log_once(f"DeepSeek-V4 sparse attention: {impl.name} implementation ({impl.mla_backend.get_name()}, "
              f"{impl.indexer_backend.get_name()})")
    return impl


def _attention_backend(backend) -> type[DeepseekV4SparseMLABackend]:
    cls = backend if isinstance(backend, type) else get_backend_cls(backend)
    if not issubclass(cls, DeepseekV4SparseMLABackend):
        sparse = [name for name, c in BACKENDS.items() if issubclass(c, DeepseekV4SparseMLABackend)]
        raise ValueError(f"{cls.get_name()} stores no KV cache; KV-cache dtypes belong to one of {sparse}")
    return cls


def resolve_kv_cache_record(kv_cache_dtype: str, model_version: str = "v4", layer_kind: str = "window") -> str:
    """The record (a ``dsv4.cache`` layout) a FlashMLA-layout cache holds for an engine's kv-cache dtype string.

    DeepSeek-V4.0 (``v4``): any ``fp8*`` spelling (``fp8``, ``fp8_ds_mla``, ``fp8_e4m3``) -> ``model1`` (584 B).
    DeepSeek-V4.1 (``v4.1``): ``fp8*`` -> ``v41_fp8`` (528 B) for both caches; ``nvfp4_ds_mla`` -> ``v41_fp8`` for
    the window cache and ``v41_fp4`` (288 B) for the compressed cache. Anything else is a ValueError that lists
    what each model version supports.
    """
    if model_version not in MODEL_VERSIONS:
        raise ValueError(f"unknown DeepSeek model version {model_version!r}; supported: {MODEL_VERSIONS}")
    if layer_kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {layer_kind!r}; supported: {LAYER_KINDS}")
    key = (model_version, "fp8" if kv_cache_dtype.startswith("fp8") else kv_cache_dtype)
    if key not in KV_CACHE_RECORDS:
        supported = "; ".join(f"{version}: " + ", ".join(f"'{d}'" + (" (any 'fp8*' spelling)" if d == "fp8" else "")
                                                        for v, d in KV_CACHE_RECORDS if v == version)
                              for version in MODEL_VERSIONS)
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported for DeepSeek {model_version}; "
                         f"supported: {supported}")
    return KV_CACHE_RECORDS[key][layer_kind]


def resolve_kv_cache_dtype(backend, kv_cache_dtype: str, cache_config=None,
                           model_version: str = "v4") -> tuple[str, torch.dtype]:
    """``(cache dtype string, torch dtype)`` of the KV caches of ``backend`` (a class, member or name).

    Plain-row backend: ``fp8*`` -> float8_e4m3fn, ``auto``/``bfloat16`` -> bfloat16, string unchanged.
    FlashMLA-layout backends: any ``fp8*`` spelling -> ``("fp8_ds_mla", uint8)``, written back onto
    ``cache_config.cache_dtype`` when given; for DeepSeek-V4.1 also ``nvfp4_ds_mla`` -> ``("nvfp4_ds_mla",
    uint8)`` (the records per layer kind: :func:`resolve_kv_cache_record`). Anything else is a ValueError naming
    the supported values.
    """
    cls = _attention_backend(backend)
    if not cls.use_fp8_ds_mla_layout:
        if kv_cache_dtype.startswith("fp8"):
            return kv_cache_dtype, torch.float8_e4m3fn
        if kv_cache_dtype not in PLAIN_ROW_DTYPES:
            raise ValueError(f"{cls.get_name()} does not support kv_cache_dtype {kv_cache_dtype!r}; supported: "
                             f"{sorted(PLAIN_ROW_DTYPES)} or any 'fp8*' dtype")
        return kv_cache_dtype, PLAIN_ROW_DTYPES[kv_cache_dtype]
    if model_version == "v4.1" and kv_cache_dtype == NVFP4_DS_MLA:
        return NVFP4_DS_MLA, torch.uint8
    resolve_kv_cache_record("fp8", model_version)  # an unknown model version raises here
    if not kv_cache_dtype.startswith("fp8"):
        also = f" or '{NVFP4_DS_MLA}'" if model_version == "v4.1" else f" (DeepSeek-V4.1 also takes '{NVFP4_DS_MLA}')"
        raise ValueError(f"{cls.get_name()} stores the {FP8_DS_MLA} layout and needs an fp8 kv_cache_dtype "
                         f"('fp8', '{FP8_DS_MLA}', 'fp8_e4m3'){also}, got {kv_cache_dtype!r}")
    if cache_config is not None and cache_config.cache_dtype != FP8_DS_MLA:
        _log_once(f"{cls.get_name()}: kv_cache_dtype {kv_cache_dtype!r} canonicalised to {FP8_DS_MLA!r}")
        cache_config.cache_dtype = FP8_DS_MLA
    return FP8_DS_MLA, torch.uint8
