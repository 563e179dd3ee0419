"""A small DeepSeek-V4 attention model on dsv4's kernels: the serving side of the library, not its kernel API.

``config`` (the V4-Flash / V4-Pro / tiny geometries, ``from_hf_config``), ``cache_manager`` (paged caches per
layer group), ``attention_step`` (one step's metadata for every layer), ``layer`` (``DeepseekV4Attention``),
``stack`` (``AttentionStack``: layers sharing one step), ``timing`` (per-op timers) and ``demo``
(``python -m dsv4 demo``).
"""
