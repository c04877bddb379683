"""Dynamic Gated Neuron: neuron maths, variance formulas, data and perturbations, readers, the method."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import dgn_snn as dgn_config
from core import attacks
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


@pytest.mark.slow
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


STABILITY = dict(
  w=jnp.array([0.8, 0.5, -0.3]),
  c=jnp.array([0.5, 0.3, 0.2]),
  mu=jnp.array([1.0, 0.8, 0.5]),
  sigma=jnp.array([0.3, 0.2, 0.1]),
  g_l=1.0,
)


def _neuron(key, c, dt, steps=6000, chains=512, burn_in=1000):
  s = STABILITY
  run = jax.jit(
    lambda key, c: stability.neuron_moments(
      key, s["w"], c, s["mu"], s["sigma"], s["g_l"], dt, steps, chains, burn_in
    )
  )
  return {k: float(v) for k, v in run(key, c).items()}


def test_network_neuron_has_the_exact_variance_of_its_update_where_phi_does_not_clip():
  """At dt = 0.25 the clip never binds for C = 0.8 C0: the neuron's mean is V_ss and its variance
  the exact variance of the unclipped update, which lies above Eq. 13 by the O(dt) term."""
  s, dt = STABILITY, 0.25
  c = 0.8 * s["c"]
  args = (s["w"], c, s["mu"], s["sigma"], s["g_l"])
  out = _neuron(jax.random.key(0), c, dt)
  assert out["clipped_fraction"] < 1e-3
  assert out["mean"] == pytest.approx(float(stability.steady_state(*args[:3], s["g_l"])), rel=0.01)
  exact = float(stability.discrete_variance(*args, dt))
  assert out["variance"] == pytest.approx(exact, rel=0.04)
  assert exact > 1.15 * float(stability.dgn_variance(*args))
  lif = _neuron(jax.random.key(1), jnp.zeros(3), dt)
  assert lif["variance"] == pytest.approx(
    float(stability.discrete_variance(s["w"], jnp.zeros(3), s["mu"], s["sigma"], 1.0, dt)), rel=0.04
  )
  assert out["variance"] < lif["variance"] / 3  # leak scaling and noise compensation


def test_clipped_decay_takes_the_neuron_away_from_the_theory_at_small_dt():
  """At dt = 2e-3 the unclipped decay exceeds 1 in ~40% of the steps for C = 1.5 C0; the clip adds
  leak, so the mean falls far below V_ss, while LIF (no conductance noise) stays on Eq. 14."""
  s = STABILITY
  c = 1.5 * s["c"]
  out = _neuron(jax.random.key(2), c, 2e-3, steps=4000, chains=256, burn_in=1000)
  v_ss = float(stability.steady_state(s["w"], c, s["mu"], s["g_l"]))
  assert out["clipped_fraction"] > 0.3 and out["mean"] < 0.7 * v_ss
  lif = _neuron(jax.random.key(3), jnp.zeros(3), 2e-3, steps=4000, chains=256, burn_in=1000)
  assert lif["clipped_fraction"] == 0.0
  assert lif["mean"] == pytest.approx(float(s["w"] @ s["mu"]), rel=0.02)


def test_variance_formulas_are_limits_of_each_other():
  s = STABILITY
  args = (s["w"], 2.0 * s["c"], s["mu"], s["sigma"], s["g_l"])
  ito = float(stability.ito_variance(*args))
  assert float(stability.discrete_variance(*args, 1e-6)) == pytest.approx(ito, rel=1e-5)
  small = (s["w"], 2.0 * s["c"], s["mu"], 1e-3 * s["sigma"], s["g_l"])  # sigma_C -> 0
  assert float(stability.ito_variance(*small)) == pytest.approx(
    float(stability.dgn_variance(*small)), rel=1e-5
  )
  assert float(stability.dgn_variance(s["w"], jnp.zeros(3), s["mu"], s["sigma"], 1.0)) == (
    pytest.approx(float(stability.lif_variance(s["w"], s["sigma"], 1.0)), rel=1e-6)
  )


# ---------------------------------------------------------------------------------------------------
# Attacks
# ---------------------------------------------------------------------------------------------------


def test_attacks_on_a_linear_loss_reach_the_corner_of_the_ball():
  """For `loss = a . x` the best L-inf move is `eps sign(a)`, clipped to the box: FGSM in one step,
  BIM in ceil(1 / scale) steps, PGD from any random start within the ball."""
  a = jnp.array([1.0, -2.0, 0.5, -0.1])
  x = jnp.array([0.5, 0.5, 0.98, 0.0])
  loss = lambda xa: jnp.dot(a, xa)
  eps = 0.1
  corner = jnp.clip(x + eps * jnp.sign(a), 0.0, 1.0)
  chex.assert_trees_all_close(attacks.fgsm(loss, x, eps), corner)
  chex.assert_trees_all_close(attacks.bim(loss, x, eps, 4, 0.3 * eps), corner, atol=1e-6)
  chex.assert_trees_all_close(attacks.pgd(loss, x, eps, 10, 0.25 * eps, jax.random.key(0)), corner)
  partial = attacks.bim(loss, x, eps, 2, 0.3 * eps)  # two steps of 0.3 eps: not yet at the corner
  chex.assert_trees_all_close(partial, jnp.clip(x + 0.6 * eps * jnp.sign(a), 0.0, 1.0), atol=1e-6)
  with pytest.raises(ValueError, match="attack must be one of"):
    attacks.attack("cw", loss, x, eps, 1, eps, None)


def test_iterative_attacks_hurt_a_trained_network_at_least_as_much_as_fgsm():
  net = network("dgn")
  params = spiking.init_network(jax.random.key(11), net)
  x = random_spikes(12, (16, 30, 12), rate=0.2)
  y = jnp.argmax(spiking.apply_network(params, x, net).logits, -1)  # the net is right everywhere

  def loss_of(xa):
    logits = spiking.apply_network(params, xa, net).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()

  # one compiled program per attack (eagerly, each scan of the network compiled on its own)
  attacked_loss = jax.jit(
    lambda x, key, name: loss_of(attacks.attack(name, loss_of, x, 0.1, 5, 0.05, key)),
    static_argnames="name",
  )
  losses = {name: float(attacked_loss(x, jax.random.key(13), name)) for name in attacks.ATTACKS}
  clean = float(loss_of(x))
  assert losses["fgsm"] > clean and losses["bim"] >= losses["fgsm"] * 0.999
  assert losses["pgd"] > clean


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
  # spikes move in time only: a channel silent in an example stays silent after jitter
  np.testing.assert_array_equal(np.asarray(jittered.sum(1))[np.asarray(x.sum(1)) == 0], 0.0)
  # one spike per channel at t = 50: it moves by round(2 N(0, 1)), std sqrt(4 + 1/12)
  single = jnp.zeros((64, 100, 64)).at[:, 50, :].set(1.0)
  moved = jnp.argmax(spike_data.jitter(key, single, 2.0), axis=1) - 50
  assert float(jnp.mean(moved)) == pytest.approx(0.0, abs=0.05)
  assert float(jnp.std(moved)) == pytest.approx(math.sqrt(4 + 1 / 12), rel=0.03)
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
    attack_epsilons=(0.1,),
    attack_steps=2,
    chunk=12,
    attack_examples=8,
    num_train_examples=16,
  )
  config.stability.update(num_steps=400, burn_in=100, num_chains=8, dts=(1e-3, 0.2))
  config.loop.update(log_every=1, checkpoint_every=2)
  for field, value in changes.items():
    section, name = field.split(".") if "." in field else (None, field)
    (config[section] if section else config)[name] = value
  return config


def test_default_run_reports_the_keys_and_compiles_each_step_once(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  r = summary.results
  keys = ("clean_accuracy", "robust_accuracy", "robust_accuracy_lif", "jitter_accuracy")
  keys += ("fgsm_accuracy", "bim_accuracy", "pgd_accuracy", "adversarial_accuracy")
  for key in keys:
    assert 0.0 <= r[key] <= 1.0, key
  random = np.concatenate([r[f"accuracy_{f}"] for f in ("additive", "subtractive", "mixed")], 1)
  assert r["robust_accuracy"] == pytest.approx(float(np.mean(random)))  # jitter kept apart
  assert np.shape(r["accuracy_additive"]) == (2, 1) and len(r["clean_accuracy_per_seed"]) == 2
  assert r["num_params"] == 2 * r["num_params_lif"]
  assert r["spikes_per_inference"] >= 0 and r["synaptic_ops_per_inference"] >= 0
  assert np.shape(r["variance_neuron"]) == (2, 5) and r["variance_lif_formula"] > 0
  assert summary.step_traces == {"train": 1, "train_lif": 1, "stability": 0}


@pytest.mark.slow  # resume is the loop's (test_loop.py); by default the smoke run above
def test_interrupted_run_resumes_to_the_same_results(tmp_path):
  config = tiny_config(compare_lif=False, **{"eval.attack_epsilons": ()})
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
      "jitter_accuracy": clean,
      "jitter_accuracy_per_seed": [clean] * 3,
      "adversarial_accuracy": robust / 2,
      "adversarial_accuracy_per_seed": [robust / 2] * 3,
    }
    for attack in config.eval.attacks:
      result[f"accuracy_{attack}"] = rng.random((3, 3)).tolist()
      result[f"{attack}_accuracy"] = 0.5
    for family, strengths in dgn_phases.perturbation_grid(config).items():
      result[f"accuracy_{family}"] = np.full((3, len(strengths)), robust).tolist()
    return result

  results = {name: fake(0.9, 0.5 if "lif" in name else 0.8) for name in arms}
  results["dgn"] |= {
    "variance_dts": [1e-3, 0.2],
    "variance_conductance_scales": [0.0, 1.0],
    "variance_dgn_formula": [1.0, 0.5],
    "variance_dgn_ito": [1.0, 0.52],
    "variance_neuron": [[1.01, 0.9], [1.1, 0.6]],
    "variance_discrete": [[1.0, 0.52], [1.1, 0.6]],
    "variance_lif_formula": 1.0,
    "variance_unclipped_cells": 3.0,
    "variance_discrete_max_relative_error": 0.02,
  }
  report = dgn_study.report(config, results)
  assert [row["arm"] for row in report.rows] == list(arms)
  assert report.summary["robust_gain_dgn_over_lif"] == pytest.approx(0.3)
  assert report.summary["adversarial_gain_dgn_over_lif"] == pytest.approx(0.15)
  assert report.rows[1]["jitter %"] != report.rows[1]["robust %"]
  assert report.summary["dgn_above_lif_in_every_condition"] is True
  assert "dgn_snn_study" in report.figures
  assert math.isclose(report.summary["spike_ratio_dgn_over_lif"], 1.0)
