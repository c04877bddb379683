"""Spanning forests as training data: FGL's trees ("Forest-Based Graph Learning for Semi-Supervised
Node Classification", ICLR 2026), drawn by the weighted Wilson sampler of `core.graph`.

* `Forest`: an augmented graph with what trees are built from: the symmetric scores s(e) of the
  sampling law P(T) ~ prod_{e in T} s(e) and the directed propagation weight of every edge.
* `build_forest`: a `Forest` from per-edge attention; s(e_ij) = ((a_i->j + a_j->i) / 2)^power
  (the homophily estimator's scores, Eq. 3) unless scores are given (uniform or oracle trees).
* `TreeSource`: N_T trees per round, a new round every `resample_every` steps, as a `DataSource`
  whose batches are a pure function of the step.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from core import graph


@dataclasses.dataclass
class Forest:
  """G-hat with its scores: what the Wilson sampler and the tree weights are built from."""

  senders: np.ndarray
  receivers: np.ndarray
  reverse: np.ndarray
  scores: np.ndarray  # symmetric, sampling law P(T) ~ prod s(e)
  weights: np.ndarray  # directed propagation weight of every edge, in [0, 1]


def build_forest(
  senders, receivers, attention, num_nodes: int, scores=None, score_power: float = 1.0
) -> Forest:
  """The forest of a symmetric, sorted edge list with per-edge `attention` (see `core.graph`).

  Scores are s(e) = `edge_scores(attention)` ** `score_power` unless `scores` are given; they are
  floored at 1e-30 so that every edge stays samplable. The propagation weights are the attention
  relative to the receiver's most attended neighbour.
  """
  senders, receivers = np.asarray(senders), np.asarray(receivers)
  attention = np.asarray(attention, np.float64)
  reverse = graph.reverse_edges(senders, receivers, num_nodes)
  if scores is None:
    scores = graph.edge_scores(attention, reverse) ** score_power
  weights = graph.propagation_weights(attention, receivers, num_nodes)
  return Forest(senders, receivers, reverse, np.maximum(scores, 1e-30), weights)


class TreeSource:
  """N_T spanning forests per round, a new round every `resample_every` steps (FGL's forest).

  A batch is `{"parent", "weight_up", "weight_down"}` of shape [N_T, n]; tree k of round r is drawn
  from `default_rng([seed, r, k])`, so the trees of a step are a pure function of the step (resume
  replays them) and a smaller N_T uses a prefix of a larger one's trees. Trees are re-rooted at
  their centres (`core.graph.recenter`): the aggregation is root-free, its sequential depth is not.
  """

  def __init__(
    self, forest: Forest, num_nodes: int, num_trees: int, resample_every: int, seed: int
  ):
    self.forest, self.num_trees, self.resample_every, self.seed = (
      forest,
      num_trees,
      resample_every,
      seed,
    )
    self.sampler = graph.WilsonSampler(forest.senders, forest.receivers, forest.scores, num_nodes)
    self.global_batch_size = num_trees
    self._round, self._trees = -1, None
    self.seconds_per_tree: list[float] = []

  def trees(self, round_index: int) -> dict[str, np.ndarray]:
    if round_index != self._round:
      parents, ups, downs = [], [], []
      for k in range(self.num_trees):
        start = time.perf_counter()
        parent = self.sampler.sample(np.random.default_rng([self.seed, round_index, k]))[0]
        parent = graph.recenter(parent)
        self.seconds_per_tree.append(time.perf_counter() - start)
        forest = self.forest
        up, down = graph.tree_edge_weights(parent, forest.senders, forest.receivers, forest.weights)
        parents.append(parent), ups.append(up), downs.append(down)
      self._round = round_index
      self._trees = {
        "parent": np.stack(parents),
        "weight_up": np.stack(ups),
        "weight_down": np.stack(downs),
      }
    return self._trees

  def batch(
    self, step: int, process_index: int = 0, process_count: int = 1
  ) -> dict[str, np.ndarray]:
    if self.num_trees % process_count:
      raise ValueError(
        f"fgl.num_trees: {self.num_trees} is not divisible by {process_count} processes"
      )
    local = self.num_trees // process_count
    trees = self.trees(step // self.resample_every)
    return {k: v[process_index * local : (process_index + 1) * local] for k, v in trees.items()}
