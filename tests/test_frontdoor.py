"""Tests of the front-door learners (`core/causal/frontdoor.py`) and their DGPs."""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.causal import backdoor
from core.causal import frontdoor as cf
from core.causal import nuisance as nz
from core.data import frontdoor as fd

N = 2_000  # One row count everywhere, so every program compiles once.
NUM_REPLICATIONS = 8  # Oracle checks pool 8 × 2000 rows.
NUM_FEATURES = 64  # Random Fourier features of the fitted learners (256 by default), for speed.


def _rmse(estimate, truth) -> float:
  return float(np.sqrt(np.mean((np.asarray(estimate) - np.asarray(truth)) ** 2)))


def _concat(trees):
  return jax.tree.map(lambda *leaves: jnp.concatenate(leaves), *trees)


class Pooled(NamedTuple):
  """Replications of the main DGP stacked row-wise, with their oracle nuisances."""

  c: jax.Array
  x: jax.Array
  z: jax.Array
  y: jax.Array
  tau: jax.Array
  cache: nz.NuisanceCache


def _pooled(alpha_u: float) -> Pooled:
  samples = [
    fd.simulate_main(jax.random.key(i), N, alpha_u=alpha_u) for i in range(NUM_REPLICATIONS)
  ]
  caches = [fd.oracle_nuisances(s.params, s.c) for s in samples]
  c, x, z, y, tau = (_concat([getattr(s, f) for s in samples]) for f in ("c", "x", "z", "y", "tau"))
  return Pooled(c, x.astype(jnp.float32), z.astype(jnp.float32), y, tau, _concat(caches))


@pytest.fixture(scope="module")
def pooled():
  return _pooled(alpha_u=0.0)


@pytest.fixture(scope="module")
def fit_sample():
  return fd.simulate_main(jax.random.key(100), N)


@pytest.fixture(scope="module")
def learners(fit_sample):
  s = fit_sample
  make = lambda method: cf.FrontDoorLearner(method, seed=3, num_rff_features=NUM_FEATURES)
  return {method: make(method).fit(s.c, s.x, s.z, s.y) for method in cf._METHODS}


_psi = jax.jit(cf.dr_pseudo_outcome)


# ----------------------------------------------------------------------------------------------
# DGPs and oracle nuisances.
# ----------------------------------------------------------------------------------------------


def test_simulate_main_shapes_dtypes_determinism(fit_sample):
  again = fd.simulate_main(jax.random.key(100), N)
  chex.assert_shape([fit_sample.c], (N, 10))
  chex.assert_shape([fit_sample.x, fit_sample.z, fit_sample.y, fit_sample.tau], (N,))
  chex.assert_type([fit_sample.x, fit_sample.z], jnp.int32)
  chex.assert_type([fit_sample.c, fit_sample.y, fit_sample.tau], jnp.float32)
  chex.assert_trees_all_equal(fit_sample, again)
  assert not np.array_equal(fit_sample.y, fd.simulate_main(jax.random.key(101), N).y)


def test_main_dgp_has_the_simpson_paradox(pooled):
  x = np.asarray(pooled.x, bool).reshape(NUM_REPLICATIONS, N)
  y = np.asarray(pooled.y).reshape(NUM_REPLICATIONS, N)
  naive = [y[i][x[i]].mean() - y[i][~x[i]].mean() for i in range(NUM_REPLICATIONS)]
  assert max(naive) < 0 < float(pooled.tau.min())


def test_oracle_b_times_gamma_is_tau(pooled):
  """Thm 2 with binary Z: b(C)·γ_g(C) = τ(C) from the true nuisances (atol 1e-6)."""
  cache = pooled.cache
  b = cache.q1[:, 1] - cache.q1[:, 0]
  g = cache.m[:, 1] - cache.m[:, 0]
  gamma = cache.e1 * g[:, 1] + (1 - cache.e1) * g[:, 0]
  np.testing.assert_allclose(b * gamma, pooled.tau, atol=1e-6)
  np.testing.assert_allclose(cf.plugin_effect(cache), pooled.tau, atol=1e-6)


def test_mediator_confounding_breaks_the_frontdoor_functional():
  s = fd.simulate_main(jax.random.key(2), N, alpha_u=1.0)
  cache = fd.oracle_nuisances(s.params, s.c)
  assert float(jnp.mean(jnp.abs(cf.plugin_effect(cache) - s.tau))) > 0.02


