"""The BFS layout of a rooted forest given by a parent array, computed inside `jit`.

Every implementation of the two-pass aggregator works on the nodes *sorted by depth* (a BFS order:
each parent comes before its children) and on level tables: the rows of level `d` are
`level_ptr[d]:level_ptr[d + 1]`. The layout is derived from `parent` alone with O(n log n) integer
work (pointer jumping for the depths, a stable sort), so callers may pass nodes in any order and the
whole aggregator can be `vmap`-ed over padded trees whose parents are data.

Sorted arrays carry `block` spare rows (so that a level's last block of rows can be read with a
fixed-size slice) and a final dummy row (the parent of roots and of padding rows; it stays zero).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class TreeLayout(NamedTuple):
  """A forest in BFS order.

  Attributes:
    order: [n] node ids sorted by depth (stable): row `i` of a sorted array is node `order[i]`.
    position: [n] the inverse permutation: node `v` sits in row `position[v]`.
    parent_row: [num_rows] the row of each row's parent; the dummy row for roots and padding rows.
    level_ptr: [n + 1] level `d` occupies rows `level_ptr[d]:level_ptr[d + 1]`.
    num_levels: scalar, max depth + 1.
  """

  order: jax.Array
  position: jax.Array
  parent_row: jax.Array
  level_ptr: jax.Array
  num_levels: jax.Array


def num_rows(n: int, block: int) -> int:
  """Rows of a sorted array: room for any level's last block to overhang, and the dummy row last."""
  return block * (-(-n // block) + 1)


def node_depths(parent: jax.Array) -> jax.Array:
  """Depth of every node (roots: 0) by pointer jumping: ceil(log2 n) rounds of gathers."""
  n = parent.shape[0]
  is_root = parent < 0
  ancestor = jnp.where(is_root, jnp.arange(n, dtype=parent.dtype), parent)
  depth = (~is_root).astype(jnp.int32)
  for _ in range(max(n - 1, 0).bit_length()):
    depth = depth + depth[ancestor]
    ancestor = ancestor[ancestor]
  return depth


def tree_layout(parent: jax.Array, block: int) -> TreeLayout:
  """The BFS layout of the forest `parent` (`parent[root] = -1`), with `block` spare rows."""
  n = parent.shape[0]
  parent = parent.astype(jnp.int32)
  depth = node_depths(parent)
  order = jnp.argsort(depth, stable=True).astype(jnp.int32)
  position = jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  rows = num_rows(n, block)
  dummy = rows - 1
  sorted_parent = parent[order]
  parent_row = jnp.where(sorted_parent < 0, dummy, position[jnp.maximum(sorted_parent, 0)])
  parent_row = jnp.concatenate([parent_row, jnp.full(rows - n, dummy, jnp.int32)])
  counts = jnp.zeros(n + 1, jnp.int32).at[depth + 1].add(1)
  level_ptr = jnp.cumsum(counts).astype(jnp.int32)
  return TreeLayout(order, position, parent_row, level_ptr, jnp.max(depth) + 1)


def to_rows(values: jax.Array, layout: TreeLayout, rows: int) -> jax.Array:
  """`values` ([n, c]) in BFS order, zero-padded to `rows` rows."""
  return jnp.pad(values[layout.order], ((0, rows - values.shape[0]), (0, 0)))


def check_parent_values(parent: np.ndarray) -> None:
  """Host-side check of a concrete parent array: entries in [-1, n), every node reaches a root."""
  n = parent.shape[0]
  bad = np.flatnonzero((parent < -1) | (parent >= n))
  if bad.size:
    raise ValueError(
      f"parent: entries must be -1 (root) or a node index in [0, {n}); parent[{bad[0]}] = "
      f"{parent[bad[0]]}"
    )
  ancestor = np.where(parent < 0, np.arange(n), parent)
  for _ in range(max(n - 1, 0).bit_length() + 1):
    ancestor = ancestor[ancestor]
  stuck = np.flatnonzero(parent[ancestor] >= 0)
  if stuck.size:
    raise ValueError(
      f"parent: node {stuck[0]} never reaches a root (parent -1): the parent array has a cycle"
    )
