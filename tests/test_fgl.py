"""FGL: data (CSBM homophily, splits, Planetoid files), the Wilson sampler's law, trees, the W_A^dist
aggregation, the homophily estimator, the method's validation, report and a smoke run of the loop."""

import itertools
import math
import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.sparse as sp
from scipy import stats

from configs import fgl as fgl_config
from core import graph
from core.data import graphs
from core.nn import gnn
from experiments import loop
from kernels.tree_aggregate import reference
from kernels.tree_aggregate.bench import random_tree
from methods import fgl
from methods.base import ConfigError

# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("homophily", [0.1, 0.5, 0.9])
def test_csbm_has_the_asked_homophily_and_a_clean_connected_graph(homophily):
  g = graphs.contextual_sbm(1500, 5, 32, homophily, 8.0, 2.0, seed=3)
  assert abs(graph.edge_homophily(g.senders, g.receivers, g.labels) - homophily) < 0.02
  assert np.all(g.senders != g.receivers)
  keys = set(zip(g.senders.tolist(), g.receivers.tolist(), strict=True))
  assert all((r, s) in keys for s, r in keys)
  adjacency = sp.coo_matrix((np.ones(g.senders.size), (g.senders, g.receivers)), (1500, 1500))
  assert sp.csgraph.connected_components(adjacency)[0] == 1
  np.testing.assert_array_equal(np.bincount(g.labels), [300] * 5)
  assert g.features.shape == (1500, 32) and g.features.dtype == np.float32


def test_csbm_rejects_bad_homophily():
  with pytest.raises(ValueError, match="homophily: must be in"):
    graphs.contextual_sbm(100, 2, 4, 1.5, 4.0, 1.0, seed=0)


def test_few_label_split_is_class_balanced_and_disjoint():
  labels = np.random.default_rng(0).permutation(np.arange(500) % 5)
  split = graphs.few_label_split(labels, 10, 0.1, seed=1)
  np.testing.assert_array_equal(np.bincount(labels[split.train]), [10] * 5)
  assert len(split.val) == 50 and len(split.test) == 400
  assert not set(split.train) & set(split.val) and not set(split.val) & set(split.test)


def _write_planetoid(folder, name, rng, n_train=10, n_test=8, n_other=6, skip_test=()):
  """Mock raw Planetoid files: allx/ally (train + other), tx/ty (test), a graph dict."""
  d, c = 7, 3
  n_all = n_train + n_other
  test_index = np.arange(n_all, n_all + n_test)
  kept = np.array([i for i in test_index if i not in skip_test])
  onehot = lambda k: np.eye(c)[rng.integers(0, c, k)]
  files = {
    "x": sp.csr_matrix(rng.random((n_train, d))),
    "y": onehot(n_train),
    "allx": sp.csr_matrix(rng.random((n_all, d))),
    "ally": onehot(n_all),
    "tx": sp.csr_matrix(rng.random((len(kept), d))),
    "ty": onehot(len(kept)),
    "graph": {
      i: [(i + 1) % (n_all + n_test), (i + 3) % (n_all + n_test)] for i in range(n_all + n_test)
    },
  }
  for key, value in files.items():
    with open(os.path.join(folder, f"ind.{name}.{key}"), "wb") as f:
      pickle.dump(value, f)
  with open(os.path.join(folder, f"ind.{name}.test.index"), "w") as f:
    f.write("\n".join(str(i) for i in rng.permutation(kept)))
  return files, n_all + n_test


def test_planetoid_loader_reads_mock_raw_files(tmp_path):
  rng = np.random.default_rng(0)
  files, n = _write_planetoid(str(tmp_path), "cora", rng)
  data, split = graphs.load_planetoid("cora", str(tmp_path))
  assert data.features.shape == (n, 7) and data.labels.shape == (n,)
  np.testing.assert_allclose(data.features.sum(1), 1.0, rtol=1e-5)  # row-normalised
  np.testing.assert_array_equal(data.labels[:16], files["ally"].argmax(1))
  np.testing.assert_array_equal(split.train, np.arange(10))
  assert set(split.test) == set(range(16, 24))
  assert graph.edge_homophily(data.senders, data.receivers, data.labels) >= 0
  assert np.all(data.senders != data.receivers)