def test_weak_overlap_dgp():
  s = fd.simulate_weak_overlap(jax.random.key(3), N, kappa_e=10.0, kappa_q=10.0)
  cache = fd.oracle_nuisances(s.params, s.c)
  np.testing.assert_allclose(cache.q1[:, 1] - cache.q1[:, 0], s.tau, atol=1e-5)
  assert float(jnp.mean((cache.e1 < 0.05) | (cache.e1 > 0.95))) > 0.1


def test_perturbation_moves_numerators_only(fit_sample):
  cache = fd.oracle_nuisances(fit_sample.params, fit_sample.c)
  out = fd.perturb_nuisances(cache, jax.random.key(0), 1.0, N)
  for name in ("m_y", "m_z", "e1_denom", "q1_denom"):
    np.testing.assert_array_equal(getattr(out, name), getattr(cache, name))
  shift = out.m - cache.m
  assert abs(float(shift.mean()) - N**-0.25) < 0.02
  assert abs(float(shift.var()) - N**-0.25) < 0.02
  assert np.float32(1e-6) <= out.q1.min() and out.q1.max() <= np.float32(1 - 1e-6)


# ----------------------------------------------------------------------------------------------
# FD-DR pseudo-outcome: exactness, unbiasedness, double robustness, floors.
# ----------------------------------------------------------------------------------------------


def _author_psi(cache, x, z, y, floor):
  """NumPy transcription of the pseudo-outcome in the author's `tau_fd_dr_oof`."""
  cache = jax.tree.map(np.asarray, cache)
  e1, q11, q10 = (np.clip(v, 1e-6, 1 - 1e-6) for v in (cache.e1, cache.q1[:, 1], cache.q1[:, 0]))
  q1_xc = np.where(x == 1, q11, q10)
  e1_den = np.clip(cache.e1_denom, floor, 1 - floor)
  q1_xc_den = np.clip(
    np.where(x == 1, cache.q1_denom[:, 1], cache.q1_denom[:, 0]), floor, 1 - floor
  )
  m = cache.m
  m_zx = m[np.arange(len(x)), z.astype(int), x.astype(int)]
  r_me_1 = m[:, 1, 1] * e1 + m[:, 1, 0] * (1 - e1)
  r_me_0 = m[:, 0, 1] * e1 + m[:, 0, 0] * (1 - e1)
  r_me_z = np.where(z == 1, r_me_1, r_me_0)
  nu_meq = r_me_1 * q1_xc + r_me_0 * (1 - q1_xc)
  m_z1_x, m_z0_x = (
    np.where(x == 1, m[:, 1, 1], m[:, 1, 0]),
    np.where(x == 1, m[:, 0, 1], m[:, 0, 0]),
  )
  qz_den = np.where(z == 1, q1_xc_den, 1 - q1_xc_den)
  ex_den = np.where(x == 1, e1_den, 1 - e1_den)
  phis = []
  for q1_bar, x_bar in ((q11, 1), (q10, 0)):
    xi = np.where(z == 1, q1_bar, 1 - q1_bar) / qz_den
    pi = (x == x_bar) / ex_den
    phis.append(xi * (y - m_zx) + pi * (r_me_z - nu_meq) + m_z1_x * q1_bar + m_z0_x * (1 - q1_bar))
  return phis[0] - phis[1]


def test_pseudo_outcome_matches_author_formula_with_extreme_probabilities():
  rng = np.random.default_rng(0)
  prob = lambda *shape: np.clip(rng.uniform(-0.01, 1.01, shape), 0, 1).astype(np.float32)
  e1, q1 = prob(N), prob(N, 2)
  m = rng.normal(size=(N, 2, 2)).astype(np.float32)
  cache = nz.NuisanceCache(e1, q1, m, np.zeros((N, 2), np.float32), np.zeros(N), e1, q1)
  x, z = (rng.integers(0, 2, N).astype(np.float32) for _ in range(2))
  y = rng.normal(size=N).astype(np.float32)
  for floor in (0.05, 0.2):
    psi = _psi(cf.stabilise(cache, floor), x, z, y)
    np.testing.assert_allclose(psi, _author_psi(cache, x, z, y, floor), rtol=1e-4, atol=1e-4)


