"""Dynamic Gated Neuron: neuron maths, variance formulas, data and perturbations, readers, the method."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dgn_snn as dgn_config
from core import spiking_stability as stability
from core.data import spikes as spike_data
from core.nn import spiking
from experiments import loop
from methods.base import ConfigError
from methods.dgn_snn import phases as dgn_phases
from methods.dgn_snn import study as dgn_study


def random_spikes(seed, shape, rate=0.1):
  return (jax.random.uniform(jax.random.key(seed), shape) < rate).astype(jnp.float32)


def network(kind="dgn", **changes):
  return spiking.NetworkConfig(kind=kind, n_in=12, hidden_sizes=(10,), n_out=4, **changes)


# ---------------------------------------------------------------------------------------------------
# Neuron
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("surrogate", spiking.SURROGATES)
def test_spike_forward_is_exact_heaviside_and_backward_the_surrogate(surrogate):
  x = jnp.linspace(-2.0, 2.0, 401)
  out = spiking.spike(x, surrogate, 0.5)
  np.testing.assert_array_equal(out, (x >= 0).astype(jnp.float32))
  grad = jax.grad(lambda v: spiking.spike(v, surrogate, 0.5).sum())(x)
  np.testing.assert_allclose(grad, spiking.surrogate_derivative(x, surrogate, 0.5))
  step = 1e-3
  fine = (jnp.arange(-100_000, 100_001) + 0.5) * step
  integral = float(jnp.sum(spiking.surrogate_derivative(fine, surrogate, 0.5))) * step
  assert integral == pytest.approx(1.0, abs=4e-3)  # the heavy tails beyond |x| = 100


def test_dgn_with_zero_conductance_is_lif_and_rho_is_a_decay():
  x = random_spikes(0, (3, 30, 12))
  lif = network("lif")
  params = spiking.init_network(jax.random.key(1), lif)
  zero_c = jax.tree.map(lambda p: p, params)
  for layer in [*zero_c["hidden"], zero_c["readout"]]:
    layer["c"] = jnp.zeros_like(layer["w"])
  out_lif = spiking.apply_network(params, x, lif)
  out_dgn = spiking.apply_network(zero_c, x, network("dgn"))
  chex.assert_trees_all_equal(out_lif, out_dgn)
  assert out_lif.hidden_spikes[0].shape == (3, 30, 10) and out_lif.logits.shape == (3, 4)
  assert out_lif.hidden_spikes[0].dtype == jnp.float32
  g = jax.random.normal(jax.random.key(2), (1000,)) * 3
  for phi in spiking.PHIS:
    rho = spiking.decay_factor(g, spiking.NeuronConfig(phi=phi))
    assert float(rho.min()) >= 0.0 and float(rho.max()) <= 1.0


def test_discrete_update_converges_to_the_continuous_model():
  """Eq. 5-8 at step dt against Eq. 3-4 (RK4, exact traces) on a fine grid, below threshold:
  the error is small and first order in dt (forward Euler)."""
  w, c = jnp.array([1.5, -0.7, 0.9]), jnp.array([0.8, 0.3, 0.5])
  g_l, tau_s, horizon, fine = 1.0, 0.5, 4.0, 1e-3
  rng = np.random.default_rng(0)
  ticks = rng.random((40, 3)) < 0.25  # spike times on a 0.1 grid shared by every dt
  dense = np.zeros((int(horizon / fine), 3), np.float32)
  dense[::100] = ticks
  reference = spiking.continuous_neuron(jnp.asarray(dense), w, c, g_l, tau_s, fine)
  errors = []
  for dt in (0.02, 0.01, 0.005):
    stride = round(dt / fine)
    coarse = dense.reshape(-1, stride, 3).sum(1)
    neuron = spiking.NeuronConfig(dt=dt, tau_s=tau_s, g_l=g_l, threshold=1e9)
    _, v = spiking.discrete_neuron(jnp.asarray(coarse), w / tau_s, c / tau_s, neuron)
    errors.append(float(jnp.max(jnp.abs(v - reference[stride - 1 :: stride]))))
  assert errors[-1] < 0.02 * float(jnp.max(jnp.abs(reference)))
  assert 1.6 < errors[0] / errors[1] < 2.4 and 1.6 < errors[1] / errors[2] < 2.4


def test_parameter_counts_of_the_three_neurons():
  sizes = {
    k: spiking.num_params(spiking.init_network(jax.random.key(0), network(k)))
    for k in spiking.KINDS
  }
  lif = 12 * 10 + 10 * 4
  assert sizes == {"lif": lif, "dgn": 2 * lif, "sdgn": lif + 10 + 4}
  wide = spiking.NetworkConfig(kind="lif", n_in=12, hidden_sizes=(20,), n_out=4)
  assert spiking.num_params(spiking.init_network(jax.random.key(0), wide)) == sizes["dgn"]


def test_recurrent_layer_with_zero_recurrent_weights_is_feed_forward():
  x = random_spikes(3, (2, 25, 12), rate=0.3)
  rec, ff = network("dgn", recurrent=True), network("dgn")
  params = spiking.init_network(jax.random.key(4), rec)
  out = spiking.apply_network(params, x, rec)
  assert out.hidden_spikes[0].shape == (2, 25, 10)
  silent = jax.tree.map(lambda p: p, params)
  silent["hidden"][0] = {
    k: (jnp.zeros_like(v) if k.endswith("_rec") else v) for k, v in params["hidden"][0].items()
  }
  plain = {"hidden": [{k: v for k, v in silent["hidden"][0].items() if not k.endswith("_rec")}]}
  plain["readout"] = params["readout"]
  chex.assert_trees_all_close(
    spiking.apply_network(silent, x, rec), spiking.apply_network(plain, x, ff)
  )
  grads = jax.grad(lambda p: spiking.apply_network(p, x, rec).logits.sum())(params)
  assert float(jnp.abs(grads["hidden"][0]["w_rec"]).sum()) > 0


def test_pallas_scan_matches_the_sequential_scan():
  x = random_spikes(5, (2, 8, 12), rate=0.4)
  params = spiking.init_network(jax.random.key(6), network("dgn"))
  seq = spiking.apply_network(params, x, network("dgn", scan_implementation="sequential"))
  pallas = spiking.apply_network(params, x, network("dgn", scan_implementation="pallas"))
  chex.assert_trees_all_close(seq, pallas, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Stochastic stability (Eq. 13-14)
# ---------------------------------------------------------------------------------------------------


def test_variance_formulas_against_simulation():
  w, c = jnp.array([0.8, 0.5, -0.3]), jnp.array([0.5, 0.3, 0.2])
  mu, sigma, g_l = jnp.array([1.0, 0.8, 0.5]), jnp.array([0.3, 0.2, 0.1]), 1.0
  simulate = jax.jit(
    lambda key, c: stability.simulate_variance(
      key, w, c, mu, sigma, g_l, num_steps=8000, num_chains=512, burn_in=3000
    )
  )
  dgn = float(simulate(jax.random.key(0), c))
  lif = float(simulate(jax.random.key(1), jnp.zeros(3)))
  assert dgn == pytest.approx(float(stability.ito_variance(w, c, mu, sigma, g_l)), rel=0.08)
  assert dgn == pytest.approx(float(stability.dgn_variance(w, c, mu, sigma, g_l)), rel=0.1)
  assert lif == pytest.approx(float(stability.lif_variance(w, sigma, g_l)), rel=0.08)
  assert float(stability.dgn_variance(w, jnp.zeros(3), mu, sigma, g_l)) == pytest.approx(
    float(stability.lif_variance(w, sigma, g_l)), rel=1e-6
  )
  assert dgn < lif / 3  # leak scaling and noise compensation


# ---------------------------------------------------------------------------------------------------
# Data and perturbations
# ---------------------------------------------------------------------------------------------------


def test_temporal_digits_pairs_differ_only_in_order():
  data = spike_data.temporal_order_digits(0, 800, num_classes=2, num_steps=60, channels=32)
  x, y = data["x"], data["y"]
  assert x.shape == (1600, 60, 32) and x.dtype == np.uint8 and y.dtype == np.int32
  assert 0.01 < x.mean() < 0.1
  counts = [x[y == k].sum(1).mean(0) for k in (0, 1)]
  assert np.abs(counts[0] - counts[1]).max() < 0.08 * counts[0].max()
  profiles = [x[y == k].mean((0, 2)) for k in (0, 1)]
  np.testing.assert_allclose(profiles[1], profiles[0][::-1], atol=0.02)
  ten = spike_data.temporal_order_digits(1, 2, num_steps=60, channels=32)
  assert ten["x"].shape == (20, 60, 32) and np.array_equal(np.bincount(ten["y"]), [2] * 10)


def test_mnist1d_spikes_are_population_coded():
  data = spike_data.mnist1d_spikes(0, 50, channels=16, num_steps=24)
  assert data["x"].shape == (50, 24, 16) and data["x"].dtype == np.uint8
  assert set(np.unique(data["y"])) <= set(range(10)) and 0 < data["x"].mean() < 0.5


def test_perturbations_are_identity_at_zero_and_scale_with_p():
  x = random_spikes(7, (8, 100, 64), rate=0.05)
  key = jax.random.key(8)
  for family, zero in (
    ("additive", 0.0),
    ("subtractive", 0.0),
    ("mixed", (0.0, 0.0)),
    ("jitter", 0.0),
  ):
    np.testing.assert_array_equal(spike_data.perturb(key, x, family, zero), x)
  spikes, silent = float(x.sum()), float(x.size - x.sum())
  added = float(spike_data.add_spikes(key, x, 0.05).sum()) - spikes
  assert added == pytest.approx(0.05 * silent, rel=0.05)
  removed = spikes - float(spike_data.delete_spikes(key, x, 0.3).sum())
  assert removed == pytest.approx(0.3 * spikes, rel=0.05)
  jittered = spike_data.jitter(key, x, 2.0)
  assert float(jittered.sum()) == pytest.approx(spikes, rel=0.1)
  np.testing.assert_array_equal(jittered.sum(1) > 0, jittered.sum(1) > 0)
  assert float(jnp.abs(jittered - x).sum()) > 0
  np.testing.assert_array_equal(jittered.max(axis=1) <= 1, True)


def _write_mock_events(path, count, units, num_classes, seed=0):
  rng = np.random.default_rng(seed)
  times = [
    np.sort(rng.uniform(0, 1.5, rng.integers(5, 40))).astype(np.float32) for _ in range(count)
  ]
  unit_ids = [rng.integers(0, units, len(t)).astype(np.uint16) for t in times]
  spike_data.write_events(str(path), times, unit_ids, rng.integers(0, num_classes, count))
  return times, unit_ids


def test_event_reader_bins_the_shd_layout(tmp_path):
  pytest.importorskip("h5py")
  times, units = _write_mock_events(tmp_path / "shd_train.h5", 6, 700, 20)
  dataset = spike_data.EventDataset(str(tmp_path / "shd_train.h5"), 50, 1.4, 700)
  batch = dataset[np.array([0, 3])]
  assert batch["x"].shape == (2, 50, 700) and batch["x"].dtype == np.uint8
  keep = times[3] < 1.4
  expected = np.zeros((50, 700), np.uint8)
  expected[np.floor(times[3][keep] / 1.4 * 50).astype(int), units[3][keep]] = 1
  np.testing.assert_array_equal(batch["x"][1], expected)


# ---------------------------------------------------------------------------------------------------
# The method through the loop
# ---------------------------------------------------------------------------------------------------


def tiny_config(**changes):
  config = dgn_config.get_config()
  config.data.update(num_steps=20, channels=16, train_per_class=4, test_per_class=2)
  config.model.hidden_sizes = (8,)
  config.num_seeds = 2
  config.batch_size = 8
  config.steps = 3
  config.eval.update(
    additive_probs=(0.05,),
    subtractive_probs=(0.3,),
    mixed_probs=((0.02, 0.2),),
    jitter_sigmas=(2.0,),
    pgd_epsilons=(0.1,),
    pgd_steps=2,
    chunk=12,
    pgd_examples=8,
    num_train_examples=16,
  )
  config.stability.update(num_steps=400, burn_in=100, num_chains=8)
  config.loop.update(log_every=1, checkpoint_every=2)
  for field, value in changes.items():
    section, name = field.split(".") if "." in field else (None, field)
    (config[section] if section else config)[name] = value
  return config


def test_default_run_reports_the_keys_and_compiles_each_step_once(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  r = summary.results
  for key in ("clean_accuracy", "robust_accuracy", "robust_accuracy_lif", "pgd_accuracy"):
    assert 0.0 <= r[key] <= 1.0, key
  assert np.shape(r["accuracy_additive"]) == (2, 1) and len(r["clean_accuracy_per_seed"]) == 2
  assert r["num_params"] == 2 * r["num_params_lif"]
  assert r["spikes_per_inference"] >= 0 and r["synaptic_ops_per_inference"] >= 0
  assert len(r["variance_dgn_simulated"]) == 5 and r["variance_lif_formula"] > 0
  assert summary.step_traces == {"train": 1, "train_lif": 1, "stability": 0}


@pytest.mark.slow  # resume is the loop's (test_loop.py); by default the smoke run above
def test_interrupted_run_resumes_to_the_same_results(tmp_path):
  config = tiny_config(compare_lif=False, **{"eval.pgd_epsilons": ()})
  config.stability.enabled = False
  whole = loop.run(config, str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted):
    loop.run(config, str(tmp_path / "cut"), should_stop=lambda phase, step: step == 2)
  resumed = loop.run(config, str(tmp_path / "cut")).results
  chex.assert_trees_all_close(resumed, whole, rtol=1e-5)


def test_seeds_are_independent_networks():
  config = tiny_config()
  state = dgn_phases.init_state(config, jax.random.key(0))
  w = state["params"]["hidden"][0]["w"]
  assert w.shape == (2, 16, 8) and not np.allclose(w[0], w[1])
  batch = dgn_phases.train_batches(config).batch(0)
  assert batch["x"].shape == (8, 2, 20, 16) and batch["y"].shape == (8, 2)
  assert not np.array_equal(batch["y"][:, 0], batch["y"][:, 1])


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("model.kind", "alif", "config.model.kind: must be one of"),
    ("model.g_l", 1.5, "config.model.g_l: g_l \\* dt must lie in"),
    ("eval.additive_probs", (1.5,), "config.eval.additive_probs: probabilities"),
    ("data.num_classes", 9, "config.data.num_classes: must be even"),
    ("model.hidden_sizes", (0,), "config.model.hidden_sizes: must be positive"),
  ],
)
def test_bad_fields_are_named(tmp_path, field, value, message):
  with pytest.raises(ConfigError, match=message):
    loop.run(tiny_config(**{field: value}), str(tmp_path))


@pytest.mark.parametrize("variant", ["gpu", "gpu_tidigits"])
def test_paper_scale_variants_name_the_missing_data_dir(variant):
  with pytest.raises(ConfigError, match="config.data.data_dir"):
    loop.validate(dgn_config.get_config(variant), data_devices=1)


def test_gpu_variant_reads_event_files(tmp_path):
  pytest.importorskip("h5py")
  for split in ("train", "test"):
    _write_mock_events(tmp_path / f"shd_{split}.h5", 12, 700, 20, seed=len(split))
  config = dgn_config.get_config("gpu")
  config.data.data_dir = str(tmp_path)
  config.batch_size = 4
  loop.validate(config, data_devices=1)
  batch = dgn_phases.train_batches(config).batch(0)
  assert batch["x"].shape == (4, 3, 250, 700) and batch["x"].dtype == np.uint8
  assert dgn_phases.load_splits(config.data)["test"]["x"].shape == (12, 250, 700)


def test_study_arms_and_report():
  config = dgn_config.get_config("study")
  arms = dict(dgn_study.study_arms(config))
  assert list(arms) == [
    "lif",
    "dgn",
    "sdgn",
    "lif_matched",
    "dgn_sigmoid",
    "mnist1d_lif",
    "mnist1d_dgn",
  ]
  assert tuple(arms["lif_matched"].model.hidden_sizes) == (256,)
  assert [name for name, arm in arms.items() if arm.stability.enabled] == ["dgn"]
  rng = np.random.default_rng(0)

  def fake(clean, robust):
    result = {
      "clean_accuracy": clean,
      "clean_accuracy_per_seed": [clean] * 3,
      "robust_accuracy": robust,
      "robust_accuracy_per_seed": [robust] * 3,
      "train_accuracy": 1.0,
      "num_params": 100.0,
      "spikes_per_inference": 10.0,
      "synaptic_ops_per_inference": 1e3,
      "accuracy_pgd": rng.random((3, 3)).tolist(),
      "pgd_accuracy": 0.5,
    }
    for family, strengths in dgn_phases.perturbation_grid(config).items():
      result[f"accuracy_{family}"] = np.full((3, len(strengths)), robust).tolist()
    return result

  results = {name: fake(0.9, 0.5 if "lif" in name else 0.8) for name in arms}
  results["dgn"] |= {
    "variance_conductance_scales": [0.0, 1.0],
    "variance_dgn_formula": [1.0, 0.5],
    "variance_dgn_ito": [1.0, 0.52],
    "variance_dgn_simulated": [1.01, 0.51],
    "variance_lif_formula": 1.0,
    "variance_lif_simulated": 1.01,
    "variance_formula_max_relative_error": 0.02,
    "variance_ito_max_relative_error": 0.02,
  }
  report = dgn_study.report(config, results)
  assert [row["arm"] for row in report.rows] == list(arms)
  assert report.summary["robust_gain_dgn_over_lif"] == pytest.approx(0.3)
  assert report.summary["dgn_above_lif_in_every_condition"] is True
  assert "dgn_snn_study" in report.figures
  assert math.isclose(report.summary["spike_ratio_dgn_over_lif"], 1.0)
