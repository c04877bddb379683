"""Pure-JAX references for the diagonal linear recurrence `h_t = a_t * h_{t-1} + b_t`.

Three forms of the scan the DCD SSM paper (arXiv 2603.01959) analyses: the sequential form
(`lax.scan`, O(T) work, T steps), the parallel form (`lax.associative_scan` with the affine-map
composition, O(T log T) work, log T depth) and, for the
special case `b = 0`, `|a| = 1`, the exact cumulative-phase oracle `h_t = h0 * exp(i sum_{s<=t} theta_s)`.

All functions take `a`, `b` of shape `[batch, time, dim]` and `h0` of shape `[batch, dim]` of one common
dtype (the public `ssm_scan` validates and promotes); `reverse=True` runs the recurrence from the last
step to the first, `h_t = a_t * h_{t+1} + b_t` with `h_T = h0`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sequential_scan(a: jax.Array, b: jax.Array, h0: jax.Array, reverse: bool = False) -> jax.Array:
  """All states by a `lax.scan` over time (the reference the kernel's gradients are checked against)."""

  def step(h, ab):
    a_t, b_t = ab
    h = a_t * h + b_t
    return h, h

  _, h = jax.lax.scan(step, h0, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)), reverse=reverse)
  return jnp.swapaxes(h, 0, 1)


def combine(earlier, later):
  """Composition of affine maps `h -> a h + b`, `earlier` applied first: the associative operator of
  parallel scans (as in S5)."""
  a_i, b_i = earlier
  a_j, b_j = later
  return a_j * a_i, a_j * b_i + b_j


def associative_scan(a: jax.Array, b: jax.Array, h0: jax.Array, reverse: bool = False) -> jax.Array:
  """All states by `lax.associative_scan`; `h0` is folded into the first step's `b`."""
  first = -1 if reverse else 0
  b = b.at[:, first].add(a[:, first] * h0)
  _, h = jax.lax.associative_scan(combine, (a, b), axis=1, reverse=reverse)
  return h


def unit_phase_oracle(theta: jax.Array, h0: jax.Array) -> jax.Array:
  """`h_t = h0 * exp(i * cumsum(theta)_t)`: the scan of `a = exp(i theta)`, `b = 0`, exact in phase.

  Angles are wrapped to [-pi, pi) after the cumulative sum so the oracle does not lose precision on
  long sequences.
  """
  phase = jnp.cumsum(theta, axis=1)
  phase = jnp.mod(phase + jnp.pi, 2 * jnp.pi) - jnp.pi
  return h0[:, None, :] * jnp.exp(1j * phase)
