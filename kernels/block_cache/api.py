"""`relative_l1_update(current, previous)`: BWCache's per-block indicator and the cache refresh, fused.

`current`, `previous`: `[blocks, batch, tokens, dim]` block outputs of this and the last computed step.
Returns `(indicator_per_block, new_previous)` with `indicator_i = ||current_i - previous_i||_1 /
||previous_i||_1` (BWCache Eq. 6; inf where `previous_i` is all zero) and `new_previous = current`.

`implementation`: "pallas" (the fused kernel; interpreted on CPU), "xla" (the jnp reference), or None
(Pallas on GPU/TPU, XLA on CPU).
"""

from __future__ import annotations

import jax

from kernels.block_cache import pallas, reference

IMPLEMENTATIONS = ("pallas", "xla")


def relative_l1_update(
  current: jax.Array, previous: jax.Array, *, implementation: str | None = None
):
  if current.ndim != 4 or current.shape != previous.shape:
    raise ValueError(
      "current and previous must both be [blocks, batch, tokens, dim], "
      f"got {current.shape} and {previous.shape}"
    )
  if implementation is None:
    implementation = "xla" if jax.default_backend() == "cpu" else "pallas"
  if implementation == "xla":
    return reference.relative_l1_update(current, previous)
  if implementation == "pallas":
    return pallas.relative_l1_update(current, previous, interpret=jax.default_backend() == "cpu")
  raise ValueError(
    f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}"
  )
