"""Graph utilities for forest-based graph learning (FGL: "Forest-Based Graph Learning for
Semi-Supervised Node Classification", Li et al., ICLR 2026).

Edge lists are directed `(senders, receivers)` int32 arrays holding both directions of every
undirected edge, sorted by (sender, receiver), without self loops; `reverse[e]` is the edge in the
opposite direction. Attention is per directed edge: `attention[e]` is the weight receiver
`receivers[e]` gives sender `senders[e]` (a softmax over the receiver's incoming edges), i.e. the
weight of the message that travels along e.

* message passing: `propagate` (segment_sum), `segment_softmax`, `gcn_norm_edges` (A-hat).
* augmentation (FGL's pre-processing): `knn_edges` / `augment_with_knn` in pseudo-label space.
* homophily: `edge_homophily`, `labeled_edge_homophily` (the NAAM switch),
  `homophilous_components` (NHCC of Theorem 2), `tree_edge_homophily`.
* scores (the homophily estimator, Eq. 3): `edge_scores` s(e_ij) = (a_i->j + a_j->i) / 2;
  `propagation_weights`; `attention_from_scores` for given scores: uniform, oracle
  (`oracle_scores`, `noisy_oracle_scores`) and the auxiliary model's `agreement_scores`.
* trees (the tree sampler): `WilsonSampler` draws spanning forests with P(T) ~ prod_{e in T} s(e);
  `recenter` re-roots them at their centres; `tree_levels` gives BFS order and level tables;
  `tree_edge_weights` the directed weights per tree.
* aggregation (Theorem 1, Eq. 7-8, the tree fuser): `tree_aggregate_matrix` (W_A^dist form through
  the kernel), `tree_aggregate_matrix_recursive` (Eq. 7-8 literally, any W_A),
  `orthogonal_from_skew`, `row_norm`.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from kernels.tree_aggregate import layout as layout_lib
from kernels.tree_aggregate import tree_aggregate

# ---------------------------------------------------------------------------------------------------
# Edge lists and message passing
# ---------------------------------------------------------------------------------------------------


def directed_edges(pairs: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
  """Undirected pairs [m, 2] -> sorted, deduplicated (senders, receivers), both directions, no loops."""
  pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
  if pairs.size and (pairs.min() < 0 or pairs.max() >= num_nodes):
    raise ValueError(
      f"pairs: node indices must lie in [0, {num_nodes}), got {pairs.min()}..{pairs.max()}"
    )
  pairs = pairs[pairs[:, 0] != pairs[:, 1]]
  both = np.concatenate([pairs, pairs[:, ::-1]])
  keys = np.unique(both[:, 0] * num_nodes + both[:, 1])
  return (keys // num_nodes).astype(np.int32), (keys % num_nodes).astype(np.int32)


def reverse_edges(senders: np.ndarray, receivers: np.ndarray, num_nodes: int) -> np.ndarray:
  """Index of the opposite direction of every edge of a symmetric, sorted edge list."""
  keys = senders.astype(np.int64) * num_nodes + receivers
  reverse = np.searchsorted(keys, receivers.astype(np.int64) * num_nodes + senders)
  if reverse.size and not np.array_equal(
    keys[np.minimum(reverse, keys.size - 1)], receivers.astype(np.int64) * num_nodes + senders
  ):
    raise ValueError(
      "senders/receivers: the edge list must be symmetric and sorted (use directed_edges)"
    )
  return reverse.astype(np.int32)


def propagate(x, senders, receivers, weights, num_nodes: int):
  """sum_{e: receivers[e] = i} weights[e] * x[senders[e]] for every node i."""
  return jax.ops.segment_sum(weights[:, None] * x[senders], receivers, num_segments=num_nodes)


def segment_softmax(logits, segment_ids, num_segments: int):
  """Softmax of `logits` ([E] or [E, heads]) within each segment (a receiver's incoming edges)."""
  peak = jax.ops.segment_max(logits, segment_ids, num_segments=num_segments)
  exp = jnp.exp(logits - jax.lax.stop_gradient(peak[segment_ids]))
  total = jax.ops.segment_sum(exp, segment_ids, num_segments=num_segments)
  return exp / (total[segment_ids] + 1e-16)


def gcn_norm_edges(senders, receivers, num_nodes: int):
  """Edges of A-hat = D^-1/2 (A + I) D^-1/2 (Kipf and Welling): self loops appended, with weights."""
  loops = jnp.arange(num_nodes, dtype=senders.dtype)
  senders, receivers = jnp.concatenate([senders, loops]), jnp.concatenate([receivers, loops])
  degree = jax.ops.segment_sum(jnp.ones_like(receivers, jnp.float32), receivers, num_nodes)
  inv_sqrt = jax.lax.rsqrt(degree)
  return senders, receivers, inv_sqrt[senders] * inv_sqrt[receivers]


# ---------------------------------------------------------------------------------------------------
# Homophily
# ---------------------------------------------------------------------------------------------------


def edge_homophily(senders, receivers, labels) -> float:
  """Fraction of edges whose endpoints share a label."""
  labels = np.asarray(labels)
  return float(np.mean(labels[np.asarray(senders)] == labels[np.asarray(receivers)]))


def labeled_edge_homophily(senders, receivers, labels, labeled) -> float:
  """Edge homophily over edges with both endpoints labeled (train + val); 0.5 when there are none."""
  both = np.asarray(labeled)[senders] & np.asarray(labeled)[receivers]
  if not both.any():
    return 0.5
  return edge_homophily(np.asarray(senders)[both], np.asarray(receivers)[both], labels)


def homophilous_components(senders, receivers, labels, num_nodes: int) -> int:
  """NHCC: connected components of the subgraph of same-label edges (Theorem 2's bound)."""
  labels = np.asarray(labels)
  same = labels[senders] == labels[receivers]
  adjacency = sp.coo_matrix(
    (np.ones(same.sum()), (np.asarray(senders)[same], np.asarray(receivers)[same])),
    shape=(num_nodes, num_nodes),
  )
  return int(csgraph.connected_components(adjacency, directed=False)[0])


def theorem2_bound(nhcc: int, num_nodes: int) -> float:
  """The limit of tree edge-homophily as p/q -> inf: 1 - (NHCC - 1) / (n - 1)."""
  return 1.0 - (nhcc - 1) / max(num_nodes - 1, 1)


def tree_edge_homophily(parent, labels) -> float:
  """Fraction of tree edges (v, parent(v)) whose endpoints share a label."""
  parent, labels = np.asarray(parent), np.asarray(labels)
  child = np.flatnonzero(parent >= 0)
  if child.size == 0:
    return float("nan")
  return float(np.mean(labels[child] == labels[parent[child]]))


# ---------------------------------------------------------------------------------------------------
# Augmentation and scores
# ---------------------------------------------------------------------------------------------------


def knn_edges(embeddings, k: int, chunk: int = 2048) -> np.ndarray:
  """[n * k, 2] pairs (i, j): j among the k most cosine-similar nodes to i (self excluded)."""
  x = jnp.asarray(embeddings, jnp.float32)
  n = x.shape[0]
  if not 0 < k < n:
    raise ValueError(f"k: must be in [1, {n - 1}] for {n} nodes, got {k}")
  x = x / (jnp.linalg.norm(x, axis=1, keepdims=True) + 1e-12)

  @jax.jit
  def top(rows, row_ids):
    similarity = rows @ x.T
    similarity = similarity.at[jnp.arange(rows.shape[0]), row_ids].set(-jnp.inf)
    return jax.lax.top_k(similarity, k)[1]

  neighbours = []
  for start in range(0, n, chunk):
    ids = jnp.arange(start, min(start + chunk, n))
    neighbours.append(np.asarray(top(x[ids], ids)))
  neighbours = np.concatenate(neighbours)
  return np.stack([np.repeat(np.arange(n), k), neighbours.reshape(-1)], axis=1)


def augment_with_knn(senders, receivers, embeddings, k: int) -> tuple[np.ndarray, np.ndarray]:
  """G-hat = G + kNN edges in embedding (pseudo-label) space, symmetrised and deduplicated."""
  n = np.asarray(embeddings).shape[0]
  pairs = np.concatenate([np.stack([senders, receivers], axis=1), knn_edges(embeddings, k)])
  return directed_edges(pairs, n)


def edge_scores(attention, reverse) -> np.ndarray:
  """s(e_ij) = (a_i->j + a_j->i) / 2: a symmetric score per edge from directed attention (Eq. 3)."""
  attention = np.asarray(attention, np.float64)
  return (attention + attention[reverse]) / 2


def attention_from_scores(scores, receivers, num_nodes: int) -> np.ndarray:
  """Attention proportional to given scores over each receiver's incoming edges (uniform, oracle)."""
  scores = np.asarray(scores, np.float64)
  total = np.bincount(receivers, weights=scores, minlength=num_nodes)
  return scores / total[receivers]


def oracle_scores(senders, receivers, labels, ratio: float) -> np.ndarray:
  """Binary scores of Theorem 2: `ratio` (= p/q) on same-label edges, 1 on the others."""
  labels = np.asarray(labels)
  return np.where(labels[senders] == labels[receivers], float(ratio), 1.0)


def noisy_oracle_scores(senders, receivers, labels, ratio: float, noise: float, rng) -> np.ndarray:
  """Oracle scores blurred by noise: ratio ** ((1 - noise) * 1[y_i = y_j] + noise * u_ij).

  u_ij ~ U(0, 1) is drawn once per undirected edge, so s stays symmetric; the scores stay in
  [1, ratio] at every noise level. noise = 0 gives `oracle_scores` (AUC 1), noise = 1 scores
  unrelated to the labels (AUC 1/2); in between the AUC is 1 - (1 - c)^2 / 2 with
  c = min(1, (1 - noise) / noise). The sweep over noise maps estimator quality (AUC) to accuracy.
  """
  if not 0.0 <= noise <= 1.0:
    raise ValueError(f"noise: must be in [0, 1], got {noise}")
  senders, receivers, labels = np.asarray(senders), np.asarray(receivers), np.asarray(labels)
  reverse = reverse_edges(senders, receivers, labels.shape[0])
  u = rng.random(senders.size)
  u = np.where(senders < receivers, u, u[reverse])
  same = (labels[senders] == labels[receivers]).astype(np.float64)
  return float(ratio) ** ((1.0 - noise) * same + noise * u)


def agreement_scores(senders, receivers, probabilities, floor: float = 1e-6) -> np.ndarray:
  """s(e_ij) = sum_c p_i(c) p_j(c): the chance that the auxiliary model's predicted class
  distributions at the two ends agree (a baseline homophily score without attention).

  Symmetric and in [floor, 1] (a product of two distributions sums to at most max_c p_i(c)); the
  floor keeps every edge samplable and every receiver's score total positive.
  """
  p = np.asarray(probabilities, np.float64)
  senders, receivers = np.asarray(senders), np.asarray(receivers)
  if p.ndim != 2 or (senders.size and max(senders.max(), receivers.max()) >= p.shape[0]):
    raise ValueError(f"probabilities: expected [num_nodes, num_classes], got shape {p.shape}")
  return np.clip(np.sum(p[senders] * p[receivers], axis=1), floor, 1.0)


def propagation_weights(attention, receivers, num_nodes: int) -> np.ndarray:
  """Tree edge weights in [0, 1]: attention relative to the receiver's most attended neighbour."""
  attention = np.asarray(attention, np.float64)
  peak = np.full(num_nodes, -np.inf)
  np.maximum.at(peak, receivers, attention)
  return attention / np.maximum(peak[receivers], 1e-30)


# ---------------------------------------------------------------------------------------------------
# Spanning trees: weighted Wilson sampler, BFS levels, per-tree weights
# ---------------------------------------------------------------------------------------------------


class WilsonSampler:
  """Spanning forests of a weighted graph with P(T) proportional to prod_{e in T} s(e) (FGL's sampler).

  Wilson's algorithm: one root per connected component (uniform within it; the law of the tree
  does not depend on the root), then from each node not yet in the tree a random walk with
  transitions proportional to s, remembering only the last exit from each node (loop erasure),
  until it hits the tree; the walk's path is added. The walk is sequential and data-dependent, so
  it runs on the host as plain Python over lists (~1 us a step; networkx's sampler is ~100x
  slower); the trees are the data of the student phase, like any input pipeline.
  """

  def __init__(self, senders, receivers, scores, num_nodes: int):
    senders, receivers = np.asarray(senders), np.asarray(receivers)
    scores = np.asarray(scores, np.float64)
    if scores.shape != senders.shape:
      raise ValueError(f"scores: expected shape {senders.shape} (one per edge), got {scores.shape}")
    if not np.all(np.isfinite(scores) & (scores > 0)):
      raise ValueError("scores: must be finite and positive on every edge")
    order = np.lexsort((receivers, senders))
    self.num_nodes = num_nodes
    indptr = np.searchsorted(senders[order], np.arange(num_nodes + 1))
    cumulative = np.cumsum(scores[order])
    row_start = np.concatenate([[0.0], cumulative])[indptr[:-1]]
    row_total = cumulative[np.maximum(indptr[1:] - 1, 0)] - row_start
    row_of_slot = np.repeat(np.arange(num_nodes), np.diff(indptr))
    normalised = (cumulative - row_start[row_of_slot]) / row_total[row_of_slot]
    normalised[indptr[1:][np.diff(indptr) > 0] - 1] = 1.0
    self._indptr = indptr.tolist()
    self._targets = receivers[order].tolist()
    self._edges = order.tolist()
    self._cumulative = normalised.tolist()
    adjacency = sp.coo_matrix((np.ones(len(senders)), (senders, receivers)), (num_nodes,) * 2)
    _, self.component = csgraph.connected_components(adjacency, directed=False)

  def sample(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One spanning forest: (parent [n] with -1 at roots, parent_edge [n]: edge v -> parent(v))."""
    n = self.num_nodes
    in_tree, nxt, nxt_edge = [False] * n, [-1] * n, [-1] * n
    for members in _group_by(self.component):
      in_tree[int(rng.choice(members))] = True
    roots = [v for v in range(n) if in_tree[v]]
    indptr, targets, edges, cumulative = self._indptr, self._targets, self._edges, self._cumulative
    uniforms, used = rng.random(8192).tolist(), 0
    for start in rng.permutation(n).tolist():
      u = start
      while not in_tree[u]:
        if used == len(uniforms):
          uniforms, used = rng.random(8192).tolist(), 0
        slot = bisect.bisect_right(cumulative, uniforms[used], indptr[u], indptr[u + 1] - 1)
        used += 1
        nxt[u], nxt_edge[u] = targets[slot], edges[slot]
        u = targets[slot]
      u = start
      while not in_tree[u]:
        in_tree[u] = True
        u = nxt[u]
    parent, parent_edge = np.asarray(nxt, np.int32), np.asarray(nxt_edge, np.int32)
    parent[roots], parent_edge[roots] = -1, -1
    return parent, parent_edge


def _group_by(component: np.ndarray) -> list[np.ndarray]:
  order = np.argsort(component, kind="stable")
  return np.split(order, np.flatnonzero(np.diff(component[order])) + 1)


class TreeLevels(NamedTuple):
  """BFS order and level tables of a forest (host side)."""

  order: np.ndarray  # [n] BFS order (roots first; children of a node are contiguous)
  depth: np.ndarray  # [n] depth per node
  level_ptr: np.ndarray  # [num_levels + 1] level d is order[level_ptr[d]:level_ptr[d + 1]]
  children_ptr: (
    np.ndarray
  )  # [n + 1] children of node v: children[children_ptr[v]:children_ptr[v + 1]]
  children: np.ndarray  # [n - num_roots]


def tree_levels(parent) -> TreeLevels:
  """BFS order (scipy breadth_first_order from a virtual super-root) and level tables."""
  parent = np.asarray(parent)
  n = parent.shape[0]
  child = np.flatnonzero(parent >= 0)
  heads = np.where(parent >= 0, parent, n)
  edges = sp.csr_matrix((np.ones(n), (heads, np.arange(n))), shape=(n + 1, n + 1))
  order = csgraph.breadth_first_order(edges, n, directed=True, return_predecessors=False)[1:]
  depth = np.asarray(layout_lib.node_depths(jnp.asarray(parent, jnp.int32)))
  level_ptr = np.concatenate([[0], np.cumsum(np.bincount(depth))])
  by_parent = child[np.argsort(parent[child], kind="stable")]
  children_ptr = np.concatenate([[0], np.cumsum(np.bincount(parent[child], minlength=n))])
  return TreeLevels(order.astype(np.int32), depth, level_ptr, children_ptr, by_parent)


def recenter(parent) -> np.ndarray:
  """The same forest re-rooted at the centre of each tree (middle of a longest path).

  The all-pairs aggregation does not depend on the root, but its number of sequential steps is
  the height: rooting at the centre makes it ceil(diameter / 2), about half of a random root's.
  """
  parent = np.asarray(parent)
  n = parent.shape[0]
  child = np.flatnonzero(parent >= 0)
  adjacency = sp.coo_matrix((np.ones(child.size), (child, parent[child])), shape=(n, n)).tocsr()
  new_parent = np.full(n, -1, np.int32)
  for root in np.flatnonzero(parent < 0):
    far = csgraph.breadth_first_order(adjacency, root, directed=False, return_predecessors=False)[
      -1
    ]
    order, predecessors = csgraph.breadth_first_order(adjacency, far, directed=False)
    path = [order[-1]]
    while path[-1] != far:
      path.append(predecessors[path[-1]])
    centre = path[len(path) // 2]
    members, predecessors = csgraph.breadth_first_order(adjacency, centre, directed=False)
    new_parent[members[1:]] = predecessors[members[1:]]
  return new_parent


def edge_ids(senders, receivers, num_nodes: int, u, v) -> np.ndarray:
  """Index of the directed edge u -> v in a sorted edge list, for arrays of pairs (must exist)."""
  keys = np.asarray(senders, np.int64) * num_nodes + np.asarray(receivers)
  wanted = np.asarray(u, np.int64) * num_nodes + np.asarray(v)
  ids = np.searchsorted(keys, wanted)
  if ids.size and not np.array_equal(keys[np.minimum(ids, keys.size - 1)], wanted):
    raise ValueError("u, v: some pairs are not edges of the graph")
  return ids


def tree_edge_weights(parent, senders, receivers, edge_weight) -> tuple[np.ndarray, np.ndarray]:
  """(w_up, w_down) per node: weight of the edge v -> parent(v) and of parent(v) -> v (0 at roots)."""
  parent = np.asarray(parent)
  n = parent.shape[0]
  child = np.flatnonzero(parent >= 0)
  edge_weight = np.asarray(edge_weight, np.float32)
  up, down = np.zeros(n, np.float32), np.zeros(n, np.float32)
  up[child] = edge_weight[edge_ids(senders, receivers, n, child, parent[child])]
  down[child] = edge_weight[edge_ids(senders, receivers, n, parent[child], child)]
  return up, down


# ---------------------------------------------------------------------------------------------------
# Tree aggregation with a per-hop matrix (W_A^dist form, Eq. 7-8) and RowNorm
# ---------------------------------------------------------------------------------------------------


def orthogonal_from_skew(raw: jax.Array) -> jax.Array:
  """Cayley map (I - A)^-1 (I + A) of A = triu(raw, 1) - triu(raw, 1)^T: orthogonal, I at raw = 0."""
  upper = jnp.triu(raw, 1)
  skew = upper - upper.T
  eye = jnp.eye(raw.shape[0], dtype=raw.dtype)
  return jnp.linalg.solve(eye - skew, eye + skew)


def tree_aggregate_matrix(
  h, parent, alpha_up, alpha_down, eigenvalues, basis=None, *, implementation=None
):
  """H'_v = sum_u [prod of alpha on u -> v] W_A^dist(u,v) H_u for W_A = U diag(lambda) U^T.

  With W_A symmetric, W_A^k = U diag(lambda^k) U^T, so in the eigenbasis every channel j is the
  scalar tree aggregation with edge weights alpha * lambda_j: one kernel call with per-channel
  weights, O(n d^2) for the two rotations and O(n d) for the passes (`basis=None`: W_A diagonal,
  no rotation). |lambda| < 1 keeps ||W_A||_2 < 1, so long paths cannot blow W_A^dist up.

  Args:
    h: [n, d] node inputs (H = X W_B).
    parent: [n] (-1 at roots).
    alpha_up, alpha_down: [n] directed edge weights v -> Fa(v) and Fa(v) -> v.
    eigenvalues: [d] lambda.
    basis: [d, d] orthogonal U, or None for U = I.
    implementation: passed to `tree_aggregate`.
  """
  d = h.shape[1]
  if eigenvalues.shape != (d,) or (basis is not None and basis.shape != (d, d)):
    raise ValueError(
      f"eigenvalues/basis: expected ({d},) and ({d}, {d}) for h {h.shape}, got "
      f"{eigenvalues.shape} and {None if basis is None else basis.shape}"
    )
  weight_up = alpha_up[:, None] * eigenvalues[None, :]
  weight_down = alpha_down[:, None] * eigenvalues[None, :]
  rotated = h if basis is None else h @ basis
  out = tree_aggregate(rotated, parent, weight_up, weight_down, implementation=implementation)
  return out if basis is None else out @ basis.T


def tree_aggregate_matrix_recursive(h, parent, alpha_up, alpha_down, w_a):
  """Eq. 7-8 literally, for any W_A (one node per step in BFS order; differentiable by autodiff).

  bottom-up:  S_u = H_u + sum_{v in ch(u)} alpha_{v->u} W_A S_v
  top-down:   H'_root = S_root,  H'_v = S_v + alpha_{Fa(v)->v} W_A (H'_Fa(v) - alpha_{v->Fa(v)} W_A S_v)
  """
  n = h.shape[0]
  layout = layout_lib.tree_layout(jnp.asarray(parent), block=1)
  rows = layout_lib.num_rows(n, 1)
  is_root = jnp.asarray(parent)[layout.order] < 0
  up = layout_lib.to_rows(jnp.where(jnp.asarray(parent) < 0, 0, alpha_up)[:, None], layout, rows)[
    :, 0
  ]
  down = layout_lib.to_rows(jnp.asarray(alpha_down)[:, None], layout, rows)[:, 0]
  hop = lambda row: row @ w_a.T  # W_A applied to a row vector

  def bottom_up(k, s):
    i = n - 1 - k
    return s.at[layout.parent_row[i]].add(up[i] * hop(s[i]))

  s = jax.lax.fori_loop(0, n, bottom_up, layout_lib.to_rows(h, layout, rows))

  def top_down(i, out):
    outside = out[layout.parent_row[i]] - up[i] * hop(s[i])
    return out.at[i].set(jnp.where(is_root[i], s[i], s[i] + down[i] * hop(outside)))

  out = jax.lax.fori_loop(0, n, top_down, s)
  return out[layout.position]


def row_norm(x, eps: float = 1e-12):
  """RowNorm (the tree fuser): every row scaled to unit L2 norm."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)
