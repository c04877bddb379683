"""Shared-context + per-sample-buffer decode attention (`api.buffer_attention`)."""

from kernels.buffer_attention.api import buffer_attention

__all__ = ["buffer_attention"]