def test_planetoid_citeseer_pads_missing_test_nodes(tmp_path):
  rng = np.random.default_rng(1)
  folder = tmp_path / "Citeseer" / "raw"
  folder.mkdir(parents=True)
  _, n = _write_planetoid(str(folder), "citeseer", rng, skip_test=(19,))
  data, split = graphs.load_planetoid("citeseer", str(tmp_path))
  assert data.features.shape[0] == n and 19 not in set(split.test)
  np.testing.assert_array_equal(data.features[19], 0.0)


def test_planetoid_without_files_names_the_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="data.data_dir: no ind.pubmed.graph"):
    graphs.load_planetoid("pubmed", str(tmp_path))


# ---------------------------------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------------------------------


def _check_spanning_forest(parent, senders, receivers, num_nodes):
  """parent is a forest using graph edges, one root per component, reaching every node."""
  edges = set(zip(senders.tolist(), receivers.tolist(), strict=True))
  children = np.flatnonzero(parent >= 0)
  assert all((v, parent[v]) in edges for v in children)
  adjacency = sp.coo_matrix((np.ones(senders.size), (senders, receivers)), (num_nodes,) * 2)
  components, label = sp.csgraph.connected_components(adjacency)
  assert np.sum(parent < 0) == components
  assert len(set(label[parent < 0])) == components
  assert children.size == num_nodes - components  # n - c edges and acyclic <=> spanning forest
  levels = graph.tree_levels(parent)  # raises on cycles? no: check every node has a finite depth
  assert sorted(levels.order.tolist()) == list(range(num_nodes))


def test_wilson_gives_spanning_trees_and_forests():
  rng = np.random.default_rng(0)
  g = graphs.contextual_sbm(300, 3, 4, 0.5, 6.0, 1.0, seed=0)
  scores = rng.uniform(0.1, 2.0, g.senders.size)
  scores = (scores + scores[graph.reverse_edges(g.senders, g.receivers, 300)]) / 2
  sampler = graph.WilsonSampler(g.senders, g.receivers, scores, 300)
  for _ in range(3):
    parent, parent_edge = sampler.sample(rng)
    _check_spanning_forest(parent, g.senders, g.receivers, 300)
    children = np.flatnonzero(parent >= 0)
    np.testing.assert_array_equal(g.receivers[parent_edge[children]], parent[children])
  pairs = np.array([[0, 1], [1, 2], [3, 4]])  # two components and an isolated node 5
  senders, receivers = graph.directed_edges(pairs, 6)
  parent, _ = graph.WilsonSampler(senders, receivers, np.ones(senders.size), 6).sample(rng)
  _check_spanning_forest(parent, senders, receivers, 6)


@pytest.mark.slow
def test_wilson_matches_the_weighted_spanning_tree_law():
  """4-cycle with a chord, weighted: tree frequencies over 20k draws vs prod s(e) (chi-square)."""
  pairs = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]])
  weights = {(0, 1): 1.0, (1, 2): 3.0, (2, 3): 0.5, (0, 3): 2.0, (0, 2): 1.5}
  senders, receivers = graph.directed_edges(pairs, 4)
  scores = np.array(
    [weights[(min(s, r), max(s, r))] for s, r in zip(senders, receivers, strict=True)]
  )
  trees = {}
  for subset in itertools.combinations(weights, 3):
    adjacency = sp.coo_matrix((np.ones(3), tuple(zip(*subset, strict=True))), (4, 4))
    if sp.csgraph.connected_components(adjacency, directed=False)[0] == 1:
      trees[frozenset(subset)] = math.prod(weights[e] for e in subset)
  assert len(trees) == 8
  sampler, rng = graph.WilsonSampler(senders, receivers, scores, 4), np.random.default_rng(0)
  counts = dict.fromkeys(trees, 0)
  for _ in range(20000):
    parent, _ = sampler.sample(rng)
    counts[frozenset((min(v, p), max(v, p)) for v, p in enumerate(parent) if p >= 0)] += 1
  total = sum(trees.values())
  observed = np.array([counts[t] for t in trees])
  expected = np.array([20000 * trees[t] / total for t in trees])
  assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_wilson_rejects_non_positive_scores():
  senders, receivers = graph.directed_edges(np.array([[0, 1]]), 2)
  with pytest.raises(ValueError, match="scores: must be finite and positive"):
    graph.WilsonSampler(senders, receivers, np.array([1.0, 0.0]), 2)


