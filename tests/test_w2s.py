"""W2S under spurious correlations: the maths of core/w2s.py, the data, and the pipeline through the loop."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import w2s as w2s_config
from core import w2s
from core.data import spurious
from experiments import loop
from methods import w2s as method
from methods.base import ConfigError
from methods.w2s import backbones, classification

# ---------------------------------------------------------------------------------------------------
# Maths
# ---------------------------------------------------------------------------------------------------


def small_design(similarity=0.0, separation=8.0, p_t=3, p_s=2, group_dim=4, d_z=6):
  return spurious.regression_design(
    jax.random.key(0), d_z, group_dim, p_t, p_s, similarity, separation
  )


@functools.partial(jax.jit, static_argnames=("n", "big_n", "seed"))
def fit_pipeline(design, eta_l, eta_u, n=300, big_n=600, seed=1):
  """Teacher on D(eta_l), student on the teacher's pseudolabels over D(eta_u)."""
  k_l, k_u = jax.random.split(jax.random.key(seed))
  lab = spurious.sample_regression(k_l, design, n, eta_l)
  teacher = w2s.ridgeless_fit(
    w2s.teacher_features(lab["z"], lab["xi"], design.teacher_map), lab["y"]
  )
  unl = spurious.sample_regression(k_u, design, big_n, eta_u)
  targets = w2s.teacher_features(unl["z"], unl["xi"], design.teacher_map) @ teacher
  student = w2s.ridgeless_fit(
    w2s.student_features(unl["z"], unl["xi"], design.student_map), targets
  )
  return teacher, student


@pytest.mark.parametrize("eta_t", [0.1, 0.5, 1.0])
def test_student_equal_to_teacher_gives_zero_gain(eta_t):
  design = small_design(similarity=2.0, p_t=3, p_s=3, group_dim=4)  # ||Xi||^2 = p_S - 1: S = T
  np.testing.assert_allclose(design.student_map, design.teacher_map, atol=1e-6)
  teacher, student = fit_pipeline(design, eta_l=0.1, eta_u=0.4)
  er_t = w2s.excess_risk(teacher, design.beta, w2s.teacher_moment(design, eta_t))
  er_s = w2s.excess_risk(student, design.beta, w2s.student_moment(design, eta_t))
  assert float(er_t) > 0
  np.testing.assert_allclose(er_s, er_t, rtol=2e-3)
  predicted = w2s.predicted_teacher_risk(design, 0.1, eta_t, 300) - w2s.predicted_student_risk(
    design, 0.1, 0.4, eta_t, 300, 600
  )
  relayed = w2s.relayed_teacher_risk(design, 0.1, eta_t, 300) - w2s.relayed_student_risk(
    design, 0.1, 0.4, eta_t, 300
  )
  assert abs(float(predicted)) < 1e-5 and abs(float(relayed)) < 1e-5


@pytest.mark.parametrize("soft", [False, True])
def test_gce_tends_to_cross_entropy_as_q_goes_to_zero(soft):
  logits = 3.0 * jax.random.normal(jax.random.key(0), (64, 5))
  labels = jax.random.randint(jax.random.key(1), (64,), 0, 5)
  targets = (
    jax.nn.softmax(jax.random.normal(jax.random.key(2), (64, 5)))
    if soft
    else jax.nn.one_hot(labels, 5)
  )
  np.testing.assert_allclose(
    w2s.generalized_cross_entropy(logits, targets, 1e-4),
    w2s.cross_entropy(logits, targets),
    rtol=1e-3,
  )
  p_y = jnp.sum(targets * jax.nn.softmax(logits), -1)
  np.testing.assert_allclose(
    w2s.generalized_cross_entropy(logits, targets, 1.0), 1.0 - p_y, atol=1e-6
  )


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 1.0])
def test_subset_holds_the_lowest_entropy_points(fraction):
  logits = 2.0 * jax.random.normal(jax.random.key(3), (101, 3))
  entropy = np.asarray(w2s.predictive_entropy(logits))
  mask = np.asarray(w2s.top_p_mask(jnp.asarray(entropy), fraction)).astype(bool)
  k = math.ceil(fraction * 101)
  assert mask.sum() == k == w2s.subset_size(101, fraction)
  if k < 101:
    assert entropy[mask].max() <= entropy[~mask].min()
  np.testing.assert_array_equal(
    np.sort(np.asarray(w2s.top_p_indices(jnp.asarray(entropy), fraction))), np.flatnonzero(mask)
  )
  assert w2s.subset_size(5000, 0.3) == 1500  # no float round-up (0.3 * 5000 = 1500.0000000000002)


