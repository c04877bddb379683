"""Flow2GAN's multi-branch Fourier-coefficient generator ("Flow2GAN", ICLR 2026, Sec. 3.2; official
code k2-fsa/Flow2GAN, `flow2gan/models/{modules,generator}.py`), in Flax linen, channels last.

- `BiasNorm`: `x * exp(log_scale) / rms(x - bias)` over channels, a learnable bias and scalar log-scale
  kept in [-1.5, 1.5] (icefall's Zipformer `BiasNorm`).
- `ChannelScale`: a per-channel scale of the residual kept in [0.5, 1].
  Both keep their parameter in range the reference's way (`limit_param_value`): the forward value is
  unchanged and the gradient's sign is flipped where it would push the parameter further out, always
  (the reference does it on a random 60% of steps, to save time).
- `PReLU`: one learnable slope per channel.
- `ConvNeXtBlock`: depthwise conv (k7) -> BiasNorm -> `+ cond` -> `* (1 + time)` -> 1x1 (x3) -> PReLU
  -> 1x1 -> `+ ChannelScale(residual)`.
- `CondEncoder`: conv (k3) -> BiasNorm -> ConvNeXt blocks, run once per utterance on the log-mel.
- `Branch`: STFT of the noisy waveform at one resolution -> real/imag channels -> 1x1 -> BiasNorm ->
  ConvNeXt blocks conditioned on the encoded mel (repeated to the branch's frame rate, through a
  1x1-PReLU-1x1) and on a sinusoidal embedding of `1000 t` (through an MLP) -> 1x1 -> complex ->
  ISTFT -> the waveform.
- `MultiBranchGenerator`: the branches' waveforms averaged (the code's `branch_reduction="mean"`; the
  paper's text says sum), with branch dropout in training: with probability `branch_dropout` per
  example one random branch is zeroed and the rest rescaled by `B / (B - 1)`.

Weights are truncated-normal with std 0.015 and zero biases, as in the reference's `_init_weights`.
The time input `t` is the reference's: 0 is noise, 1 is data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import audio

INIT = nn.initializers.truncated_normal(0.015)


@jax.custom_vjp
def limit_param_value(x: jax.Array, low: float, high: float) -> jax.Array:
  """Identity forward; backward flips the gradient's sign where following it would move `x` further
  below `low` or above `high` (gradient descent then walks the parameter back into range)."""
  return x


def _limit_fwd(x, low, high):
  return x, (x, low, high)


def _limit_bwd(residuals, grad):
  x, low, high = residuals
  grad = jnp.where((grad > 0) & (x < low), -grad, grad)
  grad = jnp.where((grad < 0) & (x > high), -grad, grad)
  return grad, None, None


limit_param_value.defvjp(_limit_fwd, _limit_bwd)


class BiasNorm(nn.Module):
  """`x * exp(log_scale) * mean_c((x - bias)^2)^(-1/2)` over the last axis."""

  log_scale_init: float = 1.0
  log_scale_min: float = -1.5
  log_scale_max: float = 1.5

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    bias = self.param("bias", nn.initializers.normal(1e-2), (x.shape[-1],))
    log_scale = self.param("log_scale", nn.initializers.constant(self.log_scale_init), ())
    log_scale = limit_param_value(log_scale, self.log_scale_min, self.log_scale_max)
    scale = jax.lax.rsqrt(jnp.mean(jnp.square(x - bias), axis=-1, keepdims=True) + 1e-12)
    return x * scale * jnp.exp(log_scale)


class ChannelScale(nn.Module):
  """Per-channel scale kept in [0.5, 1]."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
    return x * limit_param_value(scale, 0.5, 1.0)