def test_recenter_keeps_the_edges_and_halves_the_height():
  parent = np.array([-1] + list(range(10)))  # a path rooted at one end: height 10
  centred = graph.recenter(parent)
  edges = lambda p: {frozenset((v, p[v])) for v in range(len(p)) if p[v] >= 0}
  assert edges(centred) == edges(parent)
  assert graph.tree_levels(centred).depth.max() == 5


def test_tree_levels_are_a_bfs_order():
  parent = random_tree(60, np.random.default_rng(2))
  levels = graph.tree_levels(parent)
  position = np.argsort(levels.order)
  children = np.flatnonzero(parent >= 0)
  assert np.all(position[parent[children]] < position[children])
  assert np.all(np.diff(levels.depth[levels.order]) >= 0)
  for v in range(60):
    kids = levels.children[levels.children_ptr[v] : levels.children_ptr[v + 1]]
    np.testing.assert_array_equal(np.sort(kids), np.flatnonzero(parent == v))


def test_theorem2_tree_homophily_rises_with_the_score_ratio():
  g = graphs.contextual_sbm(400, 4, 4, 0.3, 6.0, 1.0, seed=1)
  nhcc = graph.homophilous_components(g.senders, g.receivers, g.labels, 400)
  rng, means = np.random.default_rng(0), []
  for ratio in (1.0, 64.0):
    scores = graph.oracle_scores(g.senders, g.receivers, g.labels, ratio)
    sampler = graph.WilsonSampler(g.senders, g.receivers, scores, 400)
    means.append(
      np.mean([graph.tree_edge_homophily(sampler.sample(rng)[0], g.labels) for _ in range(5)])
    )
  assert means[1] > means[0] + 0.1
  assert means[1] <= graph.theorem2_bound(nhcc, 400) + 1e-9


# ---------------------------------------------------------------------------------------------------
# W_A^dist aggregation, scores, augmentation
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_matrix_forms_match_the_dense_w_a_power_reference():
  """Spectral (kernel) and recursive (Eq. 7-8) forms vs sum_u prod(alpha) W_A^dist H_u, with grads."""
  rng = np.random.default_rng(4)
  n, d = 30, 4
  parent = random_tree(n, rng)
  h = rng.normal(size=(n, d)).astype(np.float32)
  alpha_up, alpha_down = (rng.uniform(0.2, 1.0, n).astype(np.float32) for _ in range(2))
  basis = graph.orthogonal_from_skew(jnp.asarray(rng.normal(size=(d, d)), jnp.float32))
  eigenvalues = jnp.asarray(rng.uniform(-0.9, 0.9, d), jnp.float32)
  symmetric = basis @ jnp.diag(eigenvalues) @ basis.T
  general = jnp.asarray(0.4 * rng.normal(size=(d, d)), jnp.float32)
  dense = lambda h, w: reference.matrix_tree_aggregate_reference(h, parent, alpha_up, alpha_down, w)
  spectral = lambda h, w: graph.tree_aggregate_matrix(
    h, parent, alpha_up, alpha_down, eigenvalues, basis
  )
  recursive = lambda h, w: graph.tree_aggregate_matrix_recursive(h, parent, alpha_up, alpha_down, w)
  for fn, w_a in ((spectral, symmetric), (recursive, symmetric), (recursive, general)):
    value_and_vjp = jax.jit(lambda h, w, f: jax.vjp(f, h, w), static_argnums=2)
    got, got_vjp = value_and_vjp(h, w_a, fn)
    expected, expected_vjp = value_and_vjp(h, w_a, dense)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    cotangent = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    grads = got_vjp(cotangent), expected_vjp(cotangent)
    np.testing.assert_allclose(grads[0][0], grads[1][0], atol=1e-4)  # d/dH
    if fn is recursive:
      np.testing.assert_allclose(grads[0][1], grads[1][1], rtol=1e-3, atol=1e-3)  # d/dW_A
  np.testing.assert_allclose(basis.T @ basis, np.eye(d), atol=1e-5)


