"""FGL: "Forest-Based Graph Learning for Semi-Supervised Node Classification" (Li et al., ICLR 2026).

Claim: message passing as transport over spanning trees sampled with P(T) ~ prod_{e in T} s(e),
s an attention-based homophily score, reaches all n^2 node pairs in linear time through a two-pass
tree aggregator, and beats local GNNs (GCN, GAT) on heterophilous graphs while staying close to them
on homophilous ones (spec fgl_forest.md Sec. 2-4).

Phases for `config.model.kind = "fgl"` (each a phase of the shared loop; the graph is full-batch and
closed over, so `data` is None except for the student, whose data are the sampled trees):
  naam       pre-trains the non-attention auxiliary model (Sec. 2.1): a GCN if the homophily
             estimated on labeled (train + val) edges is > 0.5, else an MLP (`fgl.naam`); its
             outputs are pseudo-labels and G-hat = G + the k most similar nodes per node in
             pseudo-label (softmax) space (`core.graph.augment_with_knn`).
  estimator  (`fgl.scores = "estimator"`) local Q/K/V attention on G-hat trained with cross-entropy on
             the pseudo-labels (Eq. 3, "two-stage" estimator); s(e_ij) = (a_i->j + a_j->i) / 2.
  student    N_T spanning forests of G-hat from the weighted Wilson sampler, resampled every
             `fgl.resample_every` epochs (the phase's DataSource: trees as a pure function of the
             step); per tree the two-pass aggregation with W_A^dist (Eq. 7-8, `kernels/tree_aggregate`),
             RowNorm, mean over trees, fused with the local module (Eq. 9-11; `core.nn.gnn.FGLStudent`).
`fgl.scores = "uniform"` (s = 1: uniform spanning trees) and `"oracle"` (s = p on same-label edges,
q otherwise, p/q = `fgl.oracle_ratio`) replace the estimator. Baselines (`mlp`, `gcn`, `gat`) are
one phase `train` on G, or `naam` then `train` on G-hat (`model.graph = "augmented"`, the reviewers'
"GCN on G-hat"). `config.analysis` selects evaluate-only runs: `theorem2` (tree homophily against
p/q toward 1 - (NHCC - 1)/(n - 1), no training) and `scaling` (aggregator vs dense attention time).

Choices where the paper is open (spec Sec. 2, 7):
* alpha is frozen after the estimator phase (the reviewers' open question); the student's tree edge
  weights are alpha relative to the receiver's most attended neighbour (in [0, 1]), the local
  module's A_alpha is alpha itself (rows sum to 1).
* W_A is diagonal, diag(tanh theta) (`fgl.w_a = "diagonal"`; the spec's "pre-multiply if W_A is
  diagonal"), or symmetric U diag(tanh theta) U^T with U orthogonal by the Cayley map
  (`"symmetric"`); either way ||W_A||_2 < 1 (the spec's stability note) and W_A^dist costs one
  kernel call with per-channel weights. Diagonal is the default: on CPU the gradient of the
  Cayley map's 64 x 64 solve costs more than the tree passes themselves.
* RowNorm is L2 row normalisation; fusion is RowNorm(local) + gamma * mean_k RowNorm(tree_k), gamma
  learnable; local = 2 steps of the softmax-weighted blend of A_alpha, A-hat and I.
* G-hat may stay disconnected: the sampler draws spanning *forests* (one root per component) and
  the aggregator works on forests.
* Early stopping = keeping the parameters of the best validation accuracy (ties: lower validation
  loss); `test_accuracy` is the test accuracy of those parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from scipy.stats import rankdata

from core import graph as graph_lib
from core.data import graphs
from core.nn import gnn
from methods.base import (
  Method,
  Phase,
  Report,
  require,
  require_choice,
  require_positive_int,
  with_changes,
)

KINDS = ("mlp", "gcn", "gat", "fgl")
SCORES = ("estimator", "uniform", "oracle")
ANALYSES = ("", "theorem2", "scaling")
IMPLEMENTATIONS = ("", "xla", "sequential", "pallas")
# Seed-sequence word of the uniform comparison trees (training rounds use 0, 1, 2, ...).
_UNIFORM_STREAM = 2**31 - 1

# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A graph, its split, and device copies of what every forward pass needs."""

  graph: graphs.GraphData
  split: graphs.Split
  features: jax.Array
  labels: jax.Array
  masks: Mapping[str, jax.Array]  # "train" | "val" | "test" -> float [n]

  @property
  def num_nodes(self) -> int:
    return self.graph.labels.shape[0]


