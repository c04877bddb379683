"""Pure-jnp reference: three passes (abs-diff sum, norm sum, copy)."""

import jax
import jax.numpy as jnp


def relative_l1_update(current: jax.Array, previous: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-block `||current - previous||_1 / ||previous||_1` (inf where `previous` is all zero), and
  `current` (the refreshed store)."""
  axes = tuple(range(1, current.ndim))
  diff = jnp.sum(jnp.abs(current.astype(jnp.float32) - previous.astype(jnp.float32)), axis=axes)
  norm = jnp.sum(jnp.abs(previous.astype(jnp.float32)), axis=axes)
  return _ratio(diff, norm), current


def _ratio(diff: jax.Array, norm: jax.Array) -> jax.Array:
  return jnp.where(norm > 0, diff / jnp.where(norm > 0, norm, 1.0), jnp.inf)
