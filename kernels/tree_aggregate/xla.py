"""Pure-JAX two-pass tree aggregation on BFS-sorted rows: level-synchronous and sequential.

Both take the rows of a batch of K `TreeLayout`s (see `layout.py`; every array has a leading tree
axis) and return `(S, H)`, each [K, rows, f]:

  bottom-up (leaves -> root):  S_u = x_u + sum_{v in ch(u)} w_up[v] * S_v
  top-down  (root -> leaves):  H_root = S_root,  H_v = S_v + w_down[v] * (H_Fa(v) - w_up[v] * S_v)

(FGL, Eq. 7-8 with W_A = I; the TreeFilter refine recursion). `H_Fa(v) - w_up[v] S_v` is
the aggregate at the parent of everything outside v's subtree, so H_v sums over all n nodes.
Weights are [K, rows, c] with c = 1 (one weight per edge) or c = f (one per edge and channel).

The trees of a batch are swept in lockstep and the loop bounds are maxima over the batch, so a
`vmap` over trees never turns a loop predicate into per-tree data (which would make XLA select the
whole carry on every iteration); rows past a tree's own bound are masked.

* `levels_two_pass`: one step per depth level; a level's rows are contiguous, handled in blocks of
  `block` rows (a padded level table: ceil(width / block) blocks per level), so the work is
  O(n f + depth * block * f) per tree and the sequential depth is the depth, not n.
* `sequential_two_pass`: one row per step in BFS order, O(n f) work and n sequential steps; fastest
  on CPU for small batches, where a loop step costs no kernel launch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _gather_rows(array, rows):
  """array[k, rows[k]] for a [K, R, ...] array and [K, B] row indices -> [K, B, ...]."""
  return jax.vmap(lambda a, r: a[r])(array, rows)


def _scatter_add_rows(array, rows, values):
  return jax.vmap(lambda a, r, v: a.at[r].add(v))(array, rows, values)


def levels_two_pass(x, weight_up, weight_down, parent_row, level_ptr, num_levels, *, block: int):
  """Level-synchronous two passes over a batch of trees; returns (S, H), each [K, rows, f]."""
  rows_total = x.shape[1]
  dummy = rows_total - 1
  offsets = jnp.arange(block, dtype=jnp.int32)
  levels = jnp.max(num_levels)

  def for_blocks(level, body, carry):
    start, end = level_ptr[:, level], level_ptr[:, level + 1]
    count = jnp.max((end - start + block - 1) // block)

    def step(b, carry):
      rows = (start + b * block)[:, None] + offsets
      valid = rows < end[:, None]
      return body(jnp.minimum(rows, dummy), valid, carry)

    return lax.fori_loop(0, count, step, carry)

  def up_block(rows, valid, s):
    message = _gather_rows(weight_up, rows) * _gather_rows(s, rows)
    target = jnp.where(valid, _gather_rows(parent_row, rows), dummy)
    return _scatter_add_rows(s, target, jnp.where(valid[..., None], message, 0))

  s = lax.fori_loop(0, levels - 1, lambda i, s: for_blocks(levels - 1 - i, up_block, s), x)

  def down_block(rows, valid, h):
    s_rows, h_rows = _gather_rows(s, rows), _gather_rows(h, rows)
    parent_h = _gather_rows(h, _gather_rows(parent_row, rows))
    up, down = _gather_rows(weight_up, rows), _gather_rows(weight_down, rows)
    change = s_rows + down * (parent_h - up * s_rows) - h_rows
    return _scatter_add_rows(
      h, jnp.where(valid, rows, dummy), jnp.where(valid[..., None], change, 0)
    )

  h = lax.fori_loop(1, levels, lambda level, h: for_blocks(level, down_block, h), s)
  return s, h


def sequential_two_pass(x, weight_up, weight_down, parent_row, level_ptr, num_levels):
  """One row per step in BFS order (reverse order bottom-up), all trees at once; returns (S, H)."""
  del num_levels
  dummy = x.shape[1] - 1
  n = level_ptr.shape[1] - 1
  trees = jnp.arange(x.shape[0])

  def up(k, s):
    i = n - 1 - k
    target = parent_row[:, i]
    message = jnp.where((target != dummy)[:, None], weight_up[:, i] * s[:, i], 0)
    return s.at[trees, target].add(message)

  s = lax.fori_loop(0, n, up, x)

  def down(i, h):
    target = parent_row[:, i]
    s_i = s[:, i]
    new = s_i + weight_down[:, i] * (h[trees, target] - weight_up[:, i] * s_i)
    return h.at[:, i].set(jnp.where((target == dummy)[:, None], s_i, new))

  h = lax.fori_loop(0, n, down, s)
  return s, h