@functools.lru_cache(maxsize=8)
def _load(frozen_data: str) -> Dataset:
  data = ml_collections.ConfigDict(json.loads(frozen_data))
  if data.source == "csbm":
    graph = graphs.contextual_sbm(
      data.num_nodes,
      data.num_classes,
      data.feature_dim,
      data.homophily,
      data.avg_degree,
      data.feature_snr,
      seed=data.graph_seed,
      noise=data.noise,
    )
    split = None
  else:
    graph, split = graphs.load_planetoid(data.name, data.data_dir)
  if split is None or data.split == "few_label":
    split = graphs.few_label_split(
      graph.labels, data.labels_per_class, data.val_fraction, data.split_seed
    )
  n = graph.labels.shape[0]
  masks = {}
  for name in ("train", "val", "test"):
    mask = np.zeros(n, np.float32)
    mask[getattr(split, name)] = 1.0
    masks[name] = jnp.asarray(mask)
  return Dataset(graph, split, jnp.asarray(graph.features), jnp.asarray(graph.labels), masks)


def load_dataset(config: ml_collections.ConfigDict) -> Dataset:
  return _load(config.data.to_json(sort_keys=True))


# ---------------------------------------------------------------------------------------------------
# Models: one interface for the baselines, the NAAM, the estimator and the student
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
  """A flax module and how to call it on the full graph: `fixed` holds the run's edge arrays (and
  for FGL the attention), `batch` the trees (FGL) or None."""

  kind: str  # "mlp" | "gcn" | "gat" | "estimator" | "fgl"
  module: nn.Module
  features: jax.Array

  def arguments(self, fixed, batch) -> tuple:
    if self.kind == "mlp":
      return (self.features,)
    if self.kind == "fgl":
      edges = (fixed["senders"], fixed["receivers"], fixed["attention"])
      return (self.features, *edges, batch)
    return (self.features, fixed["senders"], fixed["receivers"])

  def init(self, rng, fixed, batch):
    return self.module.init(rng, *self.arguments(fixed, batch), deterministic=True)

  def logits(self, params, fixed, batch, deterministic: bool, rng=None):
    rngs = None if deterministic else {"dropout": rng}
    out = self.module.apply(
      params, *self.arguments(fixed, batch), deterministic=deterministic, rngs=rngs
    )
    return out[0] if self.kind == "estimator" else out

  def attention(self, params, fixed):
    """The estimator's per-edge attention (deterministic)."""
    return self.module.apply(params, *self.arguments(fixed, None), deterministic=True)[1]


def baseline_module(config, kind: str, num_classes: int, num_layers: int | None = None):
  model = config.model
  layers = num_layers or model.num_layers
  if kind == "mlp":
    return gnn.MLP(model.hidden, num_classes, layers, model.dropout)
  if kind == "gcn":
    return gnn.GCN(model.hidden, num_classes, layers, model.dropout)
  return gnn.GAT(model.hidden, num_classes, layers, model.heads, model.dropout)


def student_module(config, num_classes: int) -> gnn.FGLStudent:
  fgl = config.fgl
  return gnn.FGLStudent(
    hidden=config.model.hidden,
    num_classes=num_classes,
    local_steps=fgl.local_steps,
    beta_init=tuple(fgl.beta_init),
    fusion_init=fgl.fusion_init,
    eigenvalue_init=fgl.eigenvalue_init,
    w_a=fgl.w_a,
    dropout=config.model.dropout,
    use_global=fgl.use_global,
    implementation=fgl.implementation or None,
  )


# ---------------------------------------------------------------------------------------------------
# One training phase: full-batch Adam, best-validation model selection
# ---------------------------------------------------------------------------------------------------


def optimizer(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
  """Adam with L2 weight decay added to the gradient (as in the GCN/GAT papers)."""
  return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))


def masked_cross_entropy(logits, targets, mask):
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(losses * mask) / jnp.maximum(mask.sum(), 1.0)


def split_scores(logits, data: Dataset) -> dict[str, jax.Array]:
  """Accuracy on train/val/test against the true labels, and the validation loss."""
  correct = (jnp.argmax(logits, -1) == data.labels).astype(jnp.float32)
  scores = {
    f"{name}_accuracy": jnp.sum(correct * mask) / jnp.maximum(mask.sum(), 1.0)
    for name, mask in data.masks.items()
  }
  scores["val_loss"] = masked_cross_entropy(logits, data.labels, data.masks["val"])
  return scores


def init_state(model: Model, tx, fixed_fn, example_batch, rng, inputs):
  fixed = fixed_fn(inputs)
  params = model.init(rng, fixed, example_batch)
  best = {
    "params": params,
    "train_accuracy": jnp.zeros(()),
    "val_accuracy": -jnp.ones(()),
    "test_accuracy": jnp.zeros(()),
    "val_loss": jnp.full((), jnp.inf, jnp.float32),
    "step": jnp.zeros((), jnp.int32),
  }
  return {
    "params": params,
    "opt_state": tx.init(params),
    "fixed": fixed,
    "best": best,
    "step": jnp.zeros((), jnp.int32),
  }


