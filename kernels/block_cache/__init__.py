"""Fused relative-L1 indicator and cache update for block-wise feature caching (BWCache)."""

from kernels.block_cache.api import relative_l1_update

__all__ = ["relative_l1_update"]
