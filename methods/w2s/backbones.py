"""Strong backbones of the image variants and their label-free pre-training (SimCLR).

"Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026)
takes its strong students from large pre-trained models whose features already separate the task.
The `digits` variant gets such a student here: a small CNN pre-trained with the SimCLR objective
(Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations", ICML 2020:
two augmented views per image, NT-Xent loss on a projection head, the head dropped afterwards) on the
training digits without labels and without stripes. The frozen backbone's features are the mean of
its last convolutional grid, so the student reads what the digit looks like more than where a bright
row sits.

* `DigitCNN`: 3x3 convolutions as one im2col matmul each (on one CPU thread several times faster than
  `lax.conv` for 8x8 inputs), ReLU, stride 2 after the first layer, global mean pool; `features` is
  the pooled vector, `__call__` the projection head's output.
* `augment_digits`: random translation by up to `shift` pixels (zero padded), pixel dropout, a
  random contrast factor and Gaussian pixel noise, per image.
* `nt_xent`: SimCLR's normalised temperature-scaled cross-entropy over the 2B views of a batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

DIGIT_SIDE = 8


def _conv3x3(x: jax.Array, stride: int, dense: nn.Dense) -> jax.Array:
  """A 'SAME' 3x3 convolution of (B, H, W, C): `dense` on the 9 shifted copies (im2col)."""
  _, height, width, _ = x.shape
  padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  patches = [
    padded[:, i : i + height : stride, j : j + width : stride, :]
    for i in range(3)
    for j in range(3)
  ]
  return dense(jnp.concatenate(patches, axis=-1))


class DigitCNN(nn.Module):
  """`x (B, 64) -> projection (B, num_outputs)`; `features(x)` is the mean-pooled last grid (B, C).

  Inputs are flattened 8x8 images in [0, 1] (centred at 0.5 inside)."""

  channels: Sequence[int]
  num_outputs: int
  projection_width: int = 128
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    self.convs = [dense(width) for width in self.channels]
    self.projection = [dense(self.projection_width), dense(self.num_outputs)]

  def _pooled(self, x: jax.Array) -> jax.Array:
    if x.ndim != 2 or x.shape[-1] != DIGIT_SIDE * DIGIT_SIDE:
      raise ValueError(f"DigitCNN expects flattened 8x8 images (B, 64), got shape {x.shape}")
    h = x.reshape(-1, DIGIT_SIDE, DIGIT_SIDE, 1) - 0.5
    for index, layer in enumerate(self.convs):
      h = nn.relu(_conv3x3(h, 1 if index == 0 else 2, layer))
    return h.mean(axis=(1, 2))

  def features(self, x: jax.Array) -> jax.Array:
    """The frozen features the heads read, in float32."""
    return self._pooled(x).astype(jnp.float32)

  def __call__(self, x: jax.Array) -> jax.Array:
    hidden, out = self.projection
    return out(nn.relu(hidden(self._pooled(x)))).astype(jnp.float32)


def augment_digits(
  key: jax.Array,
  x: jax.Array,
  shift: int = 1,
  keep: float = 0.8,
  contrast: tuple[float, float] = (0.6, 1.2),
  noise: float = 0.1,
) -> jax.Array:
  """A random view of each flattened 8x8 digit in `x` (B, 64): translate by up to `shift` pixels,
  keep each pixel with probability `keep`, scale by a factor in `contrast`, add N(0, noise^2)."""
  batch = x.shape[0]
  k_shift, k_scale, k_keep, k_noise = jax.random.split(key, 4)
  side = DIGIT_SIDE
  padded = jnp.pad(x.reshape(batch, side, side), ((0, 0), (shift, shift), (shift, shift)))
  offsets = jax.random.randint(k_shift, (batch, 2), 0, 2 * shift + 1)
  crop = lambda image, o: jax.lax.dynamic_slice(image, (o[0], o[1]), (side, side))
  images = jax.vmap(crop)(padded, offsets)
  scale = jax.random.uniform(k_scale, (batch, 1, 1), minval=contrast[0], maxval=contrast[1])
  mask = jax.random.bernoulli(k_keep, keep, images.shape)
  images = images * scale * mask + noise * jax.random.normal(k_noise, images.shape)
  return images.reshape(batch, side * side)


def nt_xent(z_a: jax.Array, z_b: jax.Array, temperature: float) -> jax.Array:
  """SimCLR's loss (Chen et al. 2020, eq. 1) averaged over the 2B views: each view's positive is the
  other view of its image, its negatives the other 2B - 2 views; cosine similarities over
  `temperature`."""
  if z_a.shape != z_b.shape or z_a.ndim != 2:
    raise ValueError(f"need two (B, D) projections of equal shape, got {z_a.shape}, {z_b.shape}")
  batch = z_a.shape[0]
  z = jnp.concatenate([z_a, z_b])
  z = z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
  similarity = z @ z.T / temperature - 1e9 * jnp.eye(2 * batch)
  positives = jnp.concatenate([jnp.arange(batch) + batch, jnp.arange(batch)])
  return optax.softmax_cross_entropy_with_integer_labels(similarity, positives).mean()


def pair_accuracy(z_a: jax.Array, z_b: jax.Array) -> jax.Array:
  """Fraction of views whose nearest other view (cosine) is their own image's other view: a
  label-free check that pre-training learned something."""
  batch = z_a.shape[0]
  z = jnp.concatenate([z_a, z_b])
  z = z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
  similarity = z @ z.T - 1e9 * jnp.eye(2 * batch)
  positives = jnp.concatenate([jnp.arange(batch) + batch, jnp.arange(batch)])
  return jnp.mean(jnp.argmax(similarity, axis=-1) == positives)
