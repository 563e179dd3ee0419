// Lightning-indexer logits: logit[r, t] = kscale_t * sum_h w[r, h] * relu(<q[r, h], k_t>).

inline void fp8_paged_mqa_logits(const PagedMqaLogitsParams& p) {}
inline void fp8_mqa_logits(const MqaLogitsParams& p) {}
