"""Diagonal linear-recurrence scan `h_t = a_t * h_{t-1} + b_t` (real or complex), with a Pallas kernel."""

from kernels.ssm_scan.api import IMPLEMENTATIONS, default_implementation, ssm_scan

__all__ = ["IMPLEMENTATIONS", "default_implementation", "ssm_scan"]