def test_stabilise_floors_denominators_only():
  p = jnp.asarray([0.0, 0.01, 0.5, 0.99, 1.0])
  table = jnp.stack([p, p[::-1]], 1)
  cache = nz.NuisanceCache(p, table, jnp.zeros((5, 2, 2)), jnp.zeros((5, 2)), p, p, table)
  out = cf.stabilise(cache, 0.05)
  np.testing.assert_allclose(out.e1, jnp.clip(p, 1e-6, 1 - 1e-6))
  np.testing.assert_allclose(out.q1, jnp.clip(table, 1e-6, 1 - 1e-6))
  np.testing.assert_allclose(out.m_z, jnp.clip(p, 1e-6, 1 - 1e-6))
  np.testing.assert_allclose(out.e1_denom, jnp.clip(p, 0.05, 0.95))
  np.testing.assert_allclose(out.q1_denom, jnp.clip(table, 0.05, 0.95))


def test_oracle_pseudo_outcome_mean_within_3_se(pooled):
  psi = _psi(cf.stabilise(pooled.cache, 1e-3), pooled.x, pooled.z, pooled.y)
  se = float(psi.std()) / np.sqrt(psi.shape[0])
  assert abs(float(psi.mean() - pooled.tau.mean())) < 3 * se


def test_oracle_pseudo_g_mean_is_gamma():
  """Lemma 3: E[ζ | C] = γ_g(C); with α_u > 0 so that g(1, C) ≠ g(0, C)."""
  data = _pooled(alpha_u=0.5)
  cache = data.cache
  g = cache.m[:, 1] - cache.m[:, 0]
  zeta = cf.pseudo_g(g[:, 1], g[:, 0], cache.e1, data.x)
  gamma = cache.e1 * g[:, 1] + (1 - cache.e1) * g[:, 0]
  assert float(jnp.std(g[:, 1] - g[:, 0])) > 0.01
  se = float(jnp.std(zeta - gamma)) / np.sqrt(zeta.shape[0])
  assert abs(float(jnp.mean(zeta - gamma))) < 3 * se


def _perturbed(cache, c, m_size=0.0, e_size=0.0, q_size=0.0):
  """Nuisance errors: m shifted by a function of (z, x, C); e and q shifted on the logit scale."""
  m_error = m_size * (1.0 + jnp.arange(2.0)[None, :, None] + 0.5 * c[:, :1, None])
  e1 = jax.nn.sigmoid(jax.scipy.special.logit(cache.e1) + e_size)
  q1 = jax.nn.sigmoid(jax.scipy.special.logit(cache.q1) + q_size * (1 + c[:, 1:2]))
  return cache._replace(m=cache.m + m_error, e1=e1, e1_denom=e1, q1=q1, q1_denom=q1)


def _expected_psi(cache, truth):
  """E[ψ(cache) | C] under the true law `truth`: ψ is linear in Y, so average over (x, z) cells."""
  total = 0.0
  for x in (0, 1):
    for z in (0, 1):
      prob = jnp.where(x == 1, truth.e1, 1 - truth.e1) * jnp.where(
        z == 1, truth.q1[:, x], 1 - truth.q1[:, x]
      )
      cell = jnp.full_like(truth.e1, x), jnp.full_like(truth.e1, z), truth.m[:, z, x]
      total = total + prob * _psi(cache, *cell)
  return total


def test_double_robustness(pooled):
  """Lemma 2: the bias E[ψ̂ − ψ | C] vanishes if q is right or (m, e) are; else a product."""
  truth = cf.stabilise(pooled.cache, 1e-3)
  data = pooled.x, pooled.z, pooled.y
  psi = _psi(truth, *data)
  root_n = np.sqrt(psi.shape[0])

  def bias(**sizes):
    cache = cf.stabilise(_perturbed(truth, pooled.c, **sizes), 1e-3)
    exact = jnp.mean(_expected_psi(cache, truth) - _expected_psi(truth, truth))
    diff = _psi(cache, *data) - psi
    return float(exact), float(diff.mean()), float(diff.std()) / root_n

  for sizes in (dict(m_size=0.5), dict(e_size=0.5), dict(m_size=0.5, e_size=0.5), dict(q_size=0.5)):
    exact, measured, se = bias(**sizes)
    assert abs(exact) < 1e-4, sizes
    assert abs(measured) < 3 * se, sizes
  exact, measured, se = bias(m_size=0.5, q_size=0.5)
  assert abs(exact) > 0.05 and abs(measured - exact) < 3 * se
  assert abs(bias(m_size=1.0, q_size=0.5)[0] - 2 * exact) < 1e-3  # Linear in the m error.
  assert abs(bias(m_size=0.5, q_size=0.05)[0]) < 0.15 * abs(exact)  # ~Linear in the q error.


