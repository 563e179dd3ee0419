// Per-row top-k of indexer logits with optional page translation.

inline void topk_transform(const TopkTransformParams& p) {}
