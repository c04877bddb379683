"""MLP backbones shared across papers."""

from __future__ import annotations

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

  @nn.compact
  def __call__(self, x: jnp.ndarray, time: jnp.ndarray) -> jnp.ndarray:
    if x.ndim != 2 or time.shape != x.shape[:1]:
      raise ValueError(f"expected x (B, D) and time (B,), got {x.shape} and {time.shape}")
    embedding = nn.Dense(self.width)(
      nn.silu(nn.Dense(self.width)(fourier_features(time, self.time_features)))
    )
    h = nn.Dense(self.width)(x)
    for _ in range(self.depth - 1):
      h = nn.Dense(self.width)(nn.silu(h + embedding))
    h = nn.silu(h + embedding)
    return nn.Dense(x.shape[-1], kernel_init=nn.initializers.zeros)(h)


class MLP(nn.Module):
  """`x (B, D) -> logits (B, num_outputs)`: ReLU layers of widths `hidden`, then a linear read-out.

  `features(x)` is the last hidden layer (the input itself when `hidden` is empty), so a trained MLP
  doubles as a frozen backbone and `MLP(hidden=(), ...)` is a linear (softmax-regression) head.
  """

  hidden: tuple[int, ...]
  num_outputs: int

  def setup(self):
    self.layers = [nn.Dense(width) for width in self.hidden]
    self.readout = nn.Dense(self.num_outputs)

  def features(self, x: jnp.ndarray) -> jnp.ndarray:
    if x.ndim != 2:
      raise ValueError(f"expected x (B, D), got shape {x.shape}")
    for layer in self.layers:
      x = nn.relu(layer(x))
    return x

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.readout(self.features(x))