# ----------------------------------------------------------------------------------------------
# Folds (2-fold FD-DR, 3-way FD-R).
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "num_folds"), [(11, 2), (11, 3), (11, 5), (N, 2), (N, 3)])
def test_folds_partition_the_rows(n, num_folds):
  folds = cf.fold_assignment(jax.random.key(n), n, num_folds)
  masks = np.asarray(cf.fold_masks(folds, num_folds))
  np.testing.assert_array_equal(masks.sum(0), np.ones(n))
  sizes = masks.sum(1)
  assert sizes.max() - sizes.min() <= 1
  np.testing.assert_array_equal(folds, cf.fold_assignment(jax.random.key(n), n, num_folds))


def test_three_way_roles():
  roles = cf.three_way_roles(swap_average=True)
  assert all(sorted(role) == [0, 1, 2] for role in roles.tolist())
  np.testing.assert_array_equal(np.bincount(roles[:, 2]), [2, 2, 2])
  np.testing.assert_array_equal(cf.three_way_roles(swap_average=False), roles[::2])


# ----------------------------------------------------------------------------------------------
# Estimators.
# ----------------------------------------------------------------------------------------------


def test_fd_r_with_oracle_nuisances_recovers_tau(fit_sample):
  """Oracle nuisances need no sample splitting, so every role's stages use all rows."""
  config = cf.FrontDoorConfig(method="r", num_folds=3, num_rff_features=NUM_FEATURES)
  cache = fd.oracle_nuisances(fit_sample.params, fit_sample.c)
  caches = jax.tree.map(lambda leaf: jnp.stack([leaf] * 3), cache)
  c, x, z, y = fit_sample.c, fit_sample.x, fit_sample.z, fit_sample.y
  x, z = x.astype(jnp.float32), z.astype(jnp.float32)
  everything = jnp.ones((3, N))
  key = jax.random.key(1)
  _, tau, _, ate = cf.fit_stages(c, x, z, y, jnp.ones(N), everything, caches, key, config, 0.0)
  assert _rmse(tau, fit_sample.tau) < 0.25
  assert abs(float(ate - fit_sample.tau.mean())) < 0.2


def test_end_to_end_rmse(learners, fit_sample):
  front_door = {m: learner for m, learner in learners.items() if m != "backdoor"}
  rmse = {m: _rmse(learner.oof_effect(), fit_sample.tau) for m, learner in front_door.items()}
  assert max(rmse.values()) < 0.4, rmse
  assert rmse["dr"] < 2.5 * rmse["plugin"] and rmse["r"] < 1.6 * rmse["plugin"], rmse
  for learner in front_door.values():
    assert abs(learner.ate() - float(fit_sample.tau.mean())) < 0.25


def test_backdoor_baseline_gets_the_sign_wrong(learners, fit_sample):
  """Adjusting for C alone recovers the U-confounded contrast: negative, while τ(C) > 0."""
  x, y = (jnp.asarray(v, jnp.float32) for v in (fit_sample.x, fit_sample.y))
  naive = float(backdoor.difference_in_means(x, y, jnp.ones_like(y)))
  assert float(fit_sample.tau.min()) > 0
  assert learners["backdoor"].ate() < 0 and naive < 0
  assert _rmse(learners["backdoor"].oof_effect(), fit_sample.tau) > 0.5


