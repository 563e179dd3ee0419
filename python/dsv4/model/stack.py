"""The attention layers of a model with their paged caches and step builder (what the demo, the layer
benchmark and the layer tests drive)."""

from __future__ import annotations

import torch

from .attention_step import StepMetadata, StepMetadataBuilder
from .cache_manager import PagedCacheManager, ScheduledBatch
from .config import DeepseekV4AttentionConfig
from .layer import DeepseekV4Attention
from .layer_v41 import DeepseekV41Attention
from .timing import NULL_TIMER


class AttentionStack:
    """Layers ``0 .. num_hidden_layers - 1`` of ``config`` (random weights, layer i seeded ``seed + i``)."""

    def __init__(self, config: DeepseekV4AttentionConfig, *, max_model_len: int, max_num_reqs: int,
                 max_num_batched_tokens: int, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.manager = PagedCacheManager(config, max_model_len, max_num_reqs, device)
        self.step_builder = StepMetadataBuilder(self.manager, max_num_batched_tokens)
        layer_cls = DeepseekV41Attention if config.model_version == "v4.1" else DeepseekV4Attention
        self.layers = [layer_cls(config, i, max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                                 seed=seed + i, device=device) for i in range(config.num_hidden_layers)]
        for layer in self.layers if config.model_version == "v4.1" else ():
            layer.attach_sources(self.layers)  # V4.1 layers read the caches and selections of earlier layers

    def prepare(self, batch: ScheduledBatch, timer=NULL_TIMER) -> StepMetadata:
        """Grows the requests' block tables to their new lengths and builds the step's metadata."""
        with timer("metadata builders"):
            for request, seq_len in zip(batch.request_ids, batch.seq_lens, strict=True):
                self.manager.reserve(request, seq_len)
            return self.step_builder.build(batch)

    def run_layer(self, index: int, hidden_states: torch.Tensor, step: StepMetadata, timer=NULL_TIMER
                  ) -> torch.Tensor:
        return self.layers[index](hidden_states, step, self.manager.layer_caches[index], timer)