def test_scores_weights_and_knn_augmentation():
  senders, receivers = graph.directed_edges(np.array([[0, 1], [1, 2], [2, 0], [2, 3]]), 4)
  reverse = graph.reverse_edges(senders, receivers, 4)
  np.testing.assert_array_equal(senders[reverse], receivers)
  attention = graph.attention_from_scores(np.arange(1.0, 9.0), receivers, 4)
  np.testing.assert_allclose(np.bincount(receivers, weights=attention), 1.0)
  scores = graph.edge_scores(attention, reverse)
  np.testing.assert_allclose(scores, scores[reverse])
  weights = graph.propagation_weights(attention, receivers, 4)
  assert weights.max() == 1.0 and weights.min() > 0
  np.testing.assert_allclose([weights[receivers == r].max() for r in range(4)], 1.0)
  embeddings = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.5, 0.5]])
  pairs = graph.knn_edges(embeddings, 1)
  np.testing.assert_array_equal(pairs[:4, 1], [1, 0, 3, 2])
  aug_senders, aug_receivers = graph.augment_with_knn(senders, receivers, embeddings, 2)
  assert set(zip(senders.tolist(), receivers.tolist(), strict=True)) <= set(
    zip(aug_senders.tolist(), aug_receivers.tolist(), strict=True)
  )
  assert np.all(aug_senders != aug_receivers)


def test_agreement_scores_are_symmetric_and_in_unit_interval():
  rng = np.random.default_rng(5)
  g = graphs.contextual_sbm(200, 4, 4, 0.3, 6.0, 1.0, seed=5)
  probabilities = rng.dirichlet(np.full(4, 0.3), size=200)
  scores = graph.agreement_scores(g.senders, g.receivers, probabilities)
  np.testing.assert_allclose(scores, scores[graph.reverse_edges(g.senders, g.receivers, 200)])
  assert scores.min() > 0 and scores.max() <= 1
  onehot = np.eye(4)[g.labels]  # exact predictions: 1 on same-label edges, the floor elsewhere
  exact = graph.agreement_scores(g.senders, g.receivers, onehot)
  same = g.labels[g.senders] == g.labels[g.receivers]
  assert np.all(exact[same] == 1.0) and np.all(exact[~same] < 1e-5)
  with pytest.raises(ValueError, match="probabilities: expected"):
    graph.agreement_scores(g.senders, g.receivers, probabilities[:10])


def test_noisy_oracle_scores_trace_auc_from_one_to_one_half():
  g = graphs.contextual_sbm(600, 4, 4, 0.3, 8.0, 1.0, seed=6)
  same = g.labels[g.senders] == g.labels[g.receivers]
  reverse = graph.reverse_edges(g.senders, g.receivers, 600)
  aucs = []
  for noise in (0.0, 0.7, 1.0):
    rng = np.random.default_rng(0)
    scores = graph.noisy_oracle_scores(g.senders, g.receivers, g.labels, 10.0, noise, rng)
    np.testing.assert_allclose(scores, scores[reverse])
    assert scores.min() >= 1.0 and scores.max() <= 10.0
    aucs.append(fgl._auc(scores[same], scores[~same]))
  np.testing.assert_array_equal(
    graph.noisy_oracle_scores(g.senders, g.receivers, g.labels, 10.0, 0.0, rng),
    graph.oracle_scores(g.senders, g.receivers, g.labels, 10.0),
  )
  c = 0.3 / 0.7  # AUC = 1 - (1 - c)^2 / 2 for noise 0.7
  assert (
    aucs[0] == 1.0 and abs(aucs[1] - (1 - (1 - c) ** 2 / 2)) < 0.02 and abs(aucs[2] - 0.5) < 0.03
  )


