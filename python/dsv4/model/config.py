"""DeepSeek-V4 attention configurations: V4-Flash and V4-Pro presets and a tiny test configuration.

Only the attention fields of the HF config. Layer types come from ``compress_ratios`` (0/1 window
only, 4 C4A, 128 C128A); the preset patterns follow the public model cards, and a checkpoint's own
config always wins (:meth:`DeepseekV4AttentionConfig.from_hf_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM, ROPE_DIM, SLIDING_WINDOW
from ..metadata.layer_types import layer_types
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

    def __post_init__(self) -> None:
        layer_types(self.compress_ratios)  # ValueError on an unsupported ratio
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
        return replace(self, name=f"{self.name}[:{count}]", compress_ratios=self.compress_ratios[:count])

    @classmethod
    def from_hf_config(cls, hf: dict, name: str = "checkpoint") -> DeepseekV4AttentionConfig:
        """Reads the attention fields of a HF ``config.json`` dict (YaRN from ``rope_scaling`` when present)."""
        scaling = hf.get("rope_scaling")
        yarn = None if not scaling else YarnScaling(scaling["factor"], scaling["original_max_position_embeddings"],
                                                    scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0))
        return cls(name=name, hidden_size=hf["hidden_size"], num_attention_heads=hf["num_attention_heads"],
                   q_lora_rank=hf["q_lora_rank"], o_lora_rank=hf["o_lora_rank"], o_groups=hf["o_groups"],
                   compress_ratios=tuple(hf["compress_ratios"]), index_topk=hf["index_topk"],
                   index_n_heads=hf.get("index_n_heads", 64), sliding_window=hf.get("sliding_window", SLIDING_WINDOW),
                   rope_theta=hf.get("rope_theta", 10000.0),
                   compress_rope_theta=hf.get("compress_rope_theta", 160000.0), rope_scaling=yarn,
                   rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                   max_position_embeddings=hf.get("max_position_embeddings", V4_MAX_POSITIONS))


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

PRESETS = {"v4-flash": V4_FLASH, "v4-pro": V4_PRO, "tiny": TINY}


def get_config(name: str) -> DeepseekV4AttentionConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown DeepSeek-V4 preset {name!r}; supported: {sorted(PRESETS)}")
    return PRESETS[name]