@pytest.mark.slow
def test_closed_form_moments_match_monte_carlo():
  design = small_design(similarity=1.0, separation=2.0)
  num = 200_000
  data = spurious.sample_regression(jax.random.key(5), design, num, 0.3)
  w = w2s.group_features(data["xi"], design.teacher_map)
  psi = w2s.group_features(data["xi"], design.student_map)
  for left, right, closed in (
    (w, w, w2s.teacher_moment(design, 0.3)),
    (psi, psi, w2s.student_moment(design, 0.3)),
    (w, psi, w2s.cross_moment(design, 0.3)),
  ):
    products = np.asarray(left[:, :, None] * right[:, None, :])
    standard_error = products.std(0) / math.sqrt(num)
    assert np.all(np.abs(products.mean(0) - np.asarray(closed)) < 5 * standard_error + 1e-6)
  # and the exact excess risk equals a 20k-point test-set estimate
  teacher, _ = fit_pipeline(design, 0.1, 0.3, n=200, big_n=400)
  test = spurious.sample_regression(jax.random.key(6), design, 20_000, 0.3)
  errors = (
    w2s.teacher_features(test["z"], test["xi"], design.teacher_map) @ teacher
    - test["z"] @ design.beta
  ) ** 2
  exact = w2s.excess_risk(teacher, design.beta, w2s.teacher_moment(design, 0.3))
  assert abs(float(errors.mean()) - float(exact)) < 5 * float(errors.std()) / math.sqrt(20_000)
  majority, minority = w2s.group_excess_risks(teacher, design, "teacher")  # D(eta) is a mixture
  assert float(exact) == pytest.approx(0.7 * float(majority) + 0.3 * float(minority), rel=1e-5)


def test_teacher_moment_trace_matches_the_closed_form():
  """tr(M_t M_l^-1) = p_T + s (eta_t - eta_l)(1 - 2 eta_l) / (1 + eta_l (1 - eta_l) s) (our derivation)."""
  design, s, p_t, eta_l = small_design(separation=8.0), 8.0, 3, 0.1
  for eta_t in (0.0, 0.1, 0.5, 1.0):
    trace = jnp.trace(
      jnp.linalg.solve(w2s.teacher_moment(design, eta_l), w2s.teacher_moment(design, eta_t))
    )
    expected = p_t + s * (eta_t - eta_l) * (1 - 2 * eta_l) / (1 + eta_l * (1 - eta_l) * s)
    assert float(trace) == pytest.approx(expected, rel=1e-4)


def test_ridgeless_solver_returns_the_min_norm_interpolant_when_d_exceeds_n():
  x = jax.random.normal(jax.random.key(7), (20, 50))
  y = jax.random.normal(jax.random.key(8), (20,))
  b = w2s.ridgeless_fit(x, y)
  np.testing.assert_allclose(x @ b, y, atol=1e-4)
  np.testing.assert_allclose(b, jnp.linalg.pinv(x) @ y, atol=1e-4)
  null = jnp.linalg.svd(x)[2][-1]  # a direction with x @ null = 0
  assert float(jnp.linalg.norm(b)) < float(jnp.linalg.norm(b + 0.1 * null))
  tall = jax.random.normal(jax.random.key(9), (4, 60, 10))  # d < n, vmapped: least squares
  targets = jax.random.normal(jax.random.key(10), (4, 60))
  np.testing.assert_allclose(
    jax.jit(jax.vmap(w2s.ridgeless_fit))(tall, targets),
    jnp.stack([jnp.linalg.lstsq(a, t)[0] for a, t in zip(tall, targets, strict=True)]),
    atol=1e-4,
  )
  with pytest.raises(ValueError, match="targets must be"):
    w2s.ridgeless_fit(x, y[:5])


