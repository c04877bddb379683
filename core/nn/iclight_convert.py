"""IC-Light "fc" weights onto an SD-1.5 UNet state dict (the relighter of LightCtrl, ICLR 2026).

IC-Light (lllyasviel/IC-Light, `gradio_demo.py`) widens the UNet's `conv_in` from 4 to 8 input channels
(noisy latent || foreground-condition latent): the new kernel is zero except its first 4 input
channels, which copy the base kernel; the bias is kept. `iclight_sd15_fc.safetensors` then holds an
*offset* for every key of that widened state dict, and the relighter's weights are `base + offset`.
LightCtrl (GVCLab/LightCtrl, `relight.py`) loads the relighter this way on Realistic Vision 5.1.

`merge_fc_offsets(base, offsets)` does both steps on numpy state dicts (PyTorch layout) and checks
every key and shape, naming the first that does not fit; `conv_kernel_to_flax` turns a PyTorch conv
kernel `(out, in, kh, kw)` into Flax's `(kh, kw, in, out)`. Errors are `core.nn.convert.CheckpointError`.
The merged state dict converts into the Flax SD-1.5 UNet with `core.nn.sd_unet_convert.iclight_unet`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from core.nn.convert import CheckpointError

__all__ = ["CheckpointError", "conv_kernel_to_flax", "merge_fc_offsets", "widen_conv_in"]

CONV_IN = "conv_in.weight"
CONDITION_CHANNELS = 4  # the foreground latent IC-Light fc concatenates


def widen_conv_in(base: Mapping[str, np.ndarray], extra: int = CONDITION_CHANNELS) -> dict:
  """`base` with `conv_in.weight` widened by `extra` zero input channels (IC-Light's new conv_in)."""
  if CONV_IN not in base:
    raise CheckpointError(f"base state dict has no {CONV_IN!r}")
  kernel = np.asarray(base[CONV_IN])
  if kernel.ndim != 4:
    raise CheckpointError(f"{CONV_IN} must be (out, in, kh, kw), got shape {kernel.shape}")
  out, inp, kh, kw = kernel.shape
  widened = np.zeros((out, inp + extra, kh, kw), kernel.dtype)
  widened[:, :inp] = kernel
  return {**base, CONV_IN: widened}


def merge_fc_offsets(base: Mapping[str, np.ndarray], offsets: Mapping[str, np.ndarray]) -> dict:
  """`widen_conv_in(base)[k] + offsets[k]` for every key; errors name a missing, unexpected or
  misshapen key."""
  widened = widen_conv_in(base)
  missing = sorted(set(widened) - set(offsets))
  if missing:
    raise CheckpointError(f"offsets lack {len(missing)} keys of the UNet, e.g. {missing[0]!r}")
  unexpected = sorted(set(offsets) - set(widened))
  if unexpected:
    raise CheckpointError(f"offsets have keys the UNet lacks, e.g. {unexpected[0]!r}")
  merged = {}
  for key, value in widened.items():
    offset = np.asarray(offsets[key])
    if offset.shape != value.shape:
      raise CheckpointError(f"{key}: offset shape {offset.shape} != UNet shape {value.shape}")
    merged[key] = (value.astype(np.float32) + offset.astype(np.float32)).astype(value.dtype)
  return merged


def conv_kernel_to_flax(kernel: np.ndarray) -> np.ndarray:
  """PyTorch `(out, in, kh, kw)` -> Flax `(kh, kw, in, out)`."""
  if kernel.ndim != 4:
    raise CheckpointError(f"a conv kernel must have 4 axes, got shape {kernel.shape}")
  return np.transpose(kernel, (2, 3, 1, 0))
