"""`relative_l1_update(current, previous)`: BWCache's per-block indicator and the cache refresh, fused.

`current`, `previous`: `[blocks, batch, tokens, dim]` block outputs of this and the last computed step.
Returns `(indicator_per_block, new_previous)` with `indicator_i = ||current_i - previous_i||_1 /
||previous_i||_1` (BWCache Eq. 6; inf where `previous_i` is all zero) and `new_previous = current`.

`implementation`: "pallas" (the fused kernel: Triton on GPU, Mosaic on TPU, the interpreter on CPU),
"xla" (the jnp reference), or None (Pallas where the program runs on GPU/TPU, XLA on CPU). The
choice follows the platform the program is lowered for (`lax.platform_dependent`), not the machine
that traces it. `interpret`: for the kernel, True runs the Pallas interpreter on every platform,
False the compiled kernel of the platform lowered for, None the interpreter on CPU only.
"""

from __future__ import annotations

import functools

import jax

from kernels.block_cache import pallas, reference

IMPLEMENTATIONS = ("pallas", "xla")


def relative_l1_update(
  current: jax.Array,
  previous: jax.Array,
  *,
  implementation: str | None = None,
  interpret: bool | None = None,
):
  if current.ndim != 4 or current.shape != previous.shape:
    raise ValueError(
      "current and previous must both be [blocks, batch, tokens, dim], "
      f"got {current.shape} and {previous.shape}"
    )
  if implementation == "xla":
    return reference.relative_l1_update(current, previous)
  if implementation == "pallas":
    return pallas.relative_l1_update(current, previous, interpret=interpret)
  if implementation is None:
    kernel = functools.partial(pallas.relative_l1_update, interpret=bool(interpret))
    return jax.lax.platform_dependent(
      current, previous, cpu=reference.relative_l1_update, default=kernel
    )
  raise ValueError(
    f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}"
  )