def test_group_metrics_name_the_worst_group():
  predictions = jnp.array([0, 0, 1, 1, 1, 0])
  labels = jnp.array([0, 0, 1, 1, 0, 1])
  groups = jnp.array([0, 0, 3, 3, 1, 2])
  np.testing.assert_allclose(w2s.group_accuracies(predictions, labels, groups, 4), [1, 0, 0, 1])
  assert float(w2s.worst_group_accuracy(predictions, labels, groups, 4)) == 0.0
  assert float(w2s.average_accuracy(predictions, labels, groups, 4)) == 0.5


def test_balanced_ceiling_weights_every_present_group_equally():
  label = np.array([[0, 0], [0, 1], [1, 1], [1, 0], [0, 1], [1, 0]])
  attribute = np.array([[0, 0], [0, 1], [1, 1], [0, 0], [0, 1], [1, 1]])  # each seed lacks a group
  weight = classification.ceiling_weights({"label": label, "attribute": attribute})
  groups = label * 2 + attribute
  for seed in range(2):
    present = np.unique(groups[:, seed])
    sums = [weight[groups[:, seed] == g, seed, 0].sum() for g in present]
    np.testing.assert_allclose(sums, 1.0 / len(present), rtol=1e-6)
  np.testing.assert_allclose(weight[:, :, 1].sum(0), 1.0, rtol=1e-6)


def test_group_splits_have_the_requested_minority_fraction_and_are_disjoint():
  rng = np.random.default_rng(0)
  minority = rng.random(1000) < 0.3
  splits = spurious.group_split_indices(rng, minority, {"a": (200, 0.05), "b": (300, 0.5)})
  assert minority[splits["a"]].sum() == 10 and minority[splits["b"]].sum() == 150
  assert not set(splits["a"]) & set(splits["b"])
  with pytest.raises(ValueError, match="split 'c'"):
    spurious.group_split_indices(rng, minority, {"c": (900, 0.9)})


def test_nt_xent_matches_its_closed_form_and_prefers_matching_views():
  """Two images with orthogonal projections: each view's positive has cosine 1, its two negatives
  cosine 0, so the loss is -log(e^(1/t) / (e^(1/t) + 2))."""
  z = jnp.eye(2, 4)
  t = 0.5
  expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2))
  assert float(backbones.nt_xent(z, 3.0 * z, t)) == pytest.approx(expected, rel=1e-5)
  assert float(backbones.nt_xent(z, z[::-1], t)) > expected  # views swapped between images
  assert float(backbones.pair_accuracy(z, z)) == 1.0
  with pytest.raises(ValueError, match="two \\(B, D\\) projections"):
    backbones.nt_xent(z, z[:1], t)


@pytest.mark.slow
def test_digit_augmentation_is_a_translation_when_only_shifting():
  x = jax.random.uniform(jax.random.key(0), (16, 64))
  same = backbones.augment_digits(jax.random.key(1), x, 0, 1.0, (1.0, 1.0), 0.0)
  np.testing.assert_allclose(same, x)
  moved = np.asarray(backbones.augment_digits(jax.random.key(2), x, 1, 1.0, (1.0, 1.0), 0.0))
  padded = np.pad(np.asarray(x).reshape(16, 8, 8), ((0, 0), (1, 1), (1, 1)))
  for image, out in zip(padded, moved.reshape(16, 8, 8), strict=True):
    shifts = [image[i : i + 8, j : j + 8] for i in range(3) for j in range(3)]
    assert any(np.allclose(out, s) for s in shifts)


