"""Small image encoders that return a grid of patch features `[B, h, w, C]`.

* `ConvEncoder`: a stack of 3x3 convolutions (stride per layer) with GELU, optionally GroupNorm; at
  32x32 input, channels (16, 32, 64) and strides (2, 2, 1) give an 8x8x64 grid (~1.6M multiply-adds
  per image), whose cells are the "patches" of a patch-wise model and whose mean is a global feature.
* `PatchViT`: non-overlapping `patch x patch` tokens, a learned 2-D position table, and the shared
  `core.nn.transformer.Transformer` (bidirectional, no RoPE, no token tables) as the trunk; its
  output tokens are reshaped to the patch grid (Dosovitskiy et al. 2021, "An Image is Worth 16x16
  Words", without a CLS token: the mean token serves as the global feature).

Both take float images in [0, 1] and centre them at 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.nn.transformer import Transformer


class ConvEncoder(nn.Module):
  """3x3 convolutions with GELU; `channels[i]` outputs at stride `strides[i]`."""

  channels: Sequence[int] = (16, 32, 64)
  strides: Sequence[int] = (2, 2, 1)
  group_norm: bool = False

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    if len(self.channels) != len(self.strides):
      raise ValueError(
        f"ConvEncoder: {len(self.channels)} channels but {len(self.strides)} strides"
      )
    x = images - 0.5
    for width, stride in zip(self.channels, self.strides, strict=True):
      x = nn.Conv(width, (3, 3), strides=(stride, stride), padding="SAME")(x)
      if self.group_norm:
        x = nn.GroupNorm(num_groups=min(8, width))(x)
      x = nn.gelu(x)
    return x


class PatchViT(nn.Module):
  """Patch tokens through the shared transformer, returned as a `[B, H/p, W/p, width]` grid."""

  patch: int = 4
  width: int = 64
  depth: int = 4
  num_heads: int = 4

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    batch, height, width, channels = images.shape
    if height % self.patch or width % self.patch:
      raise ValueError(f"PatchViT: image {height}x{width} is not divisible by patch {self.patch}")
    grid_h, grid_w = height // self.patch, width // self.patch
    patches = (images - 0.5).reshape(batch, grid_h, self.patch, grid_w, self.patch, channels)
    patches = patches.transpose(0, 1, 3, 2, 4, 5).reshape(batch, grid_h * grid_w, -1)
    tokens = nn.Dense(self.width, name="patch_embedding")(patches)
    position = self.param(
      "position", nn.initializers.normal(0.02), (grid_h * grid_w, self.width), jnp.float32
    )
    trunk = Transformer(
      vocab_size=0, width=self.width, depth=self.depth, num_heads=self.num_heads, use_rope=False
    )
    features = trunk(embeddings=tokens + position).features
    return features.reshape(batch, grid_h, grid_w, self.width)
