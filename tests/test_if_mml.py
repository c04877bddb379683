"""IID (intermediate fusion with informatic constraint and distribution coherence): the losses against
exact references, the paper's invariants, the data, a run through the shared loop, validation, tfds."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment, minimize

from configs import if_mml as if_mml_config
from core import fusion
from core.data import multimodal as mm
from core.nn import fusion as fusion_nn
from experiments import loop
from methods import if_mml
from methods.base import ConfigError, with_changes

# ---------------------------------------------------------------------------------------------------
# Fusion rules and the informatic constraint
# ---------------------------------------------------------------------------------------------------


def _inputs(batch=6, dim=16, seed=0):
  keys = jax.random.split(jax.random.key(seed), 2)
  return tuple(jax.random.normal(k, (batch, dim)) for k in keys)


def test_intermediate_fusion_equals_late_fusion_with_tied_heads():
  inputs = _inputs()
  if_model = fusion_nn.FusionClassifier("intermediate", num_classes=4, static_weights=(0.3, 0.7))
  lf_model = fusion_nn.FusionClassifier("late", num_classes=4, static_weights=(0.3, 0.7))
  if_params = if_model.init(jax.random.key(1), inputs)
  lf_params = lf_model.init(jax.random.key(1), inputs)
  tied = jax.tree.map(lambda x: x, lf_params)
  for m in range(2):
    tied["params"][f"heads_{m}"] = if_params["params"]["heads_0"]
    tied["params"][f"encoders_{m}"] = if_params["params"][f"encoders_{m}"]
  out_if, out_lf = if_model.apply(if_params, inputs), lf_model.apply(tied, inputs)
  chex.assert_shape(out_if.logits, (6, 4))
  chex.assert_shape(out_if.latents, (2, 6, 32))
  chex.assert_trees_all_close(out_if.logits, out_lf.logits, atol=1e-5)
  chex.assert_trees_all_close(out_if.unimodal_logits, out_lf.unimodal_logits, atol=1e-5)


def test_energy_weights_are_a_softmax_over_modalities_and_carry_no_gradient():
  logits = jax.random.normal(jax.random.key(0), (2, 5, 3))
  weights = fusion.energy_weights(logits)
  chex.assert_trees_all_close(weights.sum(0), jnp.ones(5), atol=1e-6)
  grad = jax.grad(lambda x: fusion.energy_weights(x)[0].sum())(logits)
  assert float(jnp.abs(grad).max()) == 0.0


def test_gaussian_kl_matches_monte_carlo():
  z = 0.5 + 2.0 * jax.random.normal(jax.random.key(0), (4096, 3))
  mean, std = np.asarray(z.mean(0)), np.asarray(z.std(0))
  draws = mean + std * np.random.default_rng(0).standard_normal((200_000, 3))
  log_p = -0.5 * (((draws - mean) / std) ** 2) - np.log(std)
  log_q = -0.5 * draws**2
  monte_carlo = np.mean(np.sum(log_p - log_q, axis=1))
  assert float(fusion.gaussian_kl_to_standard(z)) == pytest.approx(monte_carlo, rel=0.02)
  assert (
    float(fusion.gaussian_kl_to_standard(jax.random.normal(jax.random.key(1), (8192, 4)))) < 0.01
  )


@pytest.mark.slow
def test_informatic_constraint_sign_flips_the_unimodal_term_and_clips_it():
  key = jax.random.split(jax.random.key(0), 4)
  labels = jnp.array([0, 1, 2, 3, 0, 1])
  fused_logits = jax.random.normal(key[0], (6, 4))
  unimodal = 0.1 * jax.random.normal(key[1], (2, 6, 4)) + 3.0 * jax.nn.one_hot(labels, 4)
  fused, latents = jax.random.normal(key[2], (6, 8)), jax.random.normal(key[3], (2, 6, 8))
  args = (fused_logits, unimodal, fused, latents, labels, 0.1)
  plus = fusion.informatic_constraint(*args, unimodal_sign=1)
  minus = fusion.informatic_constraint(*args, unimodal_sign=-1)
  ce = jax.vmap(lambda lg: -jnp.mean(jax.nn.log_softmax(lg)[jnp.arange(6), labels]))(unimodal)
  assert float(plus - minus) == pytest.approx(2 * float(ce.sum()), rel=1e-5)
  wrong = fusion.informatic_constraint(
    fused_logits,
    -50.0 * jax.nn.one_hot(labels, 4)[None].repeat(2, 0),
    fused,
    latents,
    labels,
    0.1,
    -1,
  )
  fused_ce = -jnp.mean(jax.nn.log_softmax(fused_logits)[jnp.arange(6), labels])
  kl = fusion.gaussian_kl_to_standard(fused) + sum(
    fusion.gaussian_kl_to_standard(z) for z in latents
  )
  assert float(wrong) == pytest.approx(float(fused_ce - 2 * math.log(4) + 0.1 * kl), rel=1e-5)


# ---------------------------------------------------------------------------------------------------
# Distribution coherence: FFT sparsification, RIP projection, unbalanced Sinkhorn (ott-jax)
# ---------------------------------------------------------------------------------------------------


def test_fft_sparsify_matches_numpy_fft_with_the_largest_coefficients_kept():
  z = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
  chex.assert_trees_all_close(fusion.fft_sparsify(jnp.asarray(z), 32), z, atol=1e-5)
  sparse = fusion.fft_sparsify(jnp.asarray(z), 8)
  spectrum = np.fft.fft(z, axis=-1)
  threshold = np.sort(np.abs(spectrum), axis=-1)[:, -8:-7]
  kept = np.abs(spectrum) >= threshold * (1 - 1e-5)
  reference = np.real(np.fft.ifft(np.where(kept, spectrum, 0), axis=-1))
  np.testing.assert_allclose(np.asarray(sparse), reference, atol=1e-5)
  assert np.all((kept.sum(-1) >= 8) & (kept.sum(-1) <= 9)) and sparse.dtype == jnp.float32


def test_rip_projection_roughly_preserves_distances_of_sparse_vectors():
  z = fusion.fft_sparsify(jax.random.normal(jax.random.key(0), (64, 32)), 16)
  phi = fusion.rip_matrix(jax.random.key(1), 8, 32)
  chex.assert_shape(fusion.coherence_features(z, phi, 16), (64, 8))
  i, j = np.triu_indices(64, 1)
  before = np.linalg.norm(np.asarray(z)[i] - np.asarray(z)[j], axis=-1)
  after = np.linalg.norm(np.asarray(z @ phi.T)[i] - np.asarray(z @ phi.T)[j], axis=-1)
  ratio = after / before
  assert np.mean((ratio > 0.5) & (ratio < 1.5)) > 0.9
  assert abs(np.median(ratio) - 1.0) < 0.15


def _points(n=32, k=4, seed=0):
  keys = jax.random.split(jax.random.key(seed), 2)
  return jax.random.normal(keys[0], (n, k)), 1.5 * jax.random.normal(keys[1], (n, k)) + 1.0


def test_sinkhorn_balanced_limit_matches_exact_optimal_transport():
  x, y = _points()
  cost = np.linalg.norm(np.asarray(x)[:, None] - np.asarray(y)[None], axis=-1)
  cost = cost / cost.mean()
  rows, cols = linear_sum_assignment(cost)
  exact = cost[rows, cols].mean()
  out = fusion.sinkhorn_solve(jnp.asarray(cost), 1e-3, 1e6, 2000)
  assert float(out.primal_cost) == pytest.approx(exact, rel=0.02)
  assert float(fusion.exact_wasserstein(x, y, p=1)) == pytest.approx(
    np.linalg.norm(np.asarray(x)[rows] - np.asarray(y)[cols], axis=-1).mean(), rel=1e-6
  )


def test_unbalanced_sinkhorn_plan_is_the_exact_minimiser_on_a_small_case():
  cost = np.array([[0.2, 1.0], [0.7, 0.1], [1.5, 0.4]])
  a, b = np.full(3, 1 / 3), np.full(2, 1 / 2)
  eps, lam = 0.1, 0.5

  def kl(p, q):
    return np.sum(p * np.log(p / q) - p + q)

  def objective(log_plan):
    plan = np.exp(log_plan.reshape(3, 2))
    marginals = kl(plan.sum(1), a) + kl(plan.sum(0), b)
    return np.sum(plan * cost) + eps * np.sum(plan * np.log(plan) - plan) + lam * marginals

  best = minimize(objective, np.log(np.outer(a, b)).ravel(), method="BFGS", options={"gtol": 1e-12})
  plan = np.exp(best.x).reshape(3, 2)
  out = fusion.sinkhorn_solve(jnp.asarray(cost, jnp.float32), eps, lam, 500)
  np.testing.assert_allclose(np.asarray(out.matrix), plan, atol=1e-5)
  assert 0.8 < plan.sum() < 1.0  # unbalanced: mass is destroyed where transport is expensive
  value = fusion.relaxed_ot_objective(out.matrix, jnp.asarray(cost, jnp.float32), lam)
  expected = np.sum(plan * cost) + lam * (kl(plan.sum(1), a) + kl(plan.sum(0), b))
  assert float(value) == pytest.approx(expected, abs=1e-5)


def test_relaxed_distance_is_shift_and_scale_invariant_and_differentiable():
  x, y = _points()
  w = lambda a, b: fusion.unbalanced_ot_cost(a, b, 0.05, 1.0, 50)  # noqa: E731
  base = float(w(x, y))
  shift = jnp.arange(4.0)
  assert float(w(x + shift, y + shift)) == pytest.approx(base, rel=1e-4)
  assert float(w(3.0 * x, 3.0 * y)) == pytest.approx(base, rel=1e-4)
  assert float(w(x, x)) < base
  grad = jax.grad(w)(x, y)
  assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.abs(grad).max()) > 0


@pytest.mark.slow
def test_coherence_loss_is_symmetric_and_vmaps():
  latents = jax.random.normal(jax.random.key(0), (2, 16, 32)) * jnp.array([1.0, 2.0])[:, None, None]
  phi = fusion.rip_matrix(jax.random.key(1), 8, 32)
  loss = lambda z: fusion.distribution_coherence(z, phi, 16, 0.05, 1.0, 50)  # noqa: E731
  assert float(loss(latents)) == pytest.approx(float(loss(latents[::-1])), rel=1e-3)
  batched = jax.vmap(loss)(jnp.stack([latents, latents[::-1]]))
  chex.assert_shape(batched, (2,))


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def test_synthetic_replicates_share_samples_across_deltas():
  data = mm.synthetic_replicates([0, 1], [0.0, 2.0], "train", 64, class_scale=0.8)
  chex.assert_shape(data["x1"], (64, 4, 16))
  assert data["x1"].dtype == np.float32 and data["y"].dtype == np.int32
  np.testing.assert_array_equal(data["x1"][:, 0], data["x1"][:, 2])  # same seed, other delta
  np.testing.assert_array_equal(data["y"][:, 1], data["y"][:, 3])
  assert not np.array_equal(data["x1"][:, 0], data["x1"][:, 1])
  assert np.abs(data["x2"][:, 2]).mean() > 2 * np.abs(data["x2"][:, 0]).mean()
  design = mm.synthetic_design(0)
  affine = mm.synthetic_split(design, 0, "test", 64, 2.0, tail_rate=0.0)
  clean = mm.synthetic_split(design, 0, "test", 64, 0.0)
  np.testing.assert_allclose(
    affine["x2"], 3.0 * clean["x2"] + 2.0 * design.shift, rtol=1e-5, atol=1e-5
  )


# ---------------------------------------------------------------------------------------------------
# The method through the shared loop
# ---------------------------------------------------------------------------------------------------


def tiny_config(models=("if", "lf", "full")):
  config = if_mml_config.get_config()
  config.models = models
  config.data.update(deltas=(0.0, 1.0), num_seeds=2, num_train=32, num_val=16, num_test=64)
  config.model.update(hidden=(16,), latent_dim=8)
  config.dc.update(keep=4, projection_dim=4, iterations=10)
  config.update(batch_size=16, steps=4)
  config.eval.update(select_every=2, incoherence_points=32)
  config.loop.update(log_every=2, checkpoint_every=2)
  return config


def test_run_reports_every_model_and_compiles_each_step_once(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  assert summary.step_traces == {"if": 1, "lf": 1, "full": 1}
  for name in ("if", "lf", "full"):
    for key in ("accuracy", "gap", "relative_incoherence", "final_accuracy", "selected_step"):
      assert math.isfinite(results[f"{key}_{name}"]), (key, name)
    assert np.shape(results[f"accuracy_{name}/replicates"]) == (2, 2)
    assert np.shape(results[f"unimodal_accuracy_{name}/replicates"]) == (2, 2, 2)
    assert 0.0 <= results[f"accuracy_{name}"] <= 1.0
    assert set(np.ravel(results[f"selected_step_{name}/replicates"])) <= {2.0, 4.0}


@pytest.mark.slow  # resume is the loop's (test_loop.py); by default the smoke run above
def test_interrupted_run_resumes_to_the_same_results(tmp_path):
  config = tiny_config(models=("if",))
  whole = loop.run(config, str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted):
    loop.run(config, str(tmp_path / "cut"), should_stop=lambda phase, step: step == 2)
  resumed = loop.run(config, str(tmp_path / "cut")).results
  chex.assert_trees_all_close(resumed, whole, rtol=1e-5)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("models", ("if", "mid"), "config.models: unknown models"),
    ("dc.keep", 64, "config.dc.keep: keeps 64"),
    ("ic.unimodal_sign", 0, "config.ic.unimodal_sign: must be one of"),
    ("data.view_dim", 9, "config.data.view_dim: must be <="),
    ("model.static_weights", (0.5, 0.7), "config.model.static_weights"),
    ("study.affine_arms", ("iff",), "config.study.affine_arms: unknown arms"),
    ("model.weighting", "tcp", "config.model.weighting: must be one of"),
    ("study.weightings", ("static",), "config.study.weightings: need a subset"),
    ("study.weighted_models", ("concat",), "config.study.weighted_models"),
  ],
)
def test_bad_fields_are_named(field, value, message):
  config = with_changes(tiny_config(), **{field.replace(".", "__"): value})
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


def test_gpu_variant_needs_its_data_dir_and_reads_tfds_without_downloading():
  import tensorflow_datasets as tfds

  config = if_mml_config.get_config("gpu")
  with pytest.raises(ConfigError, match="config.data.data_dir"):
    loop.validate(config, data_devices=1)
  config.data.update(data_dir="/nonexistent/prepared", num_train_eval=4, num_test=6)
  config.update(batch_size=4)
  config.eval.update(incoherence_points=4, chunk=4)
  config.model.update(hidden=(4,), latent_dim=8)
  config.dc.update(keep=4, projection_dim=4)
  loop.validate(config, data_devices=1)
  with tfds.testing.mock_data(num_examples=8):
    data = if_mml.load_data(config)
    batch = if_mml.phases.train_batches(config, data).batch(0)
  assert batch["x1"].shape == (4, 32, 32, 8) and batch["x2"].shape == (4, 32, 32, 10)
  assert batch["y"].dtype == np.int32 and data["test"]["x1"].shape == (6, 32, 32, 8)
  shapes = ((32, 32, 8), (32, 32, 10))
  state = if_mml.phases.init_state(config, "if_ic", shapes, None, jax.random.key(0))
  state, metrics = jax.jit(lambda s, b: if_mml.train_step(config, "if_ic", s, b, None))(
    state, batch
  )
  assert math.isfinite(float(metrics["loss"])) and "informatic" in metrics
  results = if_mml.evaluate(config, "if_ic", data, state)
  assert np.shape(results["accuracy_if_ic/replicates"]) == (1, 3)


def test_study_arms_and_report():
  config = if_mml_config.get_config("study")
  names = [name for name, _ in if_mml.study_arms(config)]
  assert names[:8] == ["lf", "if", "concat", "if_ic", "if_ic_neg", "if_dc", "full", "full_neg"]
  assert {"lf_q", "lf_p", "if_q", "if_p", "full_q", "full_p"} <= set(names)
  assert dict(if_mml.study_arms(config))["full_p"].model.weighting == "pdf"
  assert "if_ic_neg_alpha0.1" in names and "if_dc_beta1" in names and "if_dc_beta1_affine" in names
  rng = np.random.default_rng(0)
  shape = (len(config.data.deltas), config.data.num_seeds)
  results = {}
  for name, arm in if_mml.study_arms(config):
    model = arm.models[0]
    keys = ("accuracy", "gap", "relative_incoherence", "selected_step")
    results[name] = {
      f"{prefix}{key}_{model}/replicates": rng.uniform(size=shape).tolist()
      for prefix in ("", "final_")
      for key in keys
    }
    results[name][f"accuracy_{model}"] = 0.5
  report = if_mml.report(config, results)
  assert len(report.rows) == len(names) * len(config.data.deltas)
  assert "if_minus_lf" in report.summary and "final_full_minus_if_by_delta" in report.summary
  assert "full_p_minus_full" in report.summary and "if_p_minus_lf_p" in report.summary
  assert "if_mml_study" in report.figures


# ---------------------------------------------------------------------------------------------------
# Fusion weights: IID-P (PDF's co-belief) beside IID-Q and IID-L
# ---------------------------------------------------------------------------------------------------


def test_pdf_weights_match_the_co_belief_formula_at_hand_computed_values():
  confidence = jnp.array([[0.9], [0.5]])
  holo = fusion.holo_confidence(confidence)
  # official two-modality form: h_1 = log c_2 / log(c_1 c_2)
  assert float(holo[0, 0]) == pytest.approx(math.log(0.5) / math.log(0.45), rel=1e-5)
  co_belief = np.array([0.9 + math.log(0.5) / math.log(0.45), 0.5 + math.log(0.9) / math.log(0.45)])
  logits = jnp.zeros((2, 1, 3))
  weights = fusion.pdf_weights(logits, confidence, calibrate=False)
  expected = np.exp(co_belief) / np.exp(co_belief).sum()
  np.testing.assert_allclose(np.asarray(weights[:, 0]), expected, rtol=1e-5)
  assert float(weights[0, 0]) == pytest.approx(0.7571, abs=1e-3)  # the surer modality leads
  three = fusion.holo_confidence(jnp.array([[0.9], [0.5], [0.2]]))
  logs = np.log([0.9, 0.5, 0.2])
  np.testing.assert_allclose(np.asarray(three[:, 0]), (logs.sum() - logs) / logs.sum(), rtol=1e-5)


def test_relative_calibration_scales_down_the_flatter_modality_only():
  sharp = jnp.array([4.0, 0.0, 0.0])  # far from uniform
  flat = jnp.array([0.5, 0.0, 0.0])
  logits = jnp.stack([sharp, flat])[:, None, :]
  rc = fusion.relative_calibration(logits)[:, 0]
  p_sharp, p_flat = jax.nn.softmax(sharp), jax.nn.softmax(flat)
  u = [float(jnp.mean(jnp.abs(p - 1 / 3))) for p in (p_sharp, p_flat)]
  assert float(rc[0]) == pytest.approx(1.0) and float(rc[1]) == pytest.approx(u[1] / u[0], rel=1e-5)
  confidence = jnp.array([[0.6], [0.6]])  # equal co-belief: only the calibration tells them apart
  plain = fusion.pdf_weights(logits, confidence, calibrate=False)
  calibrated = fusion.pdf_weights(logits, confidence, calibrate=True)
  assert float(plain[0, 0]) == pytest.approx(0.5) and float(calibrated[0, 0]) > 0.6
  grad = jax.grad(lambda c: fusion.pdf_weights(logits, c, True)[0].sum())(confidence)
  assert float(jnp.abs(grad).max()) == 0.0


def test_confidence_loss_is_the_l1_distance_to_the_true_class_probability():
  logits = jax.random.normal(jax.random.key(0), (2, 5, 4))
  labels = jnp.array([0, 1, 2, 3, 0])
  tcp = jax.nn.softmax(logits)[:, jnp.arange(5), labels]
  chex.assert_trees_all_close(fusion.true_class_probability(logits, labels), tcp, atol=1e-6)
  assert float(fusion.confidence_loss(tcp, logits, labels)) == pytest.approx(0.0, abs=1e-6)
  shifted = jnp.clip(tcp + 0.1, 0, 1)
  expected = float(jnp.sum(jnp.mean(jnp.abs(shifted - tcp), axis=1)))
  assert float(fusion.confidence_loss(shifted, logits, labels)) == pytest.approx(expected, rel=1e-5)
  grad = jax.grad(lambda lg: fusion.confidence_loss(shifted, lg, labels))(logits)
  assert float(jnp.abs(grad).max()) == 0.0  # the target is held fixed
  with pytest.raises(ValueError, match="mono-confidence"):
    fusion.fusion_weights("pdf", logits)
  with pytest.raises(ValueError, match="must be one of"):
    fusion.fusion_weights("tcp", logits)


@pytest.mark.slow
def test_pdf_model_trains_its_confidence_nets_without_touching_the_encoders():
  config = with_changes(tiny_config(models=("if",)), model__weighting="pdf")
  model = if_mml.model_of(config, "if")
  inputs = _inputs(batch=8, dim=16)
  params = model.init(jax.random.key(0), inputs)
  labels = jnp.arange(8) % 4

  def loss(p):
    out = model.apply(p, inputs, train=True)
    return fusion.confidence_loss(out.confidence, out.unimodal_logits, labels)

  grads = jax.grad(loss)(params)["params"]
  assert float(optax_norm(grads["confidence_nets_0"])) > 0
  assert (
    float(optax_norm(grads["encoders_0"])) == 0.0 and float(optax_norm(grads["heads_0"])) == 0.0
  )
  train_out, eval_out = model.apply(params, inputs, train=True), model.apply(params, inputs)
  chex.assert_trees_all_close(train_out.weights.sum(0), jnp.ones(8), atol=1e-6)
  assert not np.allclose(train_out.weights, eval_out.weights)  # evaluation calibrates
  data = if_mml.load_data(config)
  state = if_mml.phases.init_state(config, "if", ((16,), (16,)), data["val"], jax.random.key(0))
  batch = if_mml.phases.train_batches(config, data).batch(0)
  _, metrics = jax.jit(lambda s, b: if_mml.train_step(config, "if", s, b, None))(state, batch)
  assert "confidence" in metrics and math.isfinite(float(metrics["loss"]))


def optax_norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))


# ---------------------------------------------------------------------------------------------------
# The cohering loss does what it is for, and the study's intervals are over seeds
# ---------------------------------------------------------------------------------------------------


def _train_and_measure(config, name):
  data = if_mml.load_data(config)
  shapes = tuple(data["test"][k].shape[2:] for k in ("x1", "x2"))
  state = if_mml.phases.init_state(config, name, shapes, None, jax.random.key(0))
  batches = if_mml.phases.train_batches(config, data)
  step = jax.jit(lambda s, b: if_mml.train_step(config, name, s, b, None))
  for index in range(config.steps):
    state, _ = step(state, batches.batch(index))
  return if_mml.phases.weight_metrics(config, name, data, state["params"])


@pytest.mark.slow
def test_training_with_the_cohering_loss_lowers_the_measured_incoherence():
  config = tiny_config(models=("if", "if_dc"))
  config.data.update(deltas=(2.0,), num_seeds=3, num_train=64, num_val=0, num_test=256)
  config.dc.update(beta=1.0)
  config.eval.update(select_best=False, incoherence_points=128)
  config.update(batch_size=32, steps=60)
  plain = _train_and_measure(config, "if")["relative_incoherence"]
  cohered = _train_and_measure(config, "if_dc")["relative_incoherence"]
  assert np.all(cohered < plain), (cohered, plain)  # same seeds, data and initial weights
  assert float(np.mean(plain - cohered)) > 0.1


def test_overall_paired_interval_is_over_seeds_not_replicates():
  from scipy import stats

  config = if_mml_config.get_config("study")
  seed_effect = np.array([0.02, -0.01, 0.03, 0.0, 0.01])  # shared by every delta of a seed
  rng = np.random.default_rng(1)
  diff = seed_effect[None, :] + 0.001 * rng.standard_normal((5, 5))
  results = {
    "if": {"accuracy_if/replicates": np.zeros((5, 5)), "accuracy_if": 0.0},
    "if_p": {"accuracy_if/replicates": diff, "accuracy_if": 0.0},
  }
  (_, _), (mean, half) = if_mml.paired(results, "if_p", "if")
  seed_means = diff.mean(0)
  expected = stats.t.ppf(0.975, 4) * seed_means.std(ddof=1) / math.sqrt(5)
  assert mean == pytest.approx(seed_means.mean()) and half == pytest.approx(expected, rel=1e-9)
  pooled = stats.t.ppf(0.975, 24) * diff.std(ddof=1) / 5.0
  assert half > 1.8 * pooled  # pooling the 25 correlated replicates would be far too narrow
  assert len(config.data.deltas) == 5