def test_break_even_auc_and_gain_interval():
  from methods.fgl import study

  assert study.break_even_auc([1.0, 0.9, 0.7, 0.5], [10.0, 4.0, -4.0, -1.0]) == pytest.approx(0.8)
  assert math.isnan(study.break_even_auc([1.0, 0.5], [3.0, 1.0]))
  mean, half = study.gain_interval([1.0, 2.0, 3.0])
  assert mean == 2.0 and half == pytest.approx(stats.t.ppf(0.975, 2) / math.sqrt(3))


def test_attention_estimator_scores_same_class_edges_higher():
  """Trained on true labels of a CSBM graph (h = 0.5), s(e) separates same- from cross-class edges."""
  g = graphs.contextual_sbm(300, 3, 16, 0.5, 8.0, 2.0, seed=2)
  module = gnn.AttentionEstimator(32, 3, dropout=0.0)
  x, s, r, y = (jnp.asarray(a) for a in (g.features, g.senders, g.receivers, g.labels))
  params = module.init(jax.random.key(0), x, s, r)
  tx = optax.adam(1e-2)
  apply = jax.jit(module.apply)

  @jax.jit
  def step(params, opt_state):
    loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      module.apply(p, x, s, r)[0], y
    ).mean()
    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state

  def auc(params):
    attention = np.asarray(apply(params, x, s, r)[1])
    np.testing.assert_allclose(np.bincount(g.receivers, weights=attention), 1.0, rtol=1e-4)
    scores = graph.edge_scores(attention, graph.reverse_edges(g.senders, g.receivers, 300))
    same = g.labels[g.senders] == g.labels[g.receivers]
    return fgl._auc(scores[same], scores[~same])

  untrained, opt_state = auc(params), tx.init(params)
  for _ in range(80):
    params, opt_state = step(params, opt_state)
  assert auc(params) > max(untrained, 0.5) + 0.15


# ---------------------------------------------------------------------------------------------------
# The method through the loop
# ---------------------------------------------------------------------------------------------------


def tiny_config(**overrides):
  config = fgl_config.get_config()
  config.data.update(num_nodes=200, num_classes=3, feature_dim=8, labels_per_class=5)
  config.model.update(hidden=16, heads=4)
  config.fgl.update(
    naam_steps=4, estimator_steps=4, estimator_hidden=8, num_trees=4, resample_every=3
  )
  config.update(steps=6, eval_every=2)
  config.loop.update(log_every=3, checkpoint_every=6)  # saves at step 0 and at each phase's end
  for key, value in overrides.items():
    section, name = key.split("__")
    config[section][name] = value
  return config


def test_fgl_runs_all_phases_through_the_loop(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  assert summary.step_traces == {"naam": 1, "estimator": 1, "student": 1}
  for key in ("test_accuracy", "tree_homophily", "uniform_tree_homophily", "estimator_score_auc"):
    assert math.isfinite(results[key]), key
  assert 0.0 <= results["test_accuracy"] <= 1.0 and 0.0 <= results["tree_homophily"] <= 1.0
  assert results["best_step"] in (2, 4, 6)
  for name in ("results.json", "metrics.jsonl", "phases/student.json", "checkpoints/student"):
    assert os.path.exists(tmp_path / name), name


def test_oracle_trees_are_more_homophilous_than_uniform_trees(tmp_path):
  # the trees depend on the scores, not on training: one NAAM step and two student steps suffice
  config = tiny_config(fgl__scores="oracle", fgl__oracle_ratio=50.0, fgl__naam_steps=1)
  config.steps = 2
  results = loop.run(config, str(tmp_path)).results
  assert results["tree_homophily"] > results["uniform_tree_homophily"] + 0.1


def test_tree_source_is_a_pure_function_of_the_step():
  data = fgl.load_dataset(tiny_config())
  g = data.graph
  attention = graph.attention_from_scores(np.ones(g.senders.size), g.receivers, 200)
  inputs = {"naam": {"senders": g.senders, "receivers": g.receivers, "attention": attention}}
  config = tiny_config(fgl__scores="uniform")
  make = lambda: fgl.TreeSource(fgl.forest_inputs(config, data, inputs), 200, 4, 3, seed=0)
  a, b = make(), make()
  np.testing.assert_array_equal(a.batch(4)["parent"], b.batch(5)["parent"])  # same round
  assert not np.array_equal(a.batch(0)["parent"], a.batch(3)["parent"])  # next round
  half = a.batch(1, process_index=1, process_count=2)
  np.testing.assert_array_equal(half["weight_up"], b.batch(1)["weight_up"][2:])


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("model__kind", "sgc", "config.model.kind: must be one of"),
    ("fgl__scores", "learned", "config.fgl.scores: must be one of"),
    ("data__homophily", 1.2, "config.data.homophily: must be in"),
    ("fgl__num_trees", 0, "config.fgl.num_trees: must be positive"),
    ("fgl__beta_init", (1.0, 0.0, 1.0), "config.fgl.beta_init: needs three positive"),
    ("fgl__oracle_noise", 1.5, "config.fgl.oracle_noise: must be in"),
    ("data__source", "planetoid", "config.data.data_dir: the planetoid source needs"),
  ],
)
def test_bad_fields_are_named(tmp_path, field, value, message):
  with pytest.raises(ConfigError, match=message):
    loop.run(tiny_config(**{field: value}), str(tmp_path))


