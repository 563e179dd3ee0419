"""dsv4's sparse MLA decode against vLLM's flash_mla_with_kvcache_cpu on identical inputs, on every CPU tier.

Both run through vLLM's argument order (dsv4 via dsv4.compat.vllm_cpu): DeepSeek-V4 shapes with a sliding
window cache and a compressed cache, invalid slots in both, a per-head sink, a query with nothing to attend.
"""

from __future__ import annotations

import pytest
import torch

from dsv4.compat import vllm_cpu as compat
from dsv4.constants import MODEL1_HEAD_DIM, SLIDING_WINDOW
from helpers.peer_vllm import load_peer_reason
from helpers.sparse_mla_cases import index_set

PEER, PEER_UNAVAILABLE = load_peer_reason()
if PEER is None:
    pytest.skip(f"vLLM peer unavailable: {PEER_UNAVAILABLE}", allow_module_level=True)

pytestmark = pytest.mark.peer

PEER_TOL = 2e-2  # vLLM's own test tolerance (it rounds P to bf16 and uses a fast exp, as dsv4 does)


@pytest.mark.parametrize("tokens,heads,compressed", [(1, 64, 512), (5, 16, 0), (9, 128, 1024), (3, 64, 100)])
def test_flash_mla_with_kvcache_cpu_matches_vllm(isa, tokens, heads, compressed):
    window_block, compressed_block = 64, 16
    window_cache, window_slots, _ = index_set(MODEL1_HEAD_DIM, tokens, 1, SLIDING_WINDOW, window_block, False,
                                              torch.int64)
    compressed_cache, compressed_slots, _ = index_set(MODEL1_HEAD_DIM, tokens, 1, max(compressed, 1),
                                                      compressed_block, False, torch.int64)
    window_slots, compressed_slots = window_slots[:, 0], compressed_slots[:, 0, :compressed]
    window_slots[-1] = -1  # the last query attends nothing: exactly zero
    compressed_slots[-1] = -1
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    args = (q, window_cache, window_slots, window_block, compressed_cache, compressed_slots, compressed_block,
            torch.randn(heads), MODEL1_HEAD_DIM**-0.5)
    theirs, ours = torch.full_like(q, 7.0), torch.full_like(q, 7.0)
    PEER.flash_mla_with_kvcache_cpu(theirs, *args)
    compat.flash_mla_with_kvcache_cpu(ours, *args)
    assert (ours[-1] == 0).all() and (theirs[-1] == 0).all()
    torch.testing.assert_close(ours.float(), theirs.float(), atol=PEER_TOL, rtol=PEER_TOL)