def test_backdoor_pseudo_outcome_is_unbiased_without_hidden_confounding():
  """With U out of X's equation, C is a valid back-door set and AIPW recovers the effect."""
  key_c, key_x, key_y = jax.random.split(jax.random.key(5), 3)
  n = 20_000
  c = jax.random.normal(key_c, (n, 2))
  e1 = jax.nn.sigmoid(c[:, 0])
  x = jax.random.bernoulli(key_x, e1).astype(jnp.float32)
  mean = lambda arm: c[:, 1] + arm * (1.0 + c[:, 0])  # τ(C) = 1 + C_0
  y = mean(x) + jax.random.normal(key_y, (n,))
  cache = nz.NuisanceCache(
    e1, jnp.zeros((n, 2)), jnp.zeros((n, 2, 2)), jnp.stack([mean(0.0), mean(1.0)], 1),
    jnp.zeros(n), e1, jnp.zeros((n, 2)),
  )  # fmt: skip
  psi = backdoor.aipw_pseudo_outcome(cache, x, y)
  chex.assert_shape(psi, (n,))
  standard_error = float(jnp.std(psi)) / np.sqrt(n)
  assert abs(float(jnp.mean(psi)) - 1.0) < 3 * standard_error


def test_methods_sharing_nuisances_equal_their_single_fits(fit_sample):
  s = fit_sample
  configs = [cf.FrontDoorConfig(method=m, num_rff_features=NUM_FEATURES) for m in ("dr", "plugin")]
  key, folds = jax.random.key(7), cf.fold_assignment(jax.random.key(8), N, 2)
  shared = cf.fit_frontdoor_methods(s.c, s.x, s.z, s.y, jnp.ones(N), {2: folds}, key, configs)
  for config, fit in zip(configs, shared, strict=True):
    single = cf.fit_frontdoor(s.c, s.x, s.z, s.y, jnp.ones(N), folds, key, config)
    np.testing.assert_allclose(fit.tau_oof, single.tau_oof, rtol=1e-5, atol=1e-5)


def test_learner_outputs_and_intervals(learners, fit_sample):
  learner = learners["dr"]
  query = fit_sample.c[:50]
  effect = learner.effect(query)
  chex.assert_shape(effect, (50,))
  chex.assert_tree_all_finite(effect)
  assert effect.dtype == np.float32 and learner.oof_effect().shape == (N,)
  low, high = learner.effect_interval(query, alpha=0.1, num_bootstrap=8)
  chex.assert_shape([low, high], (50,))
  assert np.all(low <= high) and np.all(high - low > 0)
  ate_low, ate_high = learner.ate_interval(alpha=0.1, num_bootstrap=8)
  assert ate_low < ate_high and ate_high - ate_low < 1.0


def test_effect_at_new_points_is_the_fold_average(learners, fit_sample):
  for method, learner in learners.items():
    if method == "backdoor":
      continue
    effect = learner.effect(fit_sample.c[:50])
    assert _rmse(effect, fit_sample.tau[:50]) < 0.35


@pytest.mark.slow
def test_mlp_nuisances_learn_the_oracle_and_feed_fd_dr(fit_sample):
  s = fit_sample
  oracle = fd.oracle_nuisances(s.params, s.c)
  e_hat = nz.predict_mlp_probability(
    nz.fit_mlp(s.c, s.x.astype(jnp.float32), jnp.ones(N), jax.random.key(0), loss="logistic"),
    s.c,
  )
  chex.assert_shape(e_hat, (N,))
  assert _rmse(e_hat, oracle.e1) < 0.05
  learner = cf.FrontDoorLearner("dr", seed=3, nuisance_learner="mlp").fit(s.c, s.x, s.z, s.y)
  assert _rmse(learner.oof_effect(), s.tau) < 0.4
  assert isinstance(learner._fitted().nuisances.e, nz.MLPParams)


# ----------------------------------------------------------------------------------------------
# Input validation.
# ----------------------------------------------------------------------------------------------