def test_study_arms_and_report():
  config = fgl_config.get_config("study")
  names = [name for name, _ in fgl.study_arms(config)]
  assert len(names) == len(set(names))
  assert "h0.1_s0_fgl" in names and "h0.9_theorem2" in names and "scaling" in names
  assert "h0.3_s1_fgl_nt1" in names and "h0.3_s0_fgl_nt8" not in names
  rng = np.random.default_rng(0)
  results = {}
  for name, arm in fgl.study_arms(config):
    if arm.analysis == "theorem2":
      results[name] = {
        "theorem2_bound": 0.9,
        "nhcc": 3.0,
        **{f"tree_homophily_delta{r:g}": 0.5 for r in arm.theorem2.ratios},
      }
    elif arm.analysis == "scaling":
      results[name] = {
        f"{k}_ms_n{n}": float(n) for n in arm.scaling.sizes for k in ("tree", "dense")
      }
      results[name].update(tree_loglog_slope=1.0, dense_loglog_slope=2.0)
    else:
      keys = (
        "test_accuracy",
        "tree_homophily",
        "uniform_tree_homophily",
        "graph_homophily",
        "augmented_homophily",
        "theorem2_bound",
      )
      results[name] = {k: float(rng.uniform()) for k in keys}
  report = fgl.report(config, results)
  assert [row["h"] for row in report.rows] == list(config.study.homophilies)
  assert set(report.rows[0]) == {"h", *config.study.methods}
  assert "fgl_study" in report.figures and "Theorem 2" in report.notes
  assert report.summary["tree_loglog_slope"] == 1.0


@pytest.mark.slow
def test_oracle_noise_study_arms_and_report():
  config = fgl_config.get_config("oracle_noise")
  arms = fgl.study_arms(config)
  names = [name for name, _ in arms]
  assert len(names) == len(set(names)) == 3 * (4 + len(config.study.noise_levels))
  noise = {arm.fgl.oracle_noise for name, arm in arms if "noise" in name}
  assert noise == set(config.study.noise_levels)
  rng = np.random.default_rng(0)
  results = {}
  for name, arm in arms:
    oracle = arm.fgl.scores == "oracle"
    accuracy = 0.55 + 0.3 * (1 - arm.fgl.oracle_noise) if oracle else 0.6
    results[name] = {
      "test_accuracy": accuracy + 0.01 * rng.normal(),
      "score_auc": 1 - 0.5 * arm.fgl.oracle_noise if oracle else 0.7,
      **{k: float(rng.uniform()) for k in ("score_contrast", "tree_homophily")},
    }
  report = fgl.report(config, results)
  assert len(report.rows) == 4 + len(config.study.noise_levels)
  assert "fgl_oracle_auc" in report.figures
  assert 0.5 <= report.summary["break_even_auc"] <= 1.0
