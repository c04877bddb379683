"""Node-classification graphs: contextual SBM with controlled edge homophily, few-label splits, and
the Planetoid citation graphs (Cora, Citeseer, Pubmed) read from their raw files.

* `contextual_sbm` (the synthetic graphs of FGL's CPU study; FGL is "Forest-Based Graph Learning
  for Semi-Supervised Node Classification", ICLR 2026): balanced classes, features
  x_i = mu_{y_i} + sigma eps with mu_c ~ N(0, I) r / sqrt(d) (r = feature SNR), and an edge set
  whose *measured* edge homophily is the asked h to within 0.02 (exact same-class/cross-class
  counts, then a few edges that join stray components to the largest one, same-class with
  probability h).
* `few_label_split`: `labels_per_class` training nodes per class, a `val_fraction` of the nodes for
  validation, the rest for test.
* `load_planetoid`: the raw Planetoid format (`ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}`)
  from a prepared directory (never downloaded), processed as in PyG's `read_planetoid_data`
  (Citeseer's isolated test nodes padded), with the standard public split.
* `GraphDataset` / `graph_dataset`: a graph and its split with the device copies a full-batch model
  reads (features, labels, one float mask per split).

This module only reads files; it writes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from core.graph import directed_edges, edge_homophily

PLANETOID = ("cora", "citeseer", "pubmed")


class GraphData(NamedTuple):
  """A node-classification graph (host arrays); edges as in `core.graph` (both directions)."""

  features: np.ndarray  # [n, d] float32
  labels: np.ndarray  # [n] int32
  senders: np.ndarray  # [E] int32
  receivers: np.ndarray  # [E] int32
  num_classes: int


class Split(NamedTuple):
  train: np.ndarray  # node indices
  val: np.ndarray
  test: np.ndarray


@dataclasses.dataclass(frozen=True)
class GraphDataset:
  """A graph, its split, and device copies of what every full-batch forward pass needs."""

  graph: GraphData
  split: Split
  features: jax.Array
  labels: jax.Array
  masks: Mapping[str, jax.Array]  # "train" | "val" | "test" -> float [n]

  @property
  def num_nodes(self) -> int:
    return self.graph.labels.shape[0]


def graph_dataset(graph: GraphData, split: Split) -> GraphDataset:
  """`graph` and `split` with device features, labels and a 0/1 float mask per split."""
  n = graph.labels.shape[0]
  masks = {}
  for name in ("train", "val", "test"):
    mask = np.zeros(n, np.float32)
    mask[getattr(split, name)] = 1.0
    masks[name] = jnp.asarray(mask)
  return GraphDataset(graph, split, jnp.asarray(graph.features), jnp.asarray(graph.labels), masks)


# ---------------------------------------------------------------------------------------------------
# Contextual SBM
# ---------------------------------------------------------------------------------------------------


def contextual_sbm(
  num_nodes: int,
  num_classes: int,
  feature_dim: int,
  homophily: float,
  avg_degree: float,
  feature_snr: float,
  seed: int,
  noise: float = 1.0,
  tolerance: float = 0.02,
) -> GraphData:
  """A CSBM graph whose measured edge homophily is within `tolerance` of `homophily`."""
  if not 0.0 <= homophily <= 1.0:
    raise ValueError(f"homophily: must be in [0, 1], got {homophily}")
  if num_classes < 2 or num_nodes < 2 * num_classes:
    raise ValueError(f"num_classes: need 2 <= C <= n / 2, got C={num_classes}, n={num_nodes}")
  if avg_degree <= 0:
    raise ValueError(f"avg_degree: must be positive, got {avg_degree}")
  rng = np.random.default_rng(seed)
  labels = rng.permutation(np.arange(num_nodes) % num_classes).astype(np.int32)
  means = rng.normal(size=(num_classes, feature_dim)) * feature_snr / np.sqrt(feature_dim)
  features = means[labels] + noise * rng.normal(size=(num_nodes, feature_dim))
  num_edges = int(round(avg_degree * num_nodes / 2))
  same = int(round(homophily * num_edges))
  pairs = np.concatenate(
    [_draw_pairs(labels, same, True, rng), _draw_pairs(labels, num_edges - same, False, rng)]
  )
  pairs = np.concatenate([pairs, _joining_pairs(pairs, labels, homophily, rng)])
  senders, receivers = directed_edges(pairs, num_nodes)
  measured = edge_homophily(senders, receivers, labels)
  if abs(measured - homophily) > tolerance:
    raise ValueError(
      f"homophily: measured {measured:.4f} is not within {tolerance} of {homophily}; the graph is "
      f"too small for this tolerance (num_nodes={num_nodes}, avg_degree={avg_degree})"
    )
  return GraphData(features.astype(np.float32), labels, senders, receivers, num_classes)


def _draw_pairs(labels, count: int, same_class: bool, rng) -> np.ndarray:
  """`count` distinct undirected pairs, all same-class or all cross-class, no self loops."""
  n = labels.shape[0]
  by_class = [np.flatnonzero(labels == c) for c in range(labels.max() + 1)]
  keys: set[int] = set()
  chosen = []
  while len(chosen) < count:
    sources = rng.integers(0, n, size=2 * (count - len(chosen)) + 16)
    for i in sources.tolist():
      j = _partner(i, labels, by_class, same_class, rng)
      key = min(i, j) * n + max(i, j)
      if j != i and key not in keys:
        keys.add(key)
        chosen.append((i, j))
        if len(chosen) == count:
          break
  return np.asarray(chosen, np.int64).reshape(-1, 2)


def _partner(i: int, labels, by_class, same_class: bool, rng) -> int:
  own = int(labels[i])
  if same_class:
    return int(rng.choice(by_class[own]))
  other = int(rng.integers(0, len(by_class) - 1))
  other += other >= own
  return int(rng.choice(by_class[other]))


def _joining_pairs(pairs, labels, homophily: float, rng) -> np.ndarray:
  """One edge from every component but the largest into the largest (same class w.p. h)."""
  n = labels.shape[0]
  adjacency = sp.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
  count, component = csgraph.connected_components(adjacency, directed=False)
  if count == 1:
    return np.zeros((0, 2), np.int64)
  largest = np.argmax(np.bincount(component))
  inside = np.flatnonzero(component == largest)
  joins = []
  for c in range(count):
    if c == largest:
      continue
    node = int(rng.choice(np.flatnonzero(component == c)))
    same = inside[labels[inside] == labels[node]]
    other = inside[labels[inside] != labels[node]]
    pool = same if (rng.random() < homophily and same.size) or not other.size else other
    joins.append((node, int(rng.choice(pool))))
  return np.asarray(joins, np.int64)


# ---------------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------------


def few_label_split(labels, labels_per_class: int, val_fraction: float, seed: int) -> Split:
  """Class-balanced training nodes, a random validation fraction of the rest, the remainder test."""
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  train = []
  for c in range(labels.max() + 1):
    members = np.flatnonzero(labels == c)
    if members.size <= labels_per_class:
      raise ValueError(
        f"labels_per_class: class {c} has {members.size} nodes, need more than {labels_per_class}"
      )
    train.append(rng.choice(members, labels_per_class, replace=False))
  train = np.sort(np.concatenate(train))
  rest = rng.permutation(np.setdiff1d(np.arange(labels.size), train))
  num_val = int(round(val_fraction * labels.size))
  if not 0 < num_val < rest.size:
    raise ValueError(f"val_fraction: {val_fraction} leaves no validation or no test nodes")
  return Split(train, np.sort(rest[:num_val]), np.sort(rest[num_val:]))


# ---------------------------------------------------------------------------------------------------
# Planetoid
# ---------------------------------------------------------------------------------------------------


def planetoid_dir(name: str, data_dir: str) -> str:
  """The folder holding `ind.<name>.*`: `data_dir` itself or PyG's `<data_dir>/<Name>/raw`."""
  for candidate in (data_dir, os.path.join(data_dir, name.capitalize(), "raw")):
    if os.path.exists(os.path.join(candidate, f"ind.{name}.graph")):
      return candidate
  raise FileNotFoundError(
    f"data.data_dir: no ind.{name}.graph in {data_dir} or {data_dir}/{name.capitalize()}/raw; "
    "prepare the raw Planetoid files there (nothing is downloaded)"
  )


