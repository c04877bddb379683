"""Dense O(n^2) references: the path-product operator P built explicitly (tests only).

P[v, u] = prod of `weight_up` over the nodes a on the way up from u to lca(u, v) (edges a -> Fa(a)),
times prod of `weight_down` over the nodes b on the way down from lca(u, v) to v (edges Fa(b) -> b).
Built as U[u, a] * D[v, a] at a = lca(u, v), with U = (I - A_up)^-1 and D = (I - A_down)^-1 for the
nilpotent matrices A_up[a, Fa(a)] = w_up[a] and A_down[b, Fa(b)] = w_down[b] (their powers walk up
the tree), so gradients with respect to the weights come from ordinary autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def lowest_common_ancestors(parent: np.ndarray) -> np.ndarray:
  """[n, n] lca of every pair (-1 for nodes in different trees of a forest), by lifting in NumPy."""
  parent = np.asarray(parent)
  n = parent.shape[0]
  depth = np.zeros(n, np.int64)
  for v in range(n):
    u = v
    while parent[u] >= 0:
      u, depth[v] = parent[u], depth[v] + 1
  up = lambda nodes: np.where(nodes >= 0, parent[np.maximum(nodes, 0)], -1)
  a = np.repeat(np.arange(n)[:, None], n, axis=1)
  b = a.T.copy()
  da, db = depth[a], depth[b]
  for _ in range(int(depth.max(initial=0))):
    deeper_a, deeper_b = da > db, db > da
    a, da = np.where(deeper_a, up(a), a), np.where(deeper_a, da - 1, da)
    b, db = np.where(deeper_b, up(b), b), np.where(deeper_b, db - 1, db)
  for _ in range(int(depth.max(initial=0)) + 1):
    differ = a != b
    a, b = np.where(differ, up(a), a), np.where(differ, up(b), b)
  return np.where(a == b, a, -1)


def _walk_up_products(parent: np.ndarray, weight: jax.Array) -> jax.Array:
  """[n, n, c]: M[u, a] = product of weight over the path u -> a for a an ancestor of u (else 0)."""
  n = parent.shape[0]
  child = np.flatnonzero(parent >= 0)
  eye = jnp.eye(n, dtype=weight.dtype)

  def per_channel(w):
    step = jnp.zeros((n, n), w.dtype).at[child, parent[child]].set(w[child])
    return jnp.linalg.solve(eye - step, eye)

  return jax.vmap(per_channel, in_axes=1, out_axes=2)(weight)


def path_product_matrix(parent, weight_up, weight_down=None) -> jax.Array:
  """[n, n, c] P[v, u, channel] (c = 1 for per-edge weights); zero across trees of a forest."""
  parent = np.asarray(parent)
  weight_down = weight_up if weight_down is None else weight_down
  n = parent.shape[0]
  up = _walk_up_products(parent, jnp.asarray(weight_up).reshape(n, -1))
  down = _walk_up_products(parent, jnp.asarray(weight_down).reshape(n, -1))
  lca = lowest_common_ancestors(parent)
  u_index, v_index = np.meshgrid(np.arange(n), np.arange(n))  # [v, u] grids
  meet = np.maximum(lca, 0)[v_index, u_index]
  product = up[u_index, meet] * down[v_index, meet]
  return jnp.where((lca[v_index, u_index] >= 0)[..., None], product, 0)


def tree_aggregate_reference(x, parent, weight_up, weight_down=None, *, normalize=False):
  """y = P x with the dense operator; `normalize` divides by P 1."""
  p = path_product_matrix(parent, weight_up, weight_down)
  y = jnp.einsum("vuc,uf->vf", p, x) if p.shape[2] == 1 else jnp.einsum("vuf,uf->vf", p, x)
  if normalize:
    y = y / p.sum(axis=1)
  return y


def distance_matrix(parent) -> np.ndarray:
  """[n, n] number of edges between every pair (-1 across trees)."""
  parent = np.asarray(parent)
  n = parent.shape[0]
  depth = np.array([_depth(parent, v) for v in range(n)])
  lca = lowest_common_ancestors(parent)
  dist = depth[:, None] + depth[None, :] - 2 * depth[np.maximum(lca, 0)]
  return np.where(lca >= 0, dist, -1)


def _depth(parent, v) -> int:
  d = 0
  while parent[v] >= 0:
    v, d = parent[v], d + 1
  return d


def matrix_tree_aggregate_reference(h, parent, alpha_up, alpha_down, w_a) -> jax.Array:
  """H'_v = sum_u [prod alpha on u -> v] * W_A^dist(u,v) H_u (the closed form of FGL's Theorem 1), dense."""
  p = path_product_matrix(parent, alpha_up, alpha_down)[..., 0]
  dist = distance_matrix(parent)
  powers = [jnp.eye(w_a.shape[0], dtype=w_a.dtype)]
  for _ in range(int(dist.max(initial=0))):
    powers.append(powers[-1] @ w_a)
  stacked = jnp.stack(powers)[np.maximum(dist, 0)]  # [v, u, d, d]
  return jnp.einsum("vu,vude,ue->vd", p, stacked, h)