def _good(n=40, seed=0):
  rng = np.random.default_rng(seed)
  x = np.tile([0, 1], n // 2)
  z = np.tile([0, 0, 1, 1], n // 4)
  return rng.normal(size=(n, 3)), x, z, rng.normal(size=n)


def _replace(index, value):
  args = list(_good())
  args[index] = value(args[index]) if callable(value) else value
  return args


@pytest.mark.parametrize(
  ("args", "field", "message"),
  [
    (_replace(1, lambda x: np.where(x == 1, 2, 0)), "X", "binary"),
    (_replace(2, lambda z: z * 0.5), "Z", "binary"),
    (_replace(3, lambda y: np.where(np.arange(40) == 3, np.nan, y)), "Y", "NaN or inf"),
    (_replace(0, lambda c: np.where(np.arange(40)[:, None] == 5, np.inf, c)), "C", "NaN or inf"),
    (_replace(3, lambda y: y[:-1]), "Y", "rows"),
    (_replace(0, lambda c: c[:, 0]), "C", "2-D"),
    (_replace(1, lambda x: x[:, None]), "X", "1-D"),
    (_replace(0, lambda c: np.full(c.shape, "a")), "C", "numeric"),
    (_replace(1, np.ones(40)), "X", "no overlap"),
    (_replace(2, lambda z: np.where(np.tile([0, 1], 20) == 1, 1, z)), "Z", "no overlap"),
  ],
)
def test_bad_input_is_rejected_naming_the_field(args, field, message):
  with pytest.raises(ValueError, match=rf"^{field}\b.*{message}"):
    cf.FrontDoorLearner(method="dr").fit(*args)


def test_no_overlap_within_a_fold_is_rejected():
  c, x, z, y = _good(n=N)
  folds = np.asarray(cf.fold_assignment(jax.random.split(jax.random.key(0))[0], N, 3))
  x = np.where(folds == 0, 1, x)
  with pytest.raises(ValueError, match=r"^X: no overlap in the nuisance training set of fold 1"):
    cf.FrontDoorLearner(method="r", seed=0).fit(c, x, z, y)


@pytest.mark.parametrize(
  ("kwargs", "field"),
  [
    (dict(method="ipw"), "method"),
    (dict(final_stage="forest"), "final_stage"),
    (dict(method="r", folds=2), "folds"),
    (dict(folds=1), "folds"),
    (dict(floor=0.5), "floor"),
    (dict(g_solver="newton"), "g_solver"),
    (dict(nuisance_learner="forest"), "nuisance_learner"),
    (dict(bogus=1), "options"),
  ],
)
def test_bad_options_are_rejected(kwargs, field):
  with pytest.raises(ValueError, match=rf"^{field}\b"):
    cf.FrontDoorLearner(**kwargs)


def test_unfitted_learner_and_bad_query(learners, fit_sample):
  with pytest.raises(RuntimeError, match="not fitted"):
    cf.FrontDoorLearner().ate()
  with pytest.raises(ValueError, match=r"^C must have 10 columns"):
    learners["dr"].effect(fit_sample.c[:, :3])
  with pytest.raises(ValueError, match=r"^C must be 2-D"):
    learners["dr"].effect(fit_sample.c[0])


# ----------------------------------------------------------------------------------------------
# Slow: options and batching (pytest -m slow).
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
  "options",
  [
    dict(method="dr", pooled_final=True),
    dict(method="dr", final_stage="rff", folds=3),
    dict(method="r", g_solver="ratio", final_stage="rff"),
    dict(method="r", r_final="regress_b_zeta", swap_average=False, b_learner="linear"),
    dict(method="r", nuisance_learner="mlp"),
  ],
)
def test_options_fit(options, fit_sample):
  s = fit_sample
  learner = cf.FrontDoorLearner(seed=3, num_rff_features=NUM_FEATURES, **options)
  assert _rmse(learner.fit(s.c, s.x, s.z, s.y).oof_effect(), s.tau) < 0.4


@pytest.mark.slow
def test_plugin_interval_refits_the_nuisances(learners, fit_sample):
  low, high = learners["plugin"].effect_interval(fit_sample.c[:50], num_bootstrap=3)
  assert np.all(low < high)


@pytest.mark.slow
def test_fit_vmaps_over_replications_and_delta():
  n, config = 300, cf.FrontDoorConfig(method="dr", num_rff_features=16)

  def replicate(key, delta):
    key_data, key_folds, key_fit = jax.random.split(key, 3)
    s = fd.simulate_main(key_data, n)
    folds = cf.fold_assignment(key_folds, n, config.num_folds)
    fit = cf.fit_frontdoor(s.c, s.x, s.z, s.y, jnp.ones(n), folds, key_fit, config, delta)
    return fit.tau_oof, fit.ate

  keys = jax.random.split(jax.random.key(0), 3)
  tau, ate = jax.jit(jax.vmap(replicate))(keys, jnp.asarray([0.0, 0.5, 1.0]))
  chex.assert_shape(tau, (3, n))
  chex.assert_shape(ate, (3,))
  chex.assert_tree_all_finite((tau, ate))
  single = replicate(keys[1], 0.5)[0]
  np.testing.assert_allclose(tau[1], single, rtol=1e-3, atol=1e-3)