class PReLU(nn.Module):
  """`max(x, 0) + a * min(x, 0)` with one slope `a` per channel (init 0.25, as torch)."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    slope = self.param("slope", nn.initializers.constant(0.25), (x.shape[-1],))
    return jnp.where(x >= 0, x, slope * x)


def dense(features: int, name: str | None = None) -> nn.Dense:
  return nn.Dense(features, kernel_init=INIT, bias_init=nn.initializers.zeros, name=name)


class ConvNeXtBlock(nn.Module):
  """One ConvNeXt block on `(B, T, C)`; `cond` is `(B, T, C_cond)`, `time` is `(B, C_time)`."""

  hidden_factor: int = 3
  kernel_size: int = 7

  @nn.compact
  def __call__(self, x, cond=None, time=None):
    channels = x.shape[-1]
    h = nn.Conv(
      channels,
      (self.kernel_size,),
      padding="SAME",
      feature_group_count=channels,
      kernel_init=INIT,
      bias_init=nn.initializers.zeros,
    )(x)
    h = BiasNorm()(h)
    if cond is not None:
      h = h + dense(channels, "cond_proj")(cond)
    if time is not None:
      h = h * (1.0 + dense(channels, "time_proj")(time)[:, None, :])
    h = dense(channels * self.hidden_factor)(h)
    h = PReLU()(h)
    h = dense(channels)(h)
    return h + ChannelScale()(x)


class CondEncoder(nn.Module):
  """`(B, F, n_mels) -> (B, F, channels)`: conv (k3) -> BiasNorm -> ConvNeXt blocks."""

  channels: int
  num_blocks: int
  hidden_factor: int = 3
  kernel_size: int = 7

  @nn.compact
  def __call__(self, mel):
    h = nn.Conv(self.channels, (3,), padding="SAME", kernel_init=INIT)(mel)
    h = BiasNorm()(h)
    for _ in range(self.num_blocks):
      h = ConvNeXtBlock(self.hidden_factor, self.kernel_size)(h)
    return h


def sinusoidal_embedding(t: jax.Array, dim: int, scale: float = 1000.0) -> jax.Array:
  """`[sin(scale t w_k), cos(scale t w_k)]`, `w_k = 10000^(-k / (dim/2 - 1))` (`SinusoidalPosEmb`)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10000.0) / (half - 1) * jnp.arange(half))
  angles = scale * t[:, None] * freqs[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def upsample_frames(cond: jax.Array, factor: int, frames: int) -> jax.Array:
  """Repeats each condition frame `factor` times and fits the result to `frames` (zero-padded or cut)."""
  cond = jnp.repeat(cond, factor, axis=1)
  return jnp.swapaxes(audio.fit_length(jnp.swapaxes(cond, 1, 2), frames), 1, 2)


class Branch(nn.Module):
  """One resolution: the waveform's Fourier coefficients in, refined coefficients out, as a waveform."""

  n_fft: int
  hop: int
  channels: int
  num_blocks: int
  cond_hop: int
  time_dim: int
  hidden_factor: int = 3
  kernel_size: int = 7

  @nn.compact
  def __call__(self, x, cond, t):
    """`x (B, T)`, `cond (B, F_cond, C_cond)` encoded mel, `t (B,)` in [0, 1] -> `(B, T)`."""
    spec = audio.stft(x, self.n_fft, self.hop)
    h = jnp.concatenate([spec.real, spec.imag], axis=-1)
    h = dense(self.channels, "in_proj")(h)
    h = BiasNorm()(h)
    time = sinusoidal_embedding(t, self.time_dim)
    time = dense(self.time_dim)(nn.silu(dense(self.time_dim * self.hidden_factor)(time)))
    cond = upsample_frames(cond, self.cond_hop // self.hop, h.shape[1])
    cond_channels = cond.shape[-1]
    cond = dense(cond_channels)(PReLU()(dense(cond_channels * self.hidden_factor)(cond)))
    for _ in range(self.num_blocks):
      h = ConvNeXtBlock(self.hidden_factor, self.kernel_size)(h, cond, time)
    h = dense(self.n_fft + 2, "out_proj")(h)
    bins = self.n_fft // 2 + 1
    coefficients = jax.lax.complex(h[..., :bins], h[..., bins:])
    return audio.istft(coefficients, self.n_fft, self.hop, x.shape[-1])


class MultiBranchGenerator(nn.Module):
  """`encode(mel) -> cond` once per utterance, then `__call__(x, cond, t)` per sampling step.

  Attributes:
    n_ffts, hops, channels, num_blocks: one entry per branch.
    cond_channels, cond_blocks: the condition encoder.
    cond_hop: hop of the mel frames (a multiple of every branch hop).
    branch_dropout: per-example probability of dropping one branch in training.
  """

  n_ffts: Sequence[int]
  hops: Sequence[int]
  channels: Sequence[int]
  num_blocks: Sequence[int]
  cond_channels: int
  cond_blocks: int
  cond_hop: int
  time_dim: int
  hidden_factor: int = 3
  kernel_size: int = 7
  branch_dropout: float = 0.05

  def setup(self):
    self.encoder = CondEncoder(
      self.cond_channels, self.cond_blocks, self.hidden_factor, self.kernel_size
    )
    self.branches = [
      Branch(n, h, c, b, self.cond_hop, self.time_dim, self.hidden_factor, self.kernel_size)
      for n, h, c, b in zip(self.n_ffts, self.hops, self.channels, self.num_blocks, strict=True)
    ]

  def encode(self, mel):
    return self.encoder(mel)

  def __call__(self, x, cond, t, dropout_rng: jax.Array | None = None):
    """`x (B, T)`, encoded `cond`, `t (B,)` -> the branch mean `(B, T)`; `dropout_rng` turns branch
    dropout on (training)."""
    outputs = jnp.stack([branch(x, cond, t) for branch in self.branches], axis=1)
    if dropout_rng is not None:
      outputs = outputs * branch_dropout_weights(
        dropout_rng, outputs.shape[:2], self.branch_dropout
      )
    return jnp.mean(outputs, axis=1)

  def full(self, x, mel, t, dropout_rng=None):
    """Encoder and branches in one call (for `init`)."""
    return self(x, self.encode(mel), t, dropout_rng)


def branch_dropout_weights(rng: jax.Array, shape: tuple[int, int], rate: float) -> jax.Array:
  """`(B, num_branches, 1)` weights: ones, except that with probability `rate` an example has one
  uniformly chosen branch zeroed and the others scaled by `B / (B - 1)` (`process_model`)."""
  batch, branches = shape
  if branches < 2 or rate <= 0.0:
    return jnp.ones((batch, branches, 1))
  pick_rng, drop_rng = jax.random.split(rng)
  dropped = jax.random.randint(pick_rng, (batch,), 0, branches)
  mask = (jnp.arange(branches)[None, :] != dropped[:, None]) * (branches / (branches - 1))
  apply = jax.random.uniform(drop_rng, (batch, 1)) < rate
  return jnp.where(apply, mask, 1.0)[..., None]
