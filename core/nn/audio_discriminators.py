"""The discriminators of Flow2GAN's GAN stage ("Flow2GAN", ICLR 2026, Sec. 3.3; official code
k2-fsa/Flow2GAN `flow2gan/models/discriminators.py`, from Vocos), in Flax linen, channels last.

- `PeriodDiscriminator` / `MultiPeriodDiscriminator` (HiFi-GAN's MPD): the waveform folded into
  `(T / p, p)` (reflect-padded to a multiple of `p`), 2-D convs with `(k, 1)` kernels and stride
  `(3, 1)`, leaky ReLU 0.1, a `(3, 1)` output conv.
- `ResolutionDiscriminator` / `MultiResolutionDiscriminator` (DAC's MRD): a complex STFT of the
  DC-removed, peak-normalised (to 0.8) waveform, split into frequency bands
  `[0, .1, .25, .5, .75, 1]` of the bins, per-band conv stacks over (time, frequency) with `(3, 9)`
  kernels and frequency stride 2, concatenated along frequency into a `(3, 3)` output conv.

Each returns, per sub-discriminator, its scores and its feature maps (every layer after the first,
and the output), the inputs of the hinge and feature-matching losses in `core/gan.py`. Weight norm is
off, as in the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import audio

BANDS = ((0.0, 0.1), (0.1, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))


def _leaky(x):
  return nn.leaky_relu(x, 0.1)


class PeriodDiscriminator(nn.Module):
  period: int
  channels: Sequence[int] = (32, 128, 512, 1024, 1024)
  kernel_size: int = 5
  stride: int = 3

  @nn.compact
  def __call__(self, x):
    """`x (B, T)` -> (scores `(B, n)`, feature maps)."""
    pad = (-x.shape[-1]) % self.period
    if pad:
      x = jnp.pad(x, ((0, 0), (0, pad)), mode="reflect")
    h = x.reshape(x.shape[0], -1, self.period, 1)
    fmaps = []
    for i, features in enumerate(self.channels):
      stride = self.stride if i < len(self.channels) - 1 else 1
      pad_k = self.kernel_size // 2
      h = nn.Conv(features, (self.kernel_size, 1), (stride, 1), padding=((pad_k, pad_k), (0, 0)))(h)
      h = _leaky(h)
      if i > 0:
        fmaps.append(h)
    h = nn.Conv(1, (3, 1), padding=((1, 1), (0, 0)))(h)
    fmaps.append(h)
    return h.reshape(h.shape[0], -1), fmaps


class MultiPeriodDiscriminator(nn.Module):
  periods: Sequence[int] = (2, 3, 5, 7, 11)
  channels: Sequence[int] = (32, 128, 512, 1024, 1024)

  @nn.compact
  def __call__(self, x):
    outs = [PeriodDiscriminator(p, tuple(self.channels))(x) for p in self.periods]
    return [s for s, _ in outs], [f for _, f in outs]


class ResolutionDiscriminator(nn.Module):
  window: int
  channels: int = 32
  bands: Sequence[tuple[float, float]] = BANDS

  @nn.compact
  def __call__(self, x):
    x = x - jnp.mean(x, axis=-1, keepdims=True)
    x = 0.8 * x / (jnp.max(jnp.abs(x), axis=-1, keepdims=True) + 1e-9)
    spec = audio.stft(x, self.window, self.window // 4)  # (B, frames, bins)
    bins = spec.shape[-1]
    spec = jnp.stack([spec.real, spec.imag], axis=-1)  # (B, frames, bins, 2)
    fmaps, outs = [], []
    for low, high in self.bands:
      h = spec[:, :, int(low * bins) : int(high * bins)]
      layers = [((3, 9), (1, 1)), ((3, 9), (1, 2)), ((3, 9), (1, 2)), ((3, 9), (1, 2))]
      layers.append(((3, 3), (1, 1)))
      for i, (kernel, stride) in enumerate(layers):
        pads = tuple((k // 2, k // 2) for k in kernel)
        h = _leaky(nn.Conv(self.channels, kernel, stride, padding=pads)(h))
        if i > 0:
          fmaps.append(h)
      outs.append(h)
    h = nn.Conv(1, (3, 3), padding=((1, 1), (1, 1)))(jnp.concatenate(outs, axis=2))
    fmaps.append(h)
    return h.reshape(h.shape[0], -1), fmaps


class MultiResolutionDiscriminator(nn.Module):
  windows: Sequence[int] = (2048, 1024, 512)
  channels: int = 32

  @nn.compact
  def __call__(self, x):
    outs = [ResolutionDiscriminator(w, self.channels)(x) for w in self.windows]
    return [s for s, _ in outs], [f for _, f in outs]


class Discriminators(nn.Module):
  """MPD and MRD together: `x -> {"mpd": (scores, fmaps), "mrd": (scores, fmaps)}`."""

  periods: Sequence[int]
  period_channels: Sequence[int]
  windows: Sequence[int]
  resolution_channels: int

  @nn.compact
  def __call__(self, x: jax.Array):
    return {
      "mpd": MultiPeriodDiscriminator(tuple(self.periods), tuple(self.period_channels))(x),
      "mrd": MultiResolutionDiscriminator(tuple(self.windows), self.resolution_channels)(x),
    }
