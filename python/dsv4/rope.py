"""RoPE tables of DeepSeek-V4 (fp32 ``[max_positions, rope_dim]``: cos in the first half, sin in the second).

Sliding-window-only layers rotate with ``rope_theta`` unscaled; compressed layers with
``compress_rope_theta`` and YaRN frequency interpolation (no attention-magnitude scaling: DSv4
disables mscale). The YaRN blend follows the paper's ramp between the interpolated (``/ factor``)
and the original frequencies over the dimensions whose wavelength lies between ``beta_fast`` and
``beta_slow`` rotations of the original context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

RAMP_EPSILON = 1e-3  # widens a degenerate ramp (low == high) so it stays a step


@dataclass(frozen=True)
class YarnScaling:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def _correction_dim(rotations: float, rope_dim: int, theta: float, original_max_positions: int) -> float:
    """The dimension whose wavelength fits ``rotations`` times into the original context."""
    return rope_dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def inverse_frequencies(rope_dim: int, theta: float, yarn: YarnScaling | None = None) -> torch.Tensor:
    """float64 ``[rope_dim / 2]`` rotation speeds per position."""
    original = theta ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    if yarn is None:
        return original
    low = max(math.floor(_correction_dim(yarn.beta_fast, rope_dim, theta, yarn.original_max_position_embeddings)), 0)
    high = min(math.ceil(_correction_dim(yarn.beta_slow, rope_dim, theta, yarn.original_max_position_embeddings)),
               rope_dim - 1)
    if low == high:
        high += RAMP_EPSILON
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep_original = 1 - ramp  # fast dimensions keep their frequency, slow ones are interpolated
    return original / yarn.factor * ramp + original * keep_original


def rope_cos_sin_cache(max_positions: int, rope_dim: int, theta: float, yarn: YarnScaling | None = None
                       ) -> torch.Tensor:
    """fp32 ``[max_positions, rope_dim]`` = ``[cos(p * f_i) | sin(p * f_i)]``."""
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inverse_frequencies(rope_dim, theta, yarn)
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()
