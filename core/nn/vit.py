"""A Vision Transformer in DINO's layout: patch-embedding convolution, CLS token, learned positions.

The image encoder of Dosovitskiy et al. 2021 ("An Image is Worth 16x16 Words", ICLR 2021, Sec. 3.1,
Eq. 1-4) as DINO builds it (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision
Transformers", ICCV 2021; github.com/facebookresearch/dino, `vision_transformer.py`):

  z_0 = [x_cls; E x_p^1; ...; E x_p^N] + E_pos     E: a p x p stride-p convolution (`patch_embed`)
  z'_l = z_{l-1} + MSA(LN(z_{l-1}))                 pre-norm blocks, fused qkv with biases
  z_l = z'_l + MLP(LN(z'_l))                        MLP: Linear -> exact GELU -> Linear
  out = LN(z_L)                                     CLS = out[:, 0], the patch grid = out[:, 1:]

LayerNorms have scale and bias with eps 1e-6 (DINO's `vit_small` / `vit_base`); parameters are named
as the torch modules (`blocks_N/attn/qkv` for `blocks.N.attn.qkv`) so that `core.nn.vit_convert`
maps a released state dict one key at a time. Inputs are float images `[B, H, W, 3]` in [0, 1],
optionally resized (bilinear) to `image_size` and normalised with ImageNet's mean and standard
deviation, as DINO's training and evaluation transforms do. The same module serves a tiny ViT
trained from scratch and DINO ViT-S/16 (patch 16, width 384, depth 12, 6 heads).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.nn import attention

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYER_NORM_EPS = 1e-6
_INIT = nn.initializers.truncated_normal(0.02)  # DINO's trunc_normal_(std=.02)


class ViTFeatures(NamedTuple):
  """The final-norm outputs: `cls` `[B, D]` (the global feature) and `grid` `[B, h, w, D]`."""

  cls: jax.Array
  grid: jax.Array


class Attention(nn.Module):
  """Multi-head self-attention with DINO's fused `qkv` Linear split as (3, heads, head_dim)."""

  num_heads: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    batch, length, width = x.shape
    qkv = nn.Dense(3 * width, kernel_init=_INIT, name="qkv")(x)
    qkv = qkv.reshape(batch, length, 3, self.num_heads, width // self.num_heads)
    out = attention.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    return nn.Dense(width, kernel_init=_INIT, name="proj")(out.reshape(batch, length, width))


class Mlp(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    h = nn.gelu(nn.Dense(self.hidden, kernel_init=_INIT, name="fc1")(x), approximate=False)
    return nn.Dense(x.shape[-1], kernel_init=_INIT, name="fc2")(h)


class Block(nn.Module):
  """`x + attn(norm1(x))`, then `x + mlp(norm2(x))` (Eq. 2-3)."""

  num_heads: int
  mlp_hidden: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + Attention(self.num_heads, name="attn")(nn.LayerNorm(LAYER_NORM_EPS, name="norm1")(x))
    return x + Mlp(self.mlp_hidden, name="mlp")(nn.LayerNorm(LAYER_NORM_EPS, name="norm2")(x))


class ViT(nn.Module):
  """The module docstring's encoder; returns `ViTFeatures` on a `(size / patch)^2` patch grid, where
  `size` is `image_size` (0: the input's own size)."""

  patch: int = 16
  width: int = 384
  depth: int = 12
  num_heads: int = 6
  mlp_ratio: int = 4
  image_size: int = 0

  def grid_size(self, input_size: int) -> int:
    size = self.image_size or input_size
    if size % self.patch:
      raise ValueError(f"ViT: image size {size} is not divisible by patch {self.patch}")
    return size // self.patch

  @nn.compact
  def __call__(self, images: jax.Array) -> ViTFeatures:
    batch, height, width, channels = images.shape
    if height != width:
      raise ValueError(f"ViT: needs square images, got {height}x{width}")
    if self.width % self.num_heads:
      raise ValueError(f"ViT: width {self.width} is not divisible by {self.num_heads} heads")
    grid = self.grid_size(height)
    if self.image_size and self.image_size != height:
      shape = (batch, self.image_size, self.image_size, channels)
      images = jax.image.resize(images, shape, method="bilinear")
    x = (images - jnp.asarray(IMAGENET_MEAN)) / jnp.asarray(IMAGENET_STD)
    x = nn.Conv(
      self.width, (self.patch, self.patch), strides=self.patch, padding="VALID", name="patch_embed"
    )(x)
    cls = self.param("cls_token", _INIT, (1, 1, self.width), jnp.float32)
    positions = self.param("pos_embed", _INIT, (1, 1 + grid * grid, self.width), jnp.float32)
    tokens = x.reshape(batch, grid * grid, self.width)
    x = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, self.width)), tokens], axis=1)
    x = x + positions
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_ratio * self.width, name=f"blocks_{i}")(x)
    x = nn.LayerNorm(LAYER_NORM_EPS, name="norm")(x)
    return ViTFeatures(x[:, 0], x[:, 1:].reshape(batch, grid, grid, self.width))