def load_planetoid(name: str, data_dir: str, row_normalize: bool = True) -> tuple[GraphData, Split]:
  """Cora/Citeseer/Pubmed from raw Planetoid files, with the public split (20/class, 500, 1000)."""
  if name not in PLANETOID:
    raise ValueError(f"data.name: must be one of {PLANETOID}, got {name!r}")
  folder = planetoid_dir(name, data_dir)
  raw = {key: _read(folder, name, key) for key in ("x", "tx", "allx", "y", "ty", "ally", "graph")}
  with open(os.path.join(folder, f"ind.{name}.test.index")) as f:
    test_index = np.array([int(line) for line in f if line.strip()], np.int64)
  tx, ty = _dense(raw["tx"]), np.asarray(raw["ty"])
  sorted_test = np.sort(test_index)
  if name == "citeseer":  # isolated test nodes have no rows in tx/ty: pad them with zeros
    span = sorted_test[-1] - sorted_test[0] + 1
    tx_full, ty_full = np.zeros((span, tx.shape[1])), np.zeros((span, ty.shape[1]))
    tx_full[sorted_test - sorted_test[0]], ty_full[sorted_test - sorted_test[0]] = tx, ty
    tx, ty = tx_full, ty_full
  features = np.concatenate([_dense(raw["allx"]), tx]).astype(np.float32)
  labels = np.concatenate([np.asarray(raw["ally"]), ty]).argmax(1).astype(np.int32)
  features[test_index], labels[test_index] = features[sorted_test], labels[sorted_test]
  if row_normalize:
    features = features / np.maximum(features.sum(1, keepdims=True), 1e-12)
  n = features.shape[0]
  pairs = [(u, v) for u, vs in raw["graph"].items() for v in vs if u < n and v < n]
  senders, receivers = directed_edges(np.asarray(pairs, np.int64), n)
  num_train = np.asarray(raw["y"]).shape[0]
  split = Split(np.arange(num_train), np.arange(num_train, num_train + 500), sorted_test)
  return GraphData(features, labels, senders, receivers, int(labels.max()) + 1), split


def _read(folder: str, name: str, key: str):
  with open(os.path.join(folder, f"ind.{name}.{key}"), "rb") as f:
    return pickle.load(f, encoding="latin1")


def _dense(matrix) -> np.ndarray:
  return np.asarray(matrix.todense()) if sp.issparse(matrix) else np.asarray(matrix)