@pytest.mark.slow
@pytest.mark.parametrize("stride", [1, 2])
def test_im2col_convolution_equals_lax_conv(stride):
  x = jax.random.normal(jax.random.key(3), (2, 8, 8, 3))
  layer = backbones.nn.Dense(5)
  params = layer.init(jax.random.key(4), jnp.zeros((1, 27)))
  ours = backbones._conv3x3(x, stride, lambda p: layer.apply(params, p))
  kernel = params["params"]["kernel"].reshape(3, 3, 3, 5)  # patch order (row, column, channel)
  reference = jax.lax.conv_general_dilated(
    x, kernel, (stride, stride), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  np.testing.assert_allclose(ours, reference + params["params"]["bias"], atol=1e-5)
  net = backbones.DigitCNN(channels=(4, 6), num_outputs=3)
  net_params = net.init(jax.random.key(5), jnp.zeros((1, 64)))
  assert net.apply(net_params, jnp.zeros((7, 64)), method="features").shape == (7, 6)
  assert net.apply(net_params, jnp.zeros((7, 64))).shape == (7, 3)


# ---------------------------------------------------------------------------------------------------
# Pipeline through the shared loop
# ---------------------------------------------------------------------------------------------------


def tiny_classification(**groups):
  config = w2s_config.get_config()
  config.num_seeds = 3
  config.groups.update(
    dict(num_labelled=40, num_unlabelled=120, num_heldout=40, num_test=40, **groups)
  )
  config.teacher.steps = config.student.steps = config.enhanced.steps = 4
  config.enhanced.p_grid, config.enhanced.q_grid = (0.5, 1.0), (0.5, 1.0)
  config.loop.update(log_every=2, checkpoint_every=4)
  return config


def tiny_regression():
  config = w2s_config.get_config("regression")
  config.num_seeds = 2
  config.regression.update(
    dict(
      d_z=4,
      group_dim=4,
      teacher_group_dim=3,
      student_group_dim=2,
      separations=(2.0, 16.0),
      similarities=(0.0, 1.0),
      eta_labelled=(0.1, 0.3),
      eta_unlabelled=(0.0, 0.1, 0.3, 0.5),
      num_labelled=80,
      num_unlabelled=120,
    )
  )
  return config


def test_classification_pipeline_runs_every_phase_and_reports_the_issue_keys(tmp_path):
  summary = loop.run(tiny_classification(), str(tmp_path))
  assert summary.step_traces == {
    "teacher": 1,
    "pseudolabels": 0,
    "student": 1,
    "enhanced": 1,
    "ceiling": 1,
  }
  results = summary.results
  recovered = (results["w2s_accuracy"] - results["teacher_accuracy"]) / results[
    "ceiling_minus_teacher"
  ]
  assert results["w2s_performance_gap_recovered"] == pytest.approx(recovered, rel=1e-4)
  for name in ("teacher", "w2s", "enhanced", "ceiling", "ceiling_erm"):
    for key in (f"{name}_accuracy", f"worst_group_{name}_accuracy"):
      assert 0.0 <= results[key] <= 1.0, key
    assert results[f"worst_group_{name}_accuracy"] <= results[f"{name}_accuracy"]
  assert results["w2s_gain"] == pytest.approx(
    results["w2s_accuracy"] - results["teacher_accuracy"], abs=1e-5
  )
  assert math.isfinite(results["worst_group_w2s_gain"])
  assert (
    0.5 <= results["enhanced_selected_p"] <= 1.0 and 0.5 <= results["enhanced_selected_q"] <= 1.0
  )
  assert results["enhanced_oracle_accuracy"] >= results["enhanced_accuracy"] - 1e-6
  assert results["unlabelled_minority_fraction"] == pytest.approx(0.05)
  assert results["subset_minority_fraction/p_1"] == pytest.approx(0.05)


def test_continued_enhanced_head_starts_from_the_student(tmp_path):
  config = tiny_classification()
  config.enhanced.init = "continued"
  config.pseudolabels = "soft"
  results = loop.run(config, str(tmp_path)).results
  assert math.isfinite(results["enhanced_accuracy"])


@pytest.mark.slow
def test_regression_grid_reports_simulation_and_both_theories(tmp_path):
  config = tiny_regression()
  results = loop.run(config, str(tmp_path)).results
  cell = method._key(s=16.0, xi2=0.0, eta_l=0.1, eta_u=0.5, eta_t="eta_l")
  for quantity in (
    "student_er",
    "student_er_pred",
    "gain",
    "gain_std",
    "gain_pred",
    "gain_relayed",
  ):
    assert math.isfinite(results[f"{cell}/{quantity}"]), quantity
  teacher = method._key(s=16.0, eta_l=0.1, eta_t="1")
  assert (
    results[f"{teacher}/teacher_er"]
    > results[method._key(s=16.0, eta_l=0.1, eta_t="0") + "/teacher_er"]
  )
  report = method.report(config, {"e1": results})
  assert {"e1_gain_vs_shift", "e1_simulated_vs_predicted", "e1_failure_region"} <= set(
    report.figures
  )
  assert 0.0 <= report.summary["e1_quadratic_r2_min_xi0"] <= 1.0
  assert report.summary["e1_num_cells"] == 2 * 2 * 2 * 4


def test_classification_report_tables_matched_and_mismatched_settings(tmp_path):
  config = w2s_config.get_config("study")
  arms = method.study_arms(config)
  assert [name for name, _ in arms][:2] == ["e1", "classification_l0.5_u0.05"]
  fake = {
    "teacher_accuracy": 0.6, "worst_group_teacher_accuracy": 0.3, "w2s_accuracy": 0.7,
    "worst_group_w2s_accuracy": 0.4, "enhanced_accuracy": 0.75, "worst_group_enhanced_accuracy": 0.5,
    "w2s_gain": 0.1, "enhanced_gain": 0.05, "enhanced_selected_p": 0.5, "enhanced_selected_q": 0.7,
    "enhanced_oracle_accuracy": 0.8,
  }  # fmt: skip
  results = {
    "classification_l0.5_u0.05": fake,
    "classification_l0.5_u0.5": {**fake, "enhanced_accuracy": 0.7, "enhanced_gain": 0.0},
  }
  report = method.report(config, results)
  assert [row["setting"] for row in report.rows] == ["mismatched", "matched"]
  assert report.rows[0]["enhanced_rel_improvement_pct"] == pytest.approx(100 * 0.05 / 0.7)
  assert report.summary["classification_remedy_helps_most_when_mismatched"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["digits", "digits_transfer"])
def test_digits_variants_pretrain_a_backbone_and_run_the_pipeline(tmp_path, variant):
  config = w2s_config.get_config(variant)
  config.num_seeds = 2
  config.pretrain.steps = 20
  config.teacher.steps = config.student.steps = config.enhanced.steps = 4
  config.enhanced.p_grid, config.enhanced.q_grid = (0.5,), (0.7,)
  summary = loop.run(config, str(tmp_path))
  if variant == "digits":  # label-free: two views of a held-out digit retrieve each other
    assert summary.results["pretrain_pair_accuracy"] > 1 / 297
  else:
    assert summary.results["pretrain_accuracy"] > 0.2
  assert 0.0 <= summary.results["ceiling_accuracy"] <= 1.0


@pytest.mark.slow
def test_digits_study_runs_both_backbones_over_the_four_settings():
  config = w2s_config.get_config("digits_study")
  arms = dict(method.study_arms(config))
  assert len(arms) == 8 and "e1" not in arms
  strong, transfer = arms["digits_l0.5_u0.05"], arms["digits_transfer_l0.05_u0.5"]
  assert strong.task == transfer.task == "digits"
  assert (strong.pretrain.objective, strong.pretrain.network) == ("contrastive", "cnn")
  assert (transfer.pretrain.objective, transfer.pretrain.network) == ("supervised", "mlp")
  assert transfer.digits.pretrain_digits == (0, 1, 2, 3, 4)
  assert (transfer.groups.eta_labelled, transfer.groups.eta_unlabelled) == (0.05, 0.5)
  row = {
    "teacher_accuracy": 0.9, "worst_group_teacher_accuracy": 0.8, "w2s_accuracy": 0.95,
    "worst_group_w2s_accuracy": 0.9, "enhanced_accuracy": 0.94, "worst_group_enhanced_accuracy": 0.9,
    "w2s_gain": 0.05, "enhanced_gain": -0.01, "enhanced_selected_p": 0.5, "enhanced_selected_q": 0.7,
    "enhanced_oracle_accuracy": 0.96, "ceiling_accuracy": 0.98, "worst_group_ceiling_accuracy": 0.95,
    "w2s_performance_gap_recovered": 0.625,
  }  # fmt: skip
  report = method.report(config, {name: row for name in arms})
  assert "digits" in report.figures and len(report.rows) == 8
  assert report.summary["digits_ceiling_minus_teacher_min"] == pytest.approx(0.08)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("enhanced.q_grid", (0.0, 0.5), "config.enhanced.q_grid: must be in \\(0, 1\\]"),
    ("groups.eta_unlabelled", 1.5, "config.groups.eta_unlabelled: must be in \\[0, 1\\]"),
    ("pseudolabels", "sharp", "config.pseudolabels: must be one of"),
    ("task", "ranking", "config.task: must be one of"),
  ],
)
def test_bad_fields_are_named(tmp_path, field, value, message):
  config = tiny_classification()
  *sections, name = field.split(".")
  node = config
  for section in sections:
    node = node[section]
  node[name] = value
  with pytest.raises(ConfigError, match=message):
    loop.run(config, str(tmp_path))