def train_step(model: Model, tx, data: Dataset, eval_every: int, state, batch, rng):
  """One Adam step on the masked cross-entropy; every `eval_every` steps a deterministic pass that
  keeps the parameters of the best validation accuracy (early stopping as model selection)."""
  fixed = state["fixed"]

  def loss_fn(params):
    logits = model.logits(params, fixed, batch, False, rng)
    return masked_cross_entropy(logits, fixed["targets"], fixed["target_mask"])

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  step = state["step"] + 1
  best = jax.lax.cond(
    step % eval_every == 0,
    lambda: _select(model, data, params, fixed, batch, step, state["best"]),
    lambda: state["best"],
  )
  state = {"params": params, "opt_state": opt_state, "fixed": fixed, "best": best, "step": step}
  accuracies = {f"best_{k}": v for k, v in best.items() if k.endswith("accuracy")}
  return state, {"loss": loss, **accuracies}  # best val loss is inf until the first evaluation


def _select(model: Model, data: Dataset, params, fixed, batch, step, best):
  scores = split_scores(model.logits(params, fixed, batch, True), data)
  improved = (scores["val_accuracy"] > best["val_accuracy"]) | (
    (scores["val_accuracy"] == best["val_accuracy"]) & (scores["val_loss"] < best["val_loss"])
  )
  candidate = {"params": params, **scores, "step": step}
  return jax.tree.map(lambda new, old: jnp.where(improved, new, old), candidate, best)


def best_results(state, prefix: str = "") -> dict[str, float]:
  best = state["best"]
  names = ("train_accuracy", "val_accuracy", "test_accuracy", "val_loss", "step")
  out = {f"{prefix}{name}": float(best[name]) for name in names}
  out[f"{prefix}best_step"] = out.pop(f"{prefix}step")
  return out


def classifier_phase(
  name: str,
  model: Model,
  data: Dataset,
  num_steps: int,
  tx: optax.GradientTransformation,
  fixed_fn: Callable,
  *,
  eval_every: int = 1,
  example_batch=None,
  source_fn: Callable | None = None,
  evaluate: Callable | None = None,
  outputs: Callable | None = None,
) -> Phase:
  return Phase(
    name=name,
    num_steps=num_steps,
    init=functools.partial(init_state, model, tx, fixed_fn, example_batch),
    step=functools.partial(train_step, model, tx, data, eval_every),
    data=source_fn,
    evaluate=evaluate,
    outputs=outputs,
  )


def _edges(senders, receivers, targets, target_mask) -> dict[str, jax.Array]:
  return {
    "senders": jnp.asarray(senders, jnp.int32),
    "receivers": jnp.asarray(receivers, jnp.int32),
    "targets": jnp.asarray(targets, jnp.int32),
    "target_mask": jnp.asarray(target_mask, jnp.float32),
  }


# ---------------------------------------------------------------------------------------------------
# Pipeline stage 1: the non-attention auxiliary model, pseudo-labels, augmentation (Sec. 2.1)
# ---------------------------------------------------------------------------------------------------


def naam_kind(config, data: Dataset) -> str:
  """`fgl.naam`, or for "auto" GCN if the labeled-edge homophily estimate exceeds 0.5 (Sec. 4.2)."""
  if config.fgl.naam != "auto":
    return config.fgl.naam
  return "gcn" if labeled_homophily(data) > 0.5 else "mlp"


def labeled_homophily(data: Dataset) -> float:
  labeled = np.zeros(data.num_nodes, bool)
  labeled[np.concatenate([data.split.train, data.split.val])] = True
  g = data.graph
  return graph_lib.labeled_edge_homophily(g.senders, g.receivers, g.labels, labeled)


def naam_phase(config, data: Dataset) -> Phase:
  kind = naam_kind(config, data)
  model = Model(kind, baseline_module(config, kind, data.graph.num_classes, 2), data.features)
  g = data.graph
  fixed = lambda inputs: _edges(g.senders, g.receivers, g.labels, data.masks["train"])

  def evaluate(state, rng, inputs):
    del rng, inputs
    results = best_results(state, "naam_")
    results.update(naam_is_gcn=float(kind == "gcn"), labeled_homophily=labeled_homophily(data))
    return results

  return classifier_phase(
    "naam",
    model,
    data,
    config.fgl.naam_steps,
    optimizer(config.optim.learning_rate, config.optim.weight_decay),
    fixed,
    eval_every=config.eval_every,
    evaluate=evaluate,
    outputs=lambda state, inputs: naam_outputs(config, data, model, state),
  )


def naam_outputs(config, data: Dataset, model: Model, state) -> dict[str, np.ndarray]:
  """Pseudo-labels (true labels on training nodes) and G-hat; uniform/oracle attention on G-hat."""
  logits = jax.jit(lambda p, f: model.logits(p, f, None, True))(
    state["best"]["params"], state["fixed"]
  )
  probabilities = np.asarray(jax.nn.softmax(logits))
  pseudo = probabilities.argmax(1).astype(np.int32)
  pseudo[data.split.train] = data.graph.labels[data.split.train]
  g = data.graph
  if config.fgl.knn > 0:
    senders, receivers = graph_lib.augment_with_knn(
      g.senders, g.receivers, probabilities, config.fgl.knn
    )
  else:
    senders, receivers = g.senders, g.receivers
  out = {"pseudo_labels": pseudo, "senders": senders, "receivers": receivers}
  if config.fgl.scores != "estimator":
    scores = given_scores(config, data, senders, receivers)
    out["attention"] = graph_lib.attention_from_scores(scores, receivers, data.num_nodes).astype(
      np.float32
    )
  return out


