"""Pallas kernel for the two-pass tree aggregation: two in-kernel sweeps over depth levels.

Grid: one program per feature block (a `vmap` over trees adds a grid axis). Each program owns the
[rows, feature block] tiles of x, S and H; the level table and parent rows come in whole (on TPU they
would be scalar-prefetched; on GPU they are indexed loads). Inside, each sweep walks the levels and
each level's contiguous rows in blocks of `block` rows:

* bottom-up (deepest level first): messages `w_up * S` of a block are summed per parent with a
  `block x block` equality matrix (`same[i, j] = parent[i] == parent[j]`, one small matmul), so rows
  that share a parent write the same total and the indexed read-modify-write `S[parent] += total`
  has no write conflict (no atomics);
* top-down (root level first): `H = S + w_down * (H[parent] - w_up * S)`, a row gather from the
  finished level above.

On CPU this runs only with `interpret=True` (an emulator: correctness, not speed). The GPU/TPU
lowering of the indexed loads is the part a device run must confirm (spec Sec. 6 caveats).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def _kernel(meta_ref, parent_ref, x_ref, up_ref, down_ref, s_ref, h_ref, *, block: int):
  rows = x_ref.shape[0]
  dummy = rows - 1
  num_levels = meta_ref[0]
  offsets = lax.iota(jnp.int32, block)

  def level_range(level):
    return meta_ref[1 + level], meta_ref[2 + level]

  def for_blocks(level, body):
    start, end = level_range(level)

    def step(b, carry):
      body(start + b * block, end)
      return carry

    lax.fori_loop(0, (end - start + block - 1) // block, step, 0)

  def copy(src, dst):
    def body(b, c):
      dst[pl.ds(b * block, block), :] = src[pl.ds(b * block, block), :]
      return c

    lax.fori_loop(0, rows // block, body, 0)

  def up_block(start, end):
    valid = start + offsets < end
    rows_ = pl.ds(start, block)
    message = jnp.where(valid[:, None], up_ref[rows_, :] * s_ref[rows_, :], 0.0)
    target = jnp.where(valid, parent_ref[rows_], dummy)
    same = (target[:, None] == target[None, :]).astype(message.dtype)
    total = jnp.dot(same, message, preferred_element_type=jnp.float32).astype(message.dtype)
    s_ref[target, :] = s_ref[target, :] + total

  def down_block(start, end):
    valid = start + offsets < end
    rows_ = pl.ds(start, block)
    s_rows = s_ref[rows_, :]
    parent_h = h_ref[jnp.where(valid, parent_ref[rows_], dummy), :]
    new = s_rows + down_ref[rows_, :] * (parent_h - up_ref[rows_, :] * s_rows)
    h_ref[rows_, :] = jnp.where(valid[:, None], new, h_ref[rows_, :])

  def bottom_up(i, carry):
    for_blocks(num_levels - 1 - i, up_block)
    return carry

  def top_down(level, carry):
    for_blocks(level, down_block)
    return carry

  copy(x_ref, s_ref)
  lax.fori_loop(0, num_levels - 1, bottom_up, 0)
  copy(s_ref, h_ref)
  lax.fori_loop(1, num_levels, top_down, 0)


def feature_block(f: int) -> int:
  """Feature columns per program: all of them up to 128, else 128 (f is padded to a multiple)."""
  return f if f <= 128 else 128


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def pallas_two_pass(
  x, weight_up, weight_down, parent_row, level_ptr, num_levels, *, block: int, interpret: bool
):
  """Two-pass aggregation of BFS-sorted rows by the Pallas kernel; returns (S, H), [rows, f]."""
  rows, f = x.shape
  fb = feature_block(f)
  padded = -(-f // fb) * fb
  x = jnp.pad(x, ((0, 0), (0, padded - f)))
  per_channel = weight_up.shape[1] != 1
  if per_channel:
    weight_up = jnp.pad(weight_up, ((0, 0), (0, padded - f)))
    weight_down = jnp.pad(weight_down, ((0, 0), (0, padded - f)))
  meta = jnp.concatenate([jnp.reshape(num_levels, (1,)), level_ptr]).astype(jnp.int32)
  whole = lambda shape: pl.BlockSpec(shape, lambda j: (0,) * len(shape))
  tile = pl.BlockSpec((rows, fb), lambda j: (0, j))
  weight_spec = tile if per_channel else whole((rows, 1))
  s, h = pl.pallas_call(
    functools.partial(_kernel, block=block),
    grid=(padded // fb,),
    in_specs=[whole(meta.shape), whole((rows,)), tile, weight_spec, weight_spec],
    out_specs=[tile, tile],
    out_shape=[jax.ShapeDtypeStruct((rows, padded), x.dtype)] * 2,
    interpret=interpret,
  )(meta, parent_row, x, weight_up, weight_down)
  return s[:, :f], h[:, :f]