@pytest.mark.slow
def test_pretraining_fields_are_checked_per_objective():
  config = w2s_config.get_config("digits")
  method.validate(config)  # contrastive pre-training may see the task digits, unlabelled
  config.task = "tfds"
  with pytest.raises(
    ConfigError, match="config.pretrain.objective: 'contrastive' is built for 8x8"
  ):
    method.validate(config)
  transfer = w2s_config.get_config("digits_transfer")
  transfer.digits.pretrain_digits = (0, 5)
  with pytest.raises(ConfigError, match="config.digits.pretrain_digits: must not overlap"):
    method.validate(transfer)
  config = w2s_config.get_config("digits")
  config.pretrain.augment.contrast = (1.2, 0.6)
  with pytest.raises(ConfigError, match="config.pretrain.augment.contrast: need 0 < low <= high"):
    method.validate(config)


def test_regression_outside_the_ols_regime_is_refused(tmp_path):
  config = tiny_regression()
  config.regression.num_labelled = 10
  with pytest.raises(
    ConfigError, match="config.regression.num_labelled: the exact-moment predictor needs n > d_T"
  ):
    loop.run(config, str(tmp_path))


def test_gpu_variant_reads_celeba_style_tfds_without_downloading():
  import tensorflow_datasets as tfds

  config = w2s_config.get_config("gpu")
  config.num_seeds = 2
  config.tfds.image_size = 8
  config.tfds.max_train_examples = config.tfds.max_test_examples = 64
  config.groups.update(
    dict(num_labelled=8, num_unlabelled=8, num_heldout=4, num_test=8, eta_unlabelled=0.25)
  )
  with tfds.testing.mock_data(num_examples=64):
    data = method.tfds_data(config)
  unlabelled = data.splits["unlabelled"]
  assert unlabelled["x"].shape == (8, 2, 8 * 8 * 3) and unlabelled["x"].dtype == np.float32
  assert np.all((unlabelled["label"] != unlabelled["attribute"]).sum(0) == 2)  # round(0.25 * 8)
  assert data.pretrain["x"].shape == (64, 192) and set(np.unique(data.pretrain["label"])) <= set(
    range(8)
  )
