"""dsv4.rope: plain and YaRN-interpolated cos/sin tables."""

from __future__ import annotations

import torch

from conftest import rope_table
from dsv4.rope import YarnScaling, inverse_frequencies, rope_cos_sin_cache

YARN = YarnScaling(factor=16.0, original_max_position_embeddings=65536)


def test_plain_table():
    assert torch.allclose(rope_cos_sin_cache(300, 64, 10000.0), rope_table(300), atol=1e-6)


def test_yarn_keeps_fast_dims_and_interpolates_slow_ones():
    plain, scaled = inverse_frequencies(64, 160000.0), inverse_frequencies(64, 160000.0, YARN)
    ratio = plain / scaled
    # The fastest dimensions turn many times within the original context: kept; the slowest are interpolated.
    assert torch.allclose(ratio[:4], torch.ones(4, dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(ratio[-4:], torch.full((4,), 16.0, dtype=torch.float64), rtol=1e-12)
    assert bool((ratio[1:] >= ratio[:-1]).all())  # the ramp is monotone in between


def test_yarn_factor_one_is_plain():
    identity = YarnScaling(factor=1.0, original_max_position_embeddings=65536)
    assert torch.equal(rope_cos_sin_cache(64, 64, 160000.0, identity), rope_cos_sin_cache(64, 64, 160000.0))
