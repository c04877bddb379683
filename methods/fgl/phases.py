"""FGL's phases: the data of a run, one full-batch classifier phase shared by every model, the three
pipeline stages (NAAM, homophily estimator, student), the baselines and the evaluate-only analyses.

Equation and theorem numbers are those of "Forest-Based Graph Learning for Semi-Supervised Node
Classification" (ICLR 2026); `methods/fgl/__init__.py` describes how the phases fit together.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from scipy.stats import rankdata

from core import graph as graph_lib
from core.data import forests, graphs
from core.nn import gnn, precision
from methods.base import Phase, cached_per_config

# Seed-sequence words of the uniform comparison trees and of the oracle's noise (training rounds
# use 0, 1, 2, ...).
_UNIFORM_STREAM = 2**31 - 1
_NOISE_STREAM = 2**31 - 2

# ---------------------------------------------------------------------------------------------------
# Data and the student network
# ---------------------------------------------------------------------------------------------------


def load_dataset(config: ml_collections.ConfigDict) -> graphs.GraphDataset:
  """The run's graph and split, built once per distinct `config.data`."""
  return _dataset(config.data)


@cached_per_config(maxsize=8)
def _dataset(data: ml_collections.ConfigDict) -> graphs.GraphDataset:
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
  return graphs.graph_dataset(graph, split)


def compute_dtype(config):
  """`config.model.dtype` for every network of the pipeline (`core/nn/gnn.py` keeps the graph sums,
  softmaxes and tree aggregation in float32 whatever it is)."""
  return precision.compute_dtype(config.model.dtype)


def baseline_module(config, kind: str, num_classes: int, num_layers: int | None = None):
  model = config.model
  layers = num_layers or model.num_layers
  return gnn.baseline(
    kind,
    model.hidden,
    num_classes,
    layers,
    model.heads,
    model.dropout,
    dtype=compute_dtype(config),
  )


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
    dtype=compute_dtype(config),
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


def split_scores(logits, data: graphs.GraphDataset) -> dict[str, jax.Array]:
  """Accuracy on train/val/test against the true labels, and the validation loss."""
  correct = (jnp.argmax(logits, -1) == data.labels).astype(jnp.float32)
  scores = {
    f"{name}_accuracy": jnp.sum(correct * mask) / jnp.maximum(mask.sum(), 1.0)
    for name, mask in data.masks.items()
  }
  scores["val_loss"] = masked_cross_entropy(logits, data.labels, data.masks["val"])
  return scores


def init_state(model: gnn.NodeClassifier, tx, fixed_fn, example_batch, rng, inputs):
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


def train_step(
  model: gnn.NodeClassifier, tx, data: graphs.GraphDataset, eval_every: int, state, batch, rng
):
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


def _select(model: gnn.NodeClassifier, data: graphs.GraphDataset, params, fixed, batch, step, best):
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
  model: gnn.NodeClassifier,
  data: graphs.GraphDataset,
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
# Pipeline stage 1: the non-attention auxiliary model, pseudo-labels, augmentation (pre-processing)
# ---------------------------------------------------------------------------------------------------


def naam_kind(config, data: graphs.GraphDataset) -> str:
  """`fgl.naam`, or for "auto" GCN if the labeled-edge homophily estimate exceeds 0.5 (the paper
  takes a GCN for homophilous graphs and an MLP for heterophilous ones)."""
  if config.fgl.naam != "auto":
    return config.fgl.naam
  return "gcn" if labeled_homophily(data) > 0.5 else "mlp"


def labeled_homophily(data: graphs.GraphDataset) -> float:
  labeled = np.zeros(data.num_nodes, bool)
  labeled[np.concatenate([data.split.train, data.split.val])] = True
  g = data.graph
  return graph_lib.labeled_edge_homophily(g.senders, g.receivers, g.labels, labeled)


def naam_phase(config, data: graphs.GraphDataset) -> Phase:
  kind = naam_kind(config, data)
  module = baseline_module(config, kind, data.graph.num_classes, 2)
  model = gnn.NodeClassifier(kind, module, data.features)
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


def naam_outputs(
  config, data: graphs.GraphDataset, model: gnn.NodeClassifier, state
) -> dict[str, np.ndarray]:
  """Pseudo-labels (true labels on training nodes), the predicted class distributions and G-hat;
  for given scores (uniform, oracle, agreement) the attention on G-hat they induce."""
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
  out = {
    "pseudo_labels": pseudo,
    "probabilities": probabilities.astype(np.float32),
    "senders": senders,
    "receivers": receivers,
  }
  if config.fgl.scores != "estimator":
    scores = given_scores(config, data, senders, receivers, probabilities)
    out["attention"] = graph_lib.attention_from_scores(scores, receivers, data.num_nodes).astype(
      np.float32
    )
  return out


def given_scores(
  config, data: graphs.GraphDataset, senders, receivers, probabilities=None
) -> np.ndarray:
  """Edge scores that replace the estimator's: uniform (s = 1), agreement of the NAAM's predicted
  class distributions (`probabilities`, a baseline estimator), or oracle (p/q on same-label edges,
  else 1) blurred by `fgl.oracle_noise` (noise 0: the exact oracle)."""
  fgl = config.fgl
  if fgl.scores == "uniform":
    return np.ones(len(senders))
  if fgl.scores == "agreement":
    if probabilities is None:
      raise ValueError("fgl.scores: 'agreement' needs the NAAM's predicted class distributions")
    return graph_lib.agreement_scores(senders, receivers, probabilities)
  rng = np.random.default_rng([config.seed, _NOISE_STREAM])
  labels = data.graph.labels
  return graph_lib.noisy_oracle_scores(
    senders, receivers, labels, fgl.oracle_ratio, fgl.oracle_noise, rng
  )


