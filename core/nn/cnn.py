"""A small convolutional image encoder that returns a grid of patch features `[B, h, w, C]`.

`ConvEncoder`: a stack of 3x3 convolutions (stride per layer) with GELU, optionally GroupNorm; at
32x32 input, channels (16, 32, 64) and strides (2, 2, 1) give an 8x8x64 grid (~1.6M multiply-adds per
image), whose cells are the "patches" of a patch-wise model and whose mean is a global feature. It
takes float images in [0, 1] and centres them at 0.5. The ViT encoder (CLS token and patch grid) is
`core.nn.vit.ViT`.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax


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
