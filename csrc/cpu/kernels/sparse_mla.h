// Sparse MLA attention (FlashMLA semantics) over fp8 paged caches (decode) and bf16 rows (prefill).

inline void sparse_mla_decode(const SparseMlaDecodeParams& p) {}
inline void sparse_mla_prefill(const SparseMlaPrefillParams& p) {}
