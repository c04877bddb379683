"""Small convolutional networks for latent image diffusion: an autoencoder and a conditional U-Net.

* `ConvAutoencoder`: images `(N, H, W, 3)` in [0, 1] <-> latents `(N, H/f, W/f, C)`, `f = 2^len(widths)`,
  strided 3x3 convolutions down, nearest upsampling + convolutions up (the role of SD's VAE, without its
  KL term: a deterministic encoder whose latents a caller rescales to unit variance).
* `ConditionalUNet`: an eps-prediction U-Net on latents with one downsampling level, residual blocks
  whose GroupNorm is shifted and scaled by the timestep embedding plus a learned class embedding (the
  label `num_classes` is the null label of classifier-free guidance). Extra input channels carry concat
  conditions (IC-Light's widened `conv_in`: noisy latent || condition latent); the output has
  `out_channels`. Timestep features are `core.nn.dit.timestep_embedding` of the DDPM step.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.nn.dit import timestep_embedding


def _groups(width: int) -> int:
  return min(8, width)


class ConvAutoencoder(nn.Module):
  """`encode(images) -> latents`, `decode(latents) -> images`; `__call__` reconstructs."""

  latent_channels: int = 4
  widths: Sequence[int] = (32, 64)

  def setup(self):
    self.down = [(nn.Conv(w, (3, 3)), nn.Conv(w, (3, 3), strides=(2, 2))) for w in self.widths]
    self.to_latent = nn.Conv(self.latent_channels, (1, 1))
    self.from_latent = nn.Conv(self.widths[-1], (3, 3))
    self.up = [(nn.Conv(w, (3, 3)), nn.Conv(w, (3, 3))) for w in reversed(self.widths)]
    self.to_image = nn.Conv(3, (3, 3))

  def encode(self, images: jax.Array) -> jax.Array:
    h = images * 2.0 - 1.0
    for conv, down in self.down:
      h = down(nn.gelu(conv(h)))
      h = nn.gelu(h)
    return self.to_latent(h)

  def decode(self, latents: jax.Array) -> jax.Array:
    h = nn.gelu(self.from_latent(latents))
    for conv_a, conv_b in self.up:
      n, height, width, c = h.shape
      h = jax.image.resize(h, (n, 2 * height, 2 * width, c), "nearest")
      h = nn.gelu(conv_b(nn.gelu(conv_a(h))))
    return (self.to_image(h) + 1.0) / 2.0

  def __call__(self, images: jax.Array) -> jax.Array:
    return self.decode(self.encode(images))


class ResBlock(nn.Module):
  """GroupNorm -> SiLU -> conv, twice, the second norm modulated by the embedding; skip projection."""

  width: int

  @nn.compact
  def __call__(self, x: jax.Array, emb: jax.Array) -> jax.Array:
    h = nn.Conv(self.width, (3, 3))(nn.silu(nn.GroupNorm(_groups(x.shape[-1]))(x)))
    scale, shift = jnp.split(nn.Dense(2 * self.width)(nn.silu(emb)), 2, axis=-1)
    h = nn.GroupNorm(_groups(self.width))(h) * (1 + scale[:, None, None]) + shift[:, None, None]
    h = nn.Conv(self.width, (3, 3), kernel_init=nn.initializers.zeros)(nn.silu(h))
    skip = x if x.shape[-1] == self.width else nn.Conv(self.width, (1, 1))(x)
    return skip + h


class ConditionalUNet(nn.Module):
  """eps of `(N, h, w, C_in)` inputs at DDPM steps `t (N,)` with labels `(N,)` in `[0, num_classes]`."""

  out_channels: int = 4
  width: int = 64
  num_classes: int = 3

  @nn.compact
  def __call__(self, x: jax.Array, t: jax.Array, labels: jax.Array) -> jax.Array:
    if x.shape[1] % 2 or x.shape[2] % 2:
      raise ValueError(f"ConditionalUNet: spatial size {x.shape[1:3]} must be even")
    w = self.width
    emb = nn.Dense(4 * w)(timestep_embedding(t, w, scale=1.0))
    emb = nn.Dense(4 * w)(nn.silu(emb)) + nn.Embed(self.num_classes + 1, 4 * w)(labels)
    h1 = ResBlock(w)(nn.Conv(w, (3, 3))(x), emb)
    h2 = ResBlock(2 * w)(nn.Conv(2 * w, (3, 3), strides=(2, 2))(h1), emb)
    h2 = ResBlock(2 * w)(h2, emb)
    n, height, width, c = h2.shape
    up = nn.Conv(w, (3, 3))(jax.image.resize(h2, (n, 2 * height, 2 * width, c), "nearest"))
    h = ResBlock(w)(jnp.concatenate([up, h1], axis=-1), emb)
    h = nn.silu(nn.GroupNorm(_groups(w))(h))
    return nn.Conv(self.out_channels, (3, 3), kernel_init=nn.initializers.zeros)(h)