def given_scores(config, data: Dataset, senders, receivers) -> np.ndarray:
  """Edge scores of the uniform (s = 1) and oracle (s = p/q on same-label edges, else 1) arms."""
  if config.fgl.scores == "uniform":
    return np.ones(len(senders))
  return graph_lib.oracle_scores(senders, receivers, data.graph.labels, config.fgl.oracle_ratio)


# ---------------------------------------------------------------------------------------------------
# Pipeline stage 2: the attention-based homophily estimator (Sec. 2.2)
# ---------------------------------------------------------------------------------------------------


def estimator_phase(config, data: Dataset) -> Phase:
  module = gnn.AttentionEstimator(
    config.fgl.estimator_hidden, data.graph.num_classes, config.model.dropout
  )
  model = Model("estimator", module, data.features)

  def fixed(inputs):
    naam = inputs["naam"]
    return _edges(
      naam["senders"], naam["receivers"], naam["pseudo_labels"], jnp.ones(data.num_nodes)
    )

  def evaluate(state, rng, inputs):
    del rng
    results = best_results(state, "estimator_")
    naam = inputs["naam"]
    attention = np.asarray(jax.jit(model.attention)(state["best"]["params"], state["fixed"]))
    reverse = graph_lib.reverse_edges(naam["senders"], naam["receivers"], data.num_nodes)
    scores = graph_lib.edge_scores(attention, reverse)
    same = data.graph.labels[naam["senders"]] == data.graph.labels[naam["receivers"]]
    results["estimator_score_auc"] = _auc(scores[same], scores[~same])
    return results

  def outputs(state, inputs):
    del inputs
    attention = jax.jit(model.attention)(state["best"]["params"], state["fixed"])
    return {"attention": np.asarray(attention, np.float32)}

  return classifier_phase(
    "estimator",
    model,
    data,
    config.fgl.estimator_steps,
    optimizer(config.optim.learning_rate, config.optim.weight_decay),
    fixed,
    eval_every=config.eval_every,
    evaluate=evaluate,
    outputs=outputs,
  )


def _auc(positive: np.ndarray, negative: np.ndarray) -> float:
  """P(score of a same-label edge > score of a cross-label edge), ties counting half (Mann-Whitney)."""
  if positive.size == 0 or negative.size == 0:
    return float("nan")
  ranks = rankdata(np.concatenate([positive, negative]))
  pairs_won = ranks[: positive.size].sum() - positive.size * (positive.size + 1) / 2
  return float(pairs_won / (positive.size * negative.size))


# ---------------------------------------------------------------------------------------------------
# Pipeline stage 3: trees as data, the student (Sec. 2.3-2.5)
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Forest:
  """G-hat with its scores: what the Wilson sampler and the tree weights are built from."""

  senders: np.ndarray
  receivers: np.ndarray
  reverse: np.ndarray
  scores: np.ndarray  # symmetric, sampling law P(T) ~ prod s(e)
  weights: np.ndarray  # directed propagation weight of every edge, in [0, 1]


def forest_inputs(config, data: Dataset, inputs) -> Forest:
  naam = inputs["naam"]
  senders, receivers = np.asarray(naam["senders"]), np.asarray(naam["receivers"])
  reverse = graph_lib.reverse_edges(senders, receivers, data.num_nodes)
  if config.fgl.scores == "estimator":
    attention = np.asarray(inputs["estimator"]["attention"], np.float64)
    scores = graph_lib.edge_scores(attention, reverse) ** config.fgl.score_power
  else:
    attention = np.asarray(naam["attention"], np.float64)
    scores = given_scores(config, data, senders, receivers)
  weights = graph_lib.propagation_weights(attention, receivers, data.num_nodes)
  return Forest(senders, receivers, reverse, np.maximum(scores, 1e-30), weights)


