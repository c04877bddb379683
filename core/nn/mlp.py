"""MLP backbones shared across papers.

Both take a compute `dtype` (e.g. bfloat16: dense layers and activations) and a `param_dtype` (float32
parameters, so optimizer state and EMA stay float32), float32 by default; outputs are returned in
float32 whatever the compute dtype, since losses and samplers read them (`core/nn/precision.py`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp


def fourier_features(
  time: jnp.ndarray, num_features: int, max_frequency: float = 64.0
) -> jnp.ndarray:
  """Sin/cos features of a bounded time variable in [0, 1], log-spaced frequencies 1..max_frequency.

  `time` has shape (B,); returns (B, num_features) (num_features must be even).
  """
  if num_features % 2:
    raise ValueError(f"num_features must be even, got {num_features}")
  freqs = jnp.exp(jnp.linspace(0.0, jnp.log(max_frequency), num_features // 2))
  angles = jnp.pi * time[:, None] * freqs[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class TimeConditionedMLP(nn.Module):
  """`(x (B, D), time (B,) in [0, 1]) -> (B, D)`: SiLU MLP with Fourier time features added per layer.

  The output layer starts at zero, so an untrained network predicts 0 (for QDPM's delta-hat this is the
  uniform-prior "null model" of the paper's parameterisation).
  """

  width: int = 512
  depth: int = 3
  time_features: int = 64
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, time: jnp.ndarray) -> jnp.ndarray:
    if x.ndim != 2 or time.shape != x.shape[:1]:
      raise ValueError(f"expected x (B, D) and time (B,), got {x.shape} and {time.shape}")
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    # the Fourier angles (up to 64 pi) are computed in float32; the first Dense casts the features
    embedding = dense(self.width)(
      nn.silu(dense(self.width)(fourier_features(time, self.time_features)))
    )
    h = dense(self.width)(x)
    for _ in range(self.depth - 1):
      h = dense(self.width)(nn.silu(h + embedding))
    h = nn.silu(h + embedding)
    out = dense(x.shape[-1], kernel_init=nn.initializers.zeros)(h)
    return out.astype(jnp.float32)


class MLP(nn.Module):
  """`x (B, D) -> logits (B, num_outputs)`: ReLU layers of widths `hidden`, then a linear read-out.

  `features(x)` is the last hidden layer (the input itself when `hidden` is empty), so a trained MLP
  doubles as a frozen backbone and `MLP(hidden=(), ...)` is a linear (softmax-regression) head.
  """

  hidden: tuple[int, ...]
  num_outputs: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    self.layers = [dense(width) for width in self.hidden]
    self.readout = dense(self.num_outputs)

  def _hidden(self, x: jnp.ndarray) -> jnp.ndarray:
    if x.ndim != 2:
      raise ValueError(f"expected x (B, D), got shape {x.shape}")
    for layer in self.layers:
      x = nn.relu(layer(x))
    return x

  def features(self, x: jnp.ndarray) -> jnp.ndarray:
    """The last hidden layer in float32 (frozen features feed float32 heads)."""
    return self._hidden(x).astype(jnp.float32)

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.readout(self._hidden(x)).astype(jnp.float32)