# ---------------------------------------------------------------------------------------------------
# Pipeline stage 2: the attention-based homophily estimator (Eq. 3)
# ---------------------------------------------------------------------------------------------------


def estimator_phase(config, data: graphs.GraphDataset) -> Phase:
  module = gnn.AttentionEstimator(
    config.fgl.estimator_hidden,
    data.graph.num_classes,
    config.model.dropout,
    dtype=compute_dtype(config),
  )
  model = gnn.NodeClassifier("estimator", module, data.features)

  def fixed(inputs):
    naam = inputs["naam"]
    targets = (
      naam["pseudo_labels"] if config.fgl.estimator_labels == "pseudo" else data.graph.labels
    )
    return _edges(naam["senders"], naam["receivers"], targets, jnp.ones(data.num_nodes))

  def evaluate(state, rng, inputs):
    del rng
    results = best_results(state, "estimator_")
    naam = inputs["naam"]
    attention = np.asarray(jax.jit(model.attention)(state["best"]["params"], state["fixed"]))
    reverse = graph_lib.reverse_edges(naam["senders"], naam["receivers"], data.num_nodes)
    scores = graph_lib.edge_scores(attention, reverse)
    same = data.graph.labels[naam["senders"]] == data.graph.labels[naam["receivers"]]
    results["estimator_score_auc"] = auc(scores[same], scores[~same])
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


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
  """P(score of a same-label edge > score of a cross-label edge), ties counting half (Mann-Whitney)."""
  if positive.size == 0 or negative.size == 0:
    return float("nan")
  ranks = rankdata(np.concatenate([positive, negative]))
  pairs_won = ranks[: positive.size].sum() - positive.size * (positive.size + 1) / 2
  return float(pairs_won / (positive.size * negative.size))


# ---------------------------------------------------------------------------------------------------
# Pipeline stage 3: trees as data (`core.data.forests`), the student (Eq. 7-11)
# ---------------------------------------------------------------------------------------------------


def forest_inputs(config, data: graphs.GraphDataset, inputs) -> forests.Forest:
  """G-hat from the NAAM phase, with the estimator's scores (or the given ones, `given_scores`)."""
  naam = inputs["naam"]
  senders, receivers = np.asarray(naam["senders"]), np.asarray(naam["receivers"])
  if config.fgl.scores == "estimator":
    attention, scores = inputs["estimator"]["attention"], None  # s(e) from the attention
  else:
    probabilities = naam.get("probabilities")
    attention = naam["attention"]
    scores = given_scores(config, data, senders, receivers, probabilities)
  return forests.build_forest(
    senders, receivers, attention, data.num_nodes, scores, config.fgl.score_power
  )


def student_phase(config, data: graphs.GraphDataset) -> Phase:
  module = student_module(config, data.graph.num_classes)
  model = gnn.NodeClassifier("fgl", module, data.features)
  sources: dict[str, forests.TreeSource] = {}

  def source(inputs) -> forests.TreeSource:
    if "source" not in sources:
      forest = forest_inputs(config, data, inputs)
      sources["source"] = forests.TreeSource(
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


def forest_statistics(
  config, data: graphs.GraphDataset, inputs, source: forests.TreeSource
) -> dict[str, float]:
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
    **score_statistics(forest, labels, inputs["naam"].get("probabilities")),
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


def score_statistics(forest: forests.Forest, labels, probabilities=None) -> dict[str, float]:
  """How well the sampling scores of G-hat separate same-label from cross-label edges: their AUC
  and contrast (mean score of same-label over cross-label edges); the AUC of the NAAM agreement
  baseline on the same edges when its predicted distributions are given."""
  same = labels[forest.senders] == labels[forest.receivers]
  scores = forest.scores
  out = {
    "score_auc": auc(scores[same], scores[~same]),
    "score_contrast": float(scores[same].mean() / scores[~same].mean()),
  }
  if probabilities is not None:
    agreement = graph_lib.agreement_scores(forest.senders, forest.receivers, probabilities)
    out["agreement_score_auc"] = auc(agreement[same], agreement[~same])
  return out


# ---------------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------------


def baseline_phase(config, data: graphs.GraphDataset) -> Phase:
  kind = config.model.kind
  module = baseline_module(config, kind, data.graph.num_classes)
  model = gnn.NodeClassifier(kind, module, data.features)
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


def theorem2_check(config, data: graphs.GraphDataset) -> dict[str, float]:
  """Tree edge-homophily of Wilson trees of G with binary scores p/q = Delta (Theorem 2)."""
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
  """Forward time of the tree aggregator and of dense all-pairs attention against n: the linear
  time of the tree aggregator (Theorem 1) against the quadratic cost of all-pairs attention."""
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
# The phases of a run
# ---------------------------------------------------------------------------------------------------


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  """`Method.phases`: an analysis, a baseline (after the NAAM on G-hat), or the FGL pipeline."""
  if config.analysis:
    return [analysis_phase(config)]
  data = load_dataset(config)
  if config.model.kind != "fgl":
    first = [naam_phase(config, data)] if config.model.graph == "augmented" else []
    return first + [baseline_phase(config, data)]
  middle = [estimator_phase(config, data)] if config.fgl.scores == "estimator" else []
  return [naam_phase(config, data), *middle, student_phase(config, data)]
