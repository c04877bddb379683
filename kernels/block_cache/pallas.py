"""Pallas kernel: one pass over each block's features computes both L1 sums and overwrites the store.

`current`, `previous` `(N, B, L, D)` are viewed as `(N, R, D)`, `R = B * L`, padded to a multiple of
the row tile with zeros (which add nothing to either sum). The grid is `(N, R / tile)`; each program
reads one `(tile, D)` tile of both, writes its two partial sums, and writes `current` into the output
that aliases `previous` (`input_output_aliases`), so the stored features are updated in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.block_cache.reference import _ratio


def _kernel(current_ref, previous_ref, new_previous_ref, diff_ref, norm_ref):
  current = current_ref[...].astype(jnp.float32)
  previous = previous_ref[...].astype(jnp.float32)
  diff_ref[...] = jnp.broadcast_to(jnp.sum(jnp.abs(current - previous)), diff_ref.shape)
  norm_ref[...] = jnp.broadcast_to(jnp.sum(jnp.abs(previous)), norm_ref.shape)
  new_previous_ref[...] = current_ref[...]


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


@functools.partial(jax.jit, static_argnames=("tile_rows", "interpret"))
def relative_l1_update(
  current: jax.Array, previous: jax.Array, *, tile_rows: int = 256, interpret: bool = False
) -> tuple[jax.Array, jax.Array]:
  blocks, shape = current.shape[0], current.shape
  dim = shape[-1]
  rows = current.size // (blocks * dim)
  tile = min(tile_rows, _round_up(rows, 8))
  padded_rows = _round_up(rows, tile)

  def as_rows(x):
    x = x.reshape(blocks, rows, dim)
    return jnp.pad(x, ((0, 0), (0, padded_rows - rows), (0, 0)))

  tiles = padded_rows // tile
  feature_spec = pl.BlockSpec((1, tile, dim), lambda n, r: (n, r, 0))
  sum_spec = pl.BlockSpec((1, 1, 1), lambda n, r: (n, r, 0))
  new_previous, diff, norm = pl.pallas_call(
    _kernel,
    grid=(blocks, tiles),
    in_specs=[feature_spec, feature_spec],
    out_specs=[feature_spec, sum_spec, sum_spec],
    out_shape=[
      jax.ShapeDtypeStruct((blocks, padded_rows, dim), previous.dtype),
      jax.ShapeDtypeStruct((blocks, tiles, 1), jnp.float32),
      jax.ShapeDtypeStruct((blocks, tiles, 1), jnp.float32),
    ],
    input_output_aliases={1: 0},
    interpret=interpret,
  )(as_rows(current), as_rows(previous))
  indicator = _ratio(diff.sum(axis=(1, 2)), norm.sum(axis=(1, 2)))
  return indicator, new_previous[:, :rows].reshape(shape)
