"""DeepSeek-V4 attention configurations: V4-Flash, V4-Pro and V4.1-Flash presets and tiny test configurations.

Only the attention fields of the HF config. Layer types come from ``compress_ratios`` (V4.0: 0/1 window
only, 4 C4A, 128 C128A; V4.1: 0 window only, 1 C1A, 2 C2A); the preset patterns follow the public model
cards, and a checkpoint's own config always wins (:meth:`DeepseekV4AttentionConfig.from_hf_config`).

V4.1 layers share caches: only the kv-source layers own a compressor and a compressed cache, only the
index-source layers run the indexer, and every compressed layer reads the largest source at or below it.
The candidate-source layer also publishes the best blocks of ``candidate_block_size`` entries, and the
index layers after it choose their top-k inside those blocks (the two-level selection).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..backends import resolve_kv_cache_record
from ..constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM, ROPE_DIM, SLIDING_WINDOW
from ..metadata.layer_types import MODEL_VERSIONS, LayerType, layer_types
from ..reference.topk import TOPK_SIZES
from ..rope import YarnScaling

MAX_HEADS = 128  # the attention kernels take 1 to 128 query heads
# Pretraining context 64K extended to 1M tokens: YaRN factor 16 over the original 65536 positions.
V4_YARN = YarnScaling(factor=16.0, original_max_position_embeddings=65536, beta_fast=32.0, beta_slow=1.0)
V4_MAX_POSITIONS = 1 << 20


@dataclass(frozen=True)
class DeepseekV4AttentionConfig:
    name: str
    hidden_size: int
    num_attention_heads: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    compress_ratios: tuple[int, ...]  # one per layer
    index_topk: int
    index_n_heads: int = 64
    index_head_dim: int = INDEXER_HEAD_DIM
    head_dim: int = MODEL1_HEAD_DIM
    qk_rope_head_dim: int = ROPE_DIM
    sliding_window: int = SLIDING_WINDOW
    rope_theta: float = 10000.0  # window-only layers
    compress_rope_theta: float = 160000.0  # compressed layers, with rope_scaling
    rope_scaling: YarnScaling | None = V4_YARN
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = V4_MAX_POSITIONS
    model_version: str = "v4"  # "v4" or "v4.1"
    kv_source_layer_ids: tuple[int, ...] = ()  # V4.1: layers owning a compressor and a compressed cache
    index_source_layer_ids: tuple[int, ...] = ()  # V4.1: layers running the indexer
    candidate_source_layer_id: int = -1  # V4.1: the layer publishing candidate blocks (-1: none)
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    kv_cache_dtype: str = "fp8"  # engine dtype string, resolved per layer kind (dsv4.backends)
    index_key_format: str = "fp8"  # indexer keys: "fp8" (132 B) or, V4.1, "mxfp4" (68 B)

    def __post_init__(self) -> None:
        if self.model_version not in MODEL_VERSIONS:
            raise ValueError(f"{self.name}: model_version must be one of {MODEL_VERSIONS}, got {self.model_version!r}")
        types = layer_types(self.compress_ratios, self.model_version)  # ValueError on an unsupported ratio
        for kind in ("window", "compressed"):
            resolve_kv_cache_record(self.kv_cache_dtype, self.model_version, kind)  # ValueError on a bad dtype
        if self.index_key_format not in ("fp8", "mxfp4") or (self.index_key_format == "mxfp4"
                                                               and self.model_version != "v4.1"):
            raise ValueError(f"{self.name}: index_key_format must be 'fp8' (or 'mxfp4' for V4.1), "
                             f"got {self.index_key_format!r}")
        if self.model_version == "v4.1":
            self._check_sources(types)
        fixed = {"head_dim": MODEL1_HEAD_DIM, "qk_rope_head_dim": ROPE_DIM, "index_head_dim": INDEXER_HEAD_DIM}
        for name, value in fixed.items():
            if getattr(self, name) != value:
                raise ValueError(f"{self.name}: {name} must be {value} (the fp8_ds_mla / indexer layouts), "
                                 f"got {getattr(self, name)}")
        if not 1 <= self.num_attention_heads <= MAX_HEADS:
            raise ValueError(f"{self.name}: num_attention_heads must be 1..{MAX_HEADS}, got {self.num_attention_heads}")
        if self.num_attention_heads % self.o_groups:
            raise ValueError(f"{self.name}: o_groups ({self.o_groups}) must divide num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.index_topk not in TOPK_SIZES:
            raise ValueError(f"{self.name}: index_topk must be one of {TOPK_SIZES}, got {self.index_topk}")

    def _check_sources(self, types: list[LayerType]) -> None:
        """Every compressed layer has a kv source of its own ratio and an index source reading that same cache."""
        for name in ("kv_source_layer_ids", "index_source_layer_ids"):
            for source in getattr(self, name):
                if not 0 <= source < len(types) or types[source] is LayerType.SWA_ONLY:
                    raise ValueError(f"{self.name}: {name} must name compressed layers, got layer {source}")
        for layer, kind in enumerate(types):
            if kind is LayerType.SWA_ONLY:
                continue
            kv, index = self.kv_source_of(layer), self.index_source_of(layer)
            if kv is None or index is None:
                raise ValueError(f"{self.name}: compressed layer {layer} has no kv or index source at or below it")
            if types[kv] is not kind:
                raise ValueError(f"{self.name}: layer {layer} ({kind.value}) would read the cache of layer {kv} "
                                 f"({types[kv].value})")
            if self.kv_source_of(index) != kv:
                raise ValueError(f"{self.name}: layer {layer} reads the cache of layer {kv} but takes the selection "
                                 f"of layer {index}, which scores the cache of layer {self.kv_source_of(index)}")
        if self.candidate_source_layer_id >= 0:
            if self.candidate_source_layer_id not in self.index_source_layer_ids:
                raise ValueError(f"{self.name}: candidate_source_layer_id {self.candidate_source_layer_id} must be "
                                 f"an index-source layer")
            if self.candidate_block_size <= 0 or self.candidate_topk_blocks <= 0:
                raise ValueError(f"{self.name}: candidate_block_size and candidate_topk_blocks must be positive")

    @staticmethod
    def _source_at_or_below(sources: tuple[int, ...], layer: int) -> int | None:
        below = [s for s in sources if s <= layer]
        return max(below) if below else None

    def kv_source_of(self, layer: int) -> int | None:
        """The layer whose compressor and compressed cache ``layer`` uses (itself in V4.0)."""
        if self.model_version == "v4":
            return layer
        return self._source_at_or_below(self.kv_source_layer_ids, layer)

    def index_source_of(self, layer: int) -> int | None:
        """The layer whose indexer selection ``layer`` attends (itself in V4.0)."""
        if self.model_version == "v4":
            return layer
        return self._source_at_or_below(self.index_source_layer_ids, layer)

    def uses_candidates(self, layer: int) -> bool:
        """V4.1: an index layer after the candidate source chooses inside the published blocks."""
        return 0 <= self.candidate_source_layer_id < layer and layer in self.index_source_layer_ids

    def cache_record(self, layer_kind: str) -> str:
        """The KV record of the ``"window"`` or ``"compressed"`` caches (dsv4.backends' resolution)."""
        return resolve_kv_cache_record(self.kv_cache_dtype, self.model_version, layer_kind)

    @property
    def layer_types(self) -> list[LayerType]:
        return layer_types(self.compress_ratios, self.model_version)

    @property
    def num_hidden_layers(self) -> int:
        return len(self.compress_ratios)

    def first_layers(self, count: int) -> DeepseekV4AttentionConfig:
        """The same model cut to its first ``count`` layers (all of them: its own name)."""
        layers = len(self.compress_ratios)
        if not 1 <= count <= layers:
            raise ValueError(f"{self.name} has {layers} layers: the first {count} cannot be taken")
        if count == layers:
            return self
        return replace(self, name=f"{self.name}[:{count}]", compress_ratios=self.compress_ratios[:count],
                       kv_source_layer_ids=tuple(s for s in self.kv_source_layer_ids if s < count),
                       index_source_layer_ids=tuple(s for s in self.index_source_layer_ids if s < count),
                       candidate_source_layer_id=(self.candidate_source_layer_id
                                                  if self.candidate_source_layer_id < count else -1))

    @classmethod
    def from_hf_config(cls, hf: dict, name: str = "checkpoint") -> DeepseekV4AttentionConfig:
        """Reads the attention fields of a HF ``config.json`` dict (YaRN from ``rope_scaling`` when present); a V4.1
        config (architecture ``DeepseekV41ForCausalLM``, or kv-source layer ids) also gives its sharing fields."""
        scaling = hf.get("rope_scaling")
        v41 = any("V41" in a for a in hf.get("architectures", ())) or bool(hf.get("kv_source_layer_ids"))
        yarn = None if not scaling else YarnScaling(scaling["factor"], scaling["original_max_position_embeddings"],
                                                    scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0))
        return cls(name=name, hidden_size=hf["hidden_size"], num_attention_heads=hf["num_attention_heads"],
                   q_lora_rank=hf["q_lora_rank"], o_lora_rank=hf["o_lora_rank"], o_groups=hf["o_groups"],
                   compress_ratios=tuple(hf["compress_ratios"]), index_topk=hf["index_topk"],
                   index_n_heads=hf.get("index_n_heads", 64), sliding_window=hf.get("sliding_window", SLIDING_WINDOW),
                   rope_theta=hf.get("rope_theta", 10000.0),
                   compress_rope_theta=hf.get("compress_rope_theta", 160000.0), rope_scaling=yarn,
                   rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                   max_position_embeddings=hf.get("max_position_embeddings", V4_MAX_POSITIONS),
                   model_version="v4.1" if v41 else "v4",
                   kv_source_layer_ids=tuple(hf.get("kv_source_layer_ids") or ()),
                   index_source_layer_ids=tuple(hf.get("index_source_layer_ids") or ()),
                   candidate_source_layer_id=hf.get("candidate_source_layer_id", -1),
                   candidate_topk_blocks=hf.get("candidate_topk_blocks", 0),
                   candidate_block_size=hf.get("candidate_block_size", 0))