class TreeSource:
  """N_T spanning forests per round, a new round every `resample_every` steps (Sec. 2.3).

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
    self.sampler = graph_lib.WilsonSampler(
      forest.senders, forest.receivers, forest.scores, num_nodes
    )
    self.global_batch_size = num_trees
    self._round, self._trees = -1, None
    self.seconds_per_tree: list[float] = []

  def trees(self, round_index: int) -> dict[str, np.ndarray]:
    if round_index != self._round:
      parents, ups, downs = [], [], []
      for k in range(self.num_trees):
        start = time.perf_counter()
        parent = self.sampler.sample(np.random.default_rng([self.seed, round_index, k]))[0]
        parent = graph_lib.recenter(parent)
        self.seconds_per_tree.append(time.perf_counter() - start)
        forest = self.forest
        up, down = graph_lib.tree_edge_weights(
          parent, forest.senders, forest.receivers, forest.weights
        )
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


def student_phase(config, data: Dataset) -> Phase:
  model = Model("fgl", student_module(config, data.graph.num_classes), data.features)
  sources: dict[str, TreeSource] = {}

  def source(inputs) -> TreeSource:
    if "source" not in sources:
      forest = forest_inputs(config, data, inputs)
      sources["source"] = TreeSource(
        forest, data.num_nodes, config.fgl.num_trees, config.fgl.resample_every, config.seed
      )
    return sources["source"]

  def fixed(inputs):
    naam = inputs["naam"]
    attention = inputs["estimator" if config.fgl.scores == "estimator" else "naam"]["attention"]
    edges = _edges(naam["senders"], naam["receivers"], data.graph.labels, data.masks["train"])
    return {**edges, "attention": jnp.asarray(attention, jnp.float32)}

  example = {
    "parent": -jnp.ones((1, data.num_nodes), jnp.int32),
    "weight_up": jnp.zeros((1, data.num_nodes)),
    "weight_down": jnp.zeros((1, data.num_nodes)),
  }

  def evaluate(state, rng, inputs):
    del rng
    results = best_results(state)
    results.update(forest_statistics(config, data, inputs, source(inputs)))
    return results

  return classifier_phase(
    "student",
    model,
    data,
    config.steps,
    optimizer(config.fgl.learning_rate, config.optim.weight_decay),
    fixed,
    eval_every=config.eval_every,
    example_batch=example,
    source_fn=source,
    evaluate=evaluate,
  )


def forest_statistics(config, data: Dataset, inputs, source: TreeSource) -> dict[str, float]:
  """Homophily of G, G-hat, the sampled trees and uniform trees of G-hat; NHCC; depth; sampler time."""
  labels, n = data.graph.labels, data.num_nodes
  forest = source.forest
  trees = source.trees(0)["parent"]
  uniform = graph_lib.WilsonSampler(
    forest.senders, forest.receivers, np.ones(len(forest.senders)), n
  )
  uniform_trees = [
    uniform.sample(np.random.default_rng([config.seed, _UNIFORM_STREAM, k]))[0]
    for k in range(len(trees))
  ]
  nhcc = graph_lib.homophilous_components(forest.senders, forest.receivers, labels, n)
  return {
    "tree_homophily": float(np.mean([graph_lib.tree_edge_homophily(p, labels) for p in trees])),
    "uniform_tree_homophily": float(
      np.mean([graph_lib.tree_edge_homophily(p, labels) for p in uniform_trees])
    ),
    "graph_homophily": graph_lib.edge_homophily(data.graph.senders, data.graph.receivers, labels),
    "augmented_homophily": graph_lib.edge_homophily(forest.senders, forest.receivers, labels),
    "augmented_edges": float(len(forest.senders) // 2),
    "augmented_nhcc": float(nhcc),
    "theorem2_bound": graph_lib.theorem2_bound(nhcc, n),
    "tree_depth": float(np.mean([graph_lib.tree_levels(p).depth.max() for p in trees])),
    "wilson_ms_per_tree": 1e3 * float(np.mean(source.seconds_per_tree)),
  }


# ---------------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------------


def baseline_phase(config, data: Dataset) -> Phase:
  kind = config.model.kind
  model = Model(kind, baseline_module(config, kind, data.graph.num_classes), data.features)
  g = data.graph
  augmented = config.model.graph == "augmented"

  def fixed(inputs):
    edges = inputs["naam"] if augmented else {"senders": g.senders, "receivers": g.receivers}
    return _edges(edges["senders"], edges["receivers"], g.labels, data.masks["train"])

  def evaluate(state, rng, inputs):
    del rng
    results = best_results(state)
    results["graph_homophily"] = graph_lib.edge_homophily(g.senders, g.receivers, g.labels)
    if augmented:
      results["augmented_homophily"] = graph_lib.edge_homophily(
        inputs["naam"]["senders"], inputs["naam"]["receivers"], g.labels
      )
    return results

  return classifier_phase(
    "train",
    model,
    data,
    config.steps,
    optimizer(config.optim.learning_rate, config.optim.weight_decay),
    fixed,
    eval_every=config.eval_every,
    evaluate=evaluate,
  )


# ---------------------------------------------------------------------------------------------------
# Analyses: Theorem 2 and aggregator scaling (evaluate-only phases)
# ---------------------------------------------------------------------------------------------------


def theorem2_check(config, data: Dataset) -> dict[str, float]:
  """Tree edge-homophily of Wilson trees of G with binary scores p/q = Delta (spec Sec. 4.3.1)."""
  g, n = data.graph, data.num_nodes
  nhcc = graph_lib.homophilous_components(g.senders, g.receivers, g.labels, n)
  results = {
    "graph_homophily": graph_lib.edge_homophily(g.senders, g.receivers, g.labels),
    "nhcc": float(nhcc),
    "theorem2_bound": graph_lib.theorem2_bound(nhcc, n),
  }
  for ratio in config.theorem2.ratios:
    scores = graph_lib.oracle_scores(g.senders, g.receivers, g.labels, ratio)
    sampler = graph_lib.WilsonSampler(g.senders, g.receivers, scores, n)
    values = [
      graph_lib.tree_edge_homophily(
        sampler.sample(np.random.default_rng([config.seed, k]))[0], g.labels
      )
      for k in range(config.theorem2.num_trees)
    ]
    results[f"tree_homophily_delta{ratio:g}"] = float(np.mean(values))
  return results


def scaling_check(config) -> dict[str, float]:
  """Forward time of the tree aggregator and of dense all-pairs attention against n (Sec. 4.3.4)."""
  from kernels.tree_aggregate import bench

  s = config.scaling
  rows = bench.run(list(s.sizes), s.features, s.repeats, dense_max_n=max(s.sizes), pallas_max_n=0)
  results = {}
  for row in rows:
    results[f"tree_ms_n{row['n']}"] = min(row["sequential_ms"], row["xla_ms"])
    results[f"dense_ms_n{row['n']}"] = row["dense_ms"]
  for name in ("tree", "dense"):
    times = [results[f"{name}_ms_n{n}"] for n in s.sizes]
    results[f"{name}_loglog_slope"] = float(np.polyfit(np.log(s.sizes), np.log(times), 1)[0])
  return results


def analysis_phase(config) -> Phase:
  def evaluate(state, rng, inputs):
    del state, rng, inputs
    if config.analysis == "theorem2":
      return theorem2_check(config, load_dataset(config))
    return scaling_check(config)

  return Phase(
    name=config.analysis,
    num_steps=0,
    init=lambda rng, inputs: {"unused": jnp.zeros(())},
    evaluate=evaluate,
  )


# ---------------------------------------------------------------------------------------------------
# The method
# ---------------------------------------------------------------------------------------------------


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  if config.analysis:
    return [analysis_phase(config)]
  data = load_dataset(config)
  if config.model.kind != "fgl":
    first = [naam_phase(config, data)] if config.model.graph == "augmented" else []
    return first + [baseline_phase(config, data)]
  middle = [estimator_phase(config, data)] if config.fgl.scores == "estimator" else []
  return [naam_phase(config, data), *middle, student_phase(config, data)]


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "analysis", ANALYSES)
  require_choice(config, "data.source", ("csbm", "planetoid"))
  require_choice(config, "data.split", ("few_label", "public"))
  require_choice(config, "model.kind", KINDS)
  require_choice(config, "model.graph", ("base", "augmented"))
  require_choice(config, "fgl.scores", SCORES)
  require_choice(config, "fgl.naam", ("auto", "gcn", "mlp"))
  require_choice(config, "fgl.implementation", IMPLEMENTATIONS)
  require_choice(config, "fgl.w_a", ("diagonal", "symmetric"))
  for field in (
    "model.hidden",
    "model.num_layers",
    "model.heads",
    "fgl.num_trees",
    "fgl.resample_every",
    "fgl.naam_steps",
    "fgl.estimator_steps",
    "fgl.estimator_hidden",
    "data.labels_per_class",
    "theorem2.num_trees",
    "eval_every",
  ):
    require_positive_int(config, field)
  require(
    0.0 <= config.data.homophily <= 1.0,
    "data.homophily",
    f"must be in [0, 1], got {config.data.homophily}",
  )
  require(
    0.0 <= config.model.dropout < 1.0,
    "model.dropout",
    f"must be in [0, 1), got {config.model.dropout}",
  )
  require(
    config.model.kind != "gat" or config.model.hidden % config.model.heads == 0,
    "model.heads",
    f"must divide model.hidden={config.model.hidden}, got {config.model.heads}",
  )
  require(
    isinstance(config.fgl.knn, int) and config.fgl.knn >= 0,
    "fgl.knn",
    f"must be an int >= 0, got {config.fgl.knn}",
  )
  require(
    isinstance(config.fgl.local_steps, int) and config.fgl.local_steps >= 0,
    "fgl.local_steps",
    "must be an int >= 0",
  )
  require(
    config.fgl.oracle_ratio > 0,
    "fgl.oracle_ratio",
    f"must be positive, got {config.fgl.oracle_ratio}",
  )
  require(0.0 < config.fgl.eigenvalue_init < 1.0, "fgl.eigenvalue_init", "must be in (0, 1)")
  require(
    len(config.fgl.beta_init) == 3 and min(config.fgl.beta_init) > 0,
    "fgl.beta_init",
    f"needs three positive weights (attention, A-hat, identity), got {config.fgl.beta_init}",
  )
  for field in ("optim.learning_rate", "fgl.learning_rate"):
    value = config
    for part in field.split("."):
      value = value[part]
    require(value > 0, field, f"must be positive, got {value}")
  require(
    config.data.source != "planetoid" or bool(config.data.data_dir),
    "data.data_dir",
    "the planetoid source needs a prepared directory of raw ind.<name>.* files",
  )


# ---------------------------------------------------------------------------------------------------
# Study (spec Sec. 4): accuracy over h, tree homophily, Theorem 2, N_T ablation, scaling
# ---------------------------------------------------------------------------------------------------

ARMS = {  # study method name -> (model.kind, model.num_layers, model.graph, fgl.scores)
  "mlp": ("mlp", 2, "base", "estimator"),
  "gcn": ("gcn", 2, "base", "estimator"),
  "gat": ("gat", 2, "base", "estimator"),
  "gcn_deep": ("gcn", 8, "base", "estimator"),
  "gcn_aug": ("gcn", 2, "augmented", "estimator"),
  "fgl_uniform": ("fgl", 2, "base", "uniform"),
  "fgl": ("fgl", 2, "base", "estimator"),
  "fgl_oracle": ("fgl", 2, "base", "oracle"),
}


def _arm(config, seed: int, homophily: float, **fields) -> ml_collections.ConfigDict:
  return with_changes(
    config, seed=seed, data__graph_seed=seed, data__split_seed=seed, data__homophily=homophily,
    **fields,
  )  # fmt: skip


def _arm_name(homophily: float, seed: int, method: str) -> str:
  return f"h{homophily:g}_s{seed}_{method}"


def study_arms(config: ml_collections.ConfigDict):
  study, arms = config.study, []
  for homophily in study.homophilies:
    theorem2 = _arm(config, 0, homophily)
    theorem2.analysis = "theorem2"
    arms.append((f"h{homophily:g}_theorem2", theorem2))
    for seed in study.seeds:
      for method in study.methods:
        kind, layers, graph, scores = ARMS[method]
        fields = dict(
          model__kind=kind, model__num_layers=layers, model__graph=graph, fgl__scores=scores
        )
        arms.append((_arm_name(homophily, seed, method), _arm(config, seed, homophily, **fields)))
  for num_trees in study.ablation_num_trees:
    if num_trees == config.fgl.num_trees and "fgl" in study.methods:
      continue  # the main FGL arms already ran with this N_T
    for seed in study.seeds:
      arm = _arm(config, seed, study.ablation_homophily, fgl__num_trees=num_trees)
      arms.append((_arm_name(study.ablation_homophily, seed, f"fgl_nt{num_trees}"), arm))
  scaling = ml_collections.ConfigDict(config.to_dict())
  scaling.analysis = "scaling"
  arms.append(("scaling", scaling))
  return arms


def _mean_std(values) -> str:
  values = [100 * v for v in values if v is not None]
  if not values:
    return "-"
  return f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def _collect(results, homophily, seeds, method, key):
  return [results.get(_arm_name(homophily, s, method), {}).get(key) for s in seeds]


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  study = config.study
  mean = lambda h, m, key="test_accuracy": _nanmean(_collect(results, h, study.seeds, m, key))
  rows = [
    {
      "h": h,
      **{
        m: _mean_std(_collect(results, h, study.seeds, m, "test_accuracy")) for m in study.methods
      },
    }
    for h in study.homophilies
  ]
  notes = "\n\n".join(
    [
      "Test accuracy (%) above: mean ± std over seeds " + str(list(study.seeds)) + ".",
      _tree_table(results, study, mean),
      _theorem2_table(config, results),
      _ablation_table(config, results),
      _scaling_table(config, results),
    ]
  )
  summary = _summary(config, results, mean)
  return Report(
    rows=rows, summary=summary, figures={"fgl_study": _figure(config, results, mean)}, notes=notes
  )


def _nanmean(values) -> float:
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else float("nan")


def _tree_table(results, study, mean) -> str:
  lines = [
    "Edge homophily of G, G-hat and trees (uniform = Wilson with s = 1 on G-hat):",
    "| h | G | G-hat | uniform trees | FGL trees | oracle trees | NHCC bound (G-hat) |",
    "|---|---|---|---|---|---|---|",
  ]
  for h in study.homophilies:
    cells = [
      mean(h, "fgl", "graph_homophily"),
      mean(h, "fgl", "augmented_homophily"),
      mean(h, "fgl", "uniform_tree_homophily"),
      mean(h, "fgl", "tree_homophily"),
      mean(h, "fgl_oracle", "tree_homophily"),
      mean(h, "fgl", "theorem2_bound"),
    ]
    lines.append(f"| {h:g} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
  return "\n".join(lines)


def _theorem2_table(config, results) -> str:
  ratios = list(config.theorem2.ratios)
  lines = [
    "Theorem 2: tree edge-homophily of Wilson trees of G with scores p/q = Delta "
    f"({config.theorem2.num_trees} trees each):",
    "| h | " + " | ".join(f"Delta={r:g}" for r in ratios) + " | bound 1-(NHCC-1)/(n-1) | NHCC |",
    "|---|" + "---|" * (len(ratios) + 2),
  ]
  for h in config.study.homophilies:
    r = results.get(f"h{h:g}_theorem2")
    if r:
      cells = [f"{r[f'tree_homophily_delta{x:g}']:.3f}" for x in ratios]
      lines.append(
        f"| {h:g} | " + " | ".join(cells) + f" | {r['theorem2_bound']:.3f} | {r['nhcc']:.0f} |"
      )
  return "\n".join(lines)


def _ablation_table(config, results) -> str:
  study = config.study
  h = study.ablation_homophily
  lines = [f"N_T ablation at h = {h:g} (test accuracy %):", "| N_T | accuracy |", "|---|---|"]
  for num_trees in study.ablation_num_trees:
    method = "fgl" if num_trees == config.fgl.num_trees else f"fgl_nt{num_trees}"
    lines.append(
      f"| {num_trees} | {_mean_std(_collect(results, h, study.seeds, method, 'test_accuracy'))} |"
    )
  return "\n".join(lines)


def _scaling_table(config, results) -> str:
  r = results.get("scaling")
  if not r:
    return ""
  lines = [
    "Aggregator scaling (forward, ms; CPU):",
    "| n | tree | dense attention | dense / tree |",
    "|---|---|---|---|",
  ]
  for n in config.scaling.sizes:
    tree, dense = r[f"tree_ms_n{n}"], r[f"dense_ms_n{n}"]
    lines.append(f"| {n} | {tree:.3g} | {dense:.3g} | {dense / tree:.3g} |")
  lines.append(
    f"log-log slopes: tree {r['tree_loglog_slope']:.2f}, dense {r['dense_loglog_slope']:.2f}"
  )
  return "\n".join(lines)


def _summary(config, results, mean) -> dict:
  hs = list(config.study.homophilies)
  low = [h for h in hs if h <= 0.3]
  high = [h for h in hs if h >= 0.7]
  acc = lambda h, m: mean(h, m)
  summary = {
    "fgl_minus_best_of_gcn_gat_low_h": _nanmean(
      [acc(h, "fgl") - max(acc(h, "gcn"), acc(h, "gat")) for h in low]
    ),
    "fgl_minus_mlp_low_h": _nanmean([acc(h, "fgl") - acc(h, "mlp") for h in low]),
    "fgl_minus_gcn_high_h": _nanmean([acc(h, "fgl") - acc(h, "gcn") for h in high]),
    "fgl_above_uniform_at_every_h": all(acc(h, "fgl") > acc(h, "fgl_uniform") for h in hs),
    "oracle_at_least_fgl_at_every_h": all(acc(h, "fgl_oracle") >= acc(h, "fgl") for h in hs),
    "fgl_trees_more_homophilous_than_uniform_at_every_h": all(
      mean(h, "fgl", "tree_homophily") > mean(h, "fgl", "uniform_tree_homophily") for h in hs
    ),
  }
  scaling = results.get("scaling")
  if scaling:
    summary["tree_loglog_slope"] = scaling["tree_loglog_slope"]
    summary["dense_loglog_slope"] = scaling["dense_loglog_slope"]
  return summary


def _figure(config, results, mean):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  study = config.study
  hs = list(study.homophilies)
  fig, axes = plt.subplots(1, 4, figsize=(19, 4))
  for method in study.methods:
    axes[0].plot(hs, [100 * mean(h, method) for h in hs], marker="o", label=method)
  axes[0].set(xlabel="edge homophily h", ylabel="test accuracy (%)", title="accuracy vs homophily")
  axes[0].legend(fontsize=7)
  for key, method, label in (
    ("graph_homophily", "fgl", "G"),
    ("augmented_homophily", "fgl", "G-hat"),
    ("uniform_tree_homophily", "fgl", "uniform trees"),
    ("tree_homophily", "fgl", "FGL trees"),
    ("tree_homophily", "fgl_oracle", "oracle trees"),
  ):
    axes[1].plot(hs, [mean(h, method, key) for h in hs], marker="o", label=label)
  axes[1].set(xlabel="h", ylabel="edge homophily", title="tree homophily")
  axes[1].legend(fontsize=7)
  ratios = list(config.theorem2.ratios)
  for i, h in enumerate(hs):
    r = results.get(f"h{h:g}_theorem2")
    if r:
      axes[2].semilogx(
        ratios,
        [r[f"tree_homophily_delta{x:g}"] for x in ratios],
        marker="o",
        color=f"C{i}",
        label=f"h={h:g}",
      )
      axes[2].axhline(r["theorem2_bound"], color=f"C{i}", ls="--", lw=0.8)
  axes[2].set(xlabel="p/q", ylabel="tree edge-homophily", title="Theorem 2 (dashed: NHCC bound)")
  axes[2].legend(fontsize=7)
  scaling = results.get("scaling")
  if scaling:
    sizes = list(config.scaling.sizes)
    axes[3].loglog(
      sizes, [scaling[f"tree_ms_n{n}"] for n in sizes], marker="o", label="tree aggregator"
    )
    axes[3].loglog(
      sizes, [scaling[f"dense_ms_n{n}"] for n in sizes], marker="o", label="dense attention"
    )
    axes[3].set(xlabel="n", ylabel="forward ms", title="scaling")
    axes[3].legend(fontsize=7)
  fig.tight_layout()
  return fig


METHOD = Method(name="fgl", phases=phases, validate=validate, study_arms=study_arms, report=report)