def _alternating(num_layers: int, first_two: int) -> tuple[int, ...]:
    """Two leading layers of ratio ``first_two``, then C4A on even and C128A on odd layer indices."""
    return (first_two, first_two) + tuple(4 if i % 2 == 0 else 128 for i in range(2, num_layers))


V4_FLASH = DeepseekV4AttentionConfig(
    name="DeepSeek-V4-Flash", hidden_size=4096, num_attention_heads=64, q_lora_rank=1024, o_lora_rank=1024,
    o_groups=8, compress_ratios=_alternating(43, 0), index_topk=512)

V4_PRO = DeepseekV4AttentionConfig(
    name="DeepSeek-V4-Pro", hidden_size=7168, num_attention_heads=128, q_lora_rank=1536, o_lora_rank=1024,
    o_groups=16, compress_ratios=_alternating(61, 128), index_topk=1024)

# The real 512 (448 + 64) head and 64 x 128 indexer geometry with few heads and a small hidden size.
TINY = DeepseekV4AttentionConfig(
    name="tiny", hidden_size=256, num_attention_heads=4, q_lora_rank=128, o_lora_rank=64, o_groups=2,
    compress_ratios=(0, 4, 128), index_topk=512, index_n_heads=8, max_position_embeddings=8192)

# V4.1-Flash: 40 layers, two window-only, then ratio 2 (layers 2-19) and ratio 1 (layers 20-39); four kv
# sources, eight index sources, layer 20 publishing 2048 blocks of 8 entries (vLLM's deepseek_v41 attention).
V4_1_FLASH = DeepseekV4AttentionConfig(
    name="DeepSeek-V4.1-Flash", hidden_size=5120, num_attention_heads=64, q_lora_rank=1280, o_lora_rank=1024,
    o_groups=8, compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20, index_topk=512, index_n_heads=32,
    model_version="v4.1", kv_source_layer_ids=(2, 8, 14, 20), index_source_layer_ids=(2, 8, 14, 20, 24, 28, 32, 36),
    candidate_source_layer_id=20, candidate_topk_blocks=2048, candidate_block_size=8)

# Every V4.1 mechanism in five small layers: a consumer of each kind of source and a two-level selection.
TINY_V41 = DeepseekV4AttentionConfig(
    name="tiny-v4.1", hidden_size=256, num_attention_heads=4, q_lora_rank=128, o_lora_rank=64, o_groups=2,
    compress_ratios=(0, 2, 2, 1, 1), index_topk=512, index_n_heads=8, max_position_embeddings=8192,
    model_version="v4.1", kv_source_layer_ids=(1, 3), index_source_layer_ids=(1, 3, 4), candidate_source_layer_id=3,
    candidate_topk_blocks=96, candidate_block_size=8, index_key_format="mxfp4")

PRESETS = {"v4-flash": V4_FLASH, "v4-pro": V4_PRO, "tiny": TINY, "v4.1-flash": V4_1_FLASH, "tiny-v4.1": TINY_V41}


def get_config(name: str) -> DeepseekV4AttentionConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown DeepSeek-V4 preset {name!r}; supported: {sorted(PRESETS)}")
    return PRESETS[name]
