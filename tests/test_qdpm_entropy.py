"""QDPM's bound on data of known entropy: the sources, the Bayes denoisers, the estimators.

A valid bound `B` satisfies `E[B(x)] >= H` on data of entropy `H`; the Bayes denoiser attains it
(I-MMSE), so on the i.i.d. source its analytic-C bound must sit within noise of the exact entropy.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import quant_diffusion as qdpm_config
from core import quant_diffusion as qd
from core.data import entropy_sources as es
from methods import quant_diffusion
from methods.base import ConfigError


def _key(seed):
  """A PRNG key of XLA's RngBitGenerator, which compiles faster than threefry on CPU."""
  return jax.random.key(seed, impl="unsafe_rbg")


def _tiny_sources():
  return [es.make_source(name, 3, 2, 0.8, stay=0.4) for name in es.NAMES]


@pytest.mark.parametrize("source", _tiny_sources(), ids=es.NAMES)
def test_entropy_and_code_lengths_match_enumeration_and_sampling(source):
  sequences = np.asarray(list(itertools.product(range(3), repeat=source.dim)))
  nll = source.nll_bits_per_dim(sequences)
  probs = 2.0 ** (-nll * source.dim)
  assert probs.sum() == pytest.approx(1.0, abs=1e-12)
  assert source.entropy_bits_per_dim == pytest.approx(np.sum(probs * nll), abs=1e-12)
  draws = source.sample(40000, seed=3)
  index = np.ravel_multi_index(draws.T, (3,) * source.dim)
  frequencies = np.bincount(index, minlength=len(probs)) / len(draws)
  assert np.max(np.abs(frequencies - probs)) < 0.01


def test_markov_source_is_stationary_and_the_snake_joins_neighbours():
  source = es.make_source("markov_levels", 17, 8, 2.0, stay=0.5)
  np.testing.assert_allclose(source.initial @ source.transition, source.initial, atol=1e-12)
  order = es.snake_order(8)
  rows, cols = np.divmod(order, 8)
  assert np.all(np.abs(np.diff(rows)) + np.abs(np.diff(cols)) == 1)
  flat = np.arange(64)[None]
  np.testing.assert_array_equal(es.chain_to_images(flat, 8).reshape(-1)[order], flat[0])
  with pytest.raises(ValueError, match=r"x: need \(N, 64\) levels in 0..16"):
    source.nll_bits_per_dim(np.full((2, 64), 17))


def _brute_force_posterior_mean(source, x, t):
  """`E[x_0 | x_t]` by enumerating every level sequence (tiny sources only)."""
  sequences = np.asarray(list(itertools.product(range(source.num_levels), repeat=source.dim)))
  log_prior = -source.nll_bits_per_dim(sequences) * source.dim * math.log(2.0)
  out = []
  for row, scale in zip(np.asarray(x, np.float64), np.asarray(t, np.float64), strict=True):
    log_w = log_prior - np.sum((sequences - row) ** 2, axis=1) / (2 * scale**2)
    w = np.exp(log_w - log_w.max())
    out.append(w @ sequences / w.sum())
  return np.asarray(out)


def test_bayes_denoiser_shifts_match_enumeration():
  grid = qd.Grid(3)
  x = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.2, (5, 4)), jnp.float32)
  t = jnp.asarray([0.2, 0.5, 1.0, 2.0, 6.0], jnp.float32)
  iid, markov = _tiny_sources()
  log_init = jnp.log(jnp.asarray(markov.initial, jnp.float32))
  log_trans = jnp.log(jnp.asarray(markov.transition, jnp.float32))
  log_probs = jnp.log(jnp.asarray(iid.initial, jnp.float32))
  shifts = jax.jit(
    lambda x, t: {
      "iid": qd.iid_prior_shift(x, t, log_probs, grid),
      "markov": qd.markov_prior_shift(x, t, log_init, log_trans, grid),
    }
  )(x, t)
  softround = np.asarray(qd.softround(x, t, grid))
  for name, source in (("iid", iid), ("markov", markov)):
    expected = _brute_force_posterior_mean(source, x, t) - softround
    np.testing.assert_allclose(np.asarray(shifts[name]), expected, atol=2e-6)


def _iid_setup(count=256):
  source = es.make_source("iid_levels", 17, 4, 2.0)
  x0 = source.sample(count, seed=1).astype(np.float32)
  log_probs = jnp.log(jnp.asarray(source.initial, jnp.float32))
  return source, jnp.asarray(x0), source.nll_bits_per_dim(x0), log_probs, qd.Grid(17)


def _gap(bound, nll):
  gap = np.asarray(bound, np.float64) - nll
  return gap.mean(), gap.std(ddof=1) / math.sqrt(len(gap))


def test_analytic_C_bound_of_the_bayes_denoiser_is_the_entropy_and_plain_C_reads_low():
  """The bound is a bound: on i.i.d. levels the closed-form denoiser's analytic-C bound is >= the
  entropy minus 3 s.e., and, since that denoiser attains the entropy, within 3 s.e. above it too;
  C importance-sampled in log t agrees with the analytic log2 K; plain Monte-Carlo C per image
  typically reads ~0.5 bits/dim low."""
  source, x0, nll, log_probs, grid = _iid_setup()

  def shift(x_t, t):
    return qd.iid_prior_shift(x_t, t, log_probs, grid)

  est = jax.jit(lambda x, key: qd.log_t_estimates(shift, x, key, grid, 64))(x0, _key(0))
  gap, gap_se = _gap(est["bound"], nll)
  assert gap >= -3 * gap_se, (gap, gap_se)
  assert gap <= 3 * gap_se, (gap, gap_se)
  c = np.asarray(est["C"], np.float64)
  assert abs(c.mean() - math.log2(17)) <= 3 * c.std(ddof=1) / math.sqrt(len(c))
  plain = np.asarray(qd.monte_carlo_C_bits_per_dim(x0, _key(1), grid, 256))
  assert np.median(plain) < math.log2(17) - 0.3
  assert source.entropy_bits_per_dim == pytest.approx(3.0468, abs=1e-4)


def test_analytic_C_bound_of_a_bounded_near_bayes_denoiser_is_above_the_entropy():
  """The estimator the method reports (stratified u, analytic C) with `delta_hat` = the Bayes
  denoiser's clipped to +-100: at least the entropy minus 3 s.e., and close to it (not vacuous)."""
  _, x0, nll, log_probs, grid = _iid_setup()

  def delta(x_t, t, u):
    shift = qd.iid_prior_shift(x_t, t, log_probs, grid)
    return jnp.clip(shift / jnp.maximum(u, 1e-30)[:, None], -100.0, 100.0)

  bound, _ = jax.jit(lambda x, key: qd.qdpm_bound_bits_per_dim(delta, x, key, grid, 64))(
    x0, _key(2)
  )
  gap, gap_se = _gap(bound, nll)
  assert -3 * gap_se <= gap < 0.1, (gap, gap_se)


def test_entropy_study_arms_and_validation():
  config = qdpm_config.get_config("study_entropy")
  arms = dict(quant_diffusion.study_arms(config))
  assert sorted(arms) == sorted(f"{s}_{k}" for s in es.NAMES for k in quant_diffusion.KINDS)
  assert arms["markov_levels_vdm"].data.name == "markov_levels"
  assert arms["markov_levels_vdm"].model.kind == "vdm"
  for field, value, message in (
    ("level_std", 0.0, "config.data.level_std: must be positive"),
    ("markov_stay", 1.0, r"config.data.markov_stay: need \[0, 1\)"),
    ("num_levels", 300, "config.data.num_levels: need 2..256"),
  ):
    bad = arms["iid_levels_qdpm"].copy_and_resolve_references()
    bad.data[field] = value
    with pytest.raises(ConfigError, match=message):
      quant_diffusion.validate(bad)


def _fake_arm_results(kind, entropy, gap):
  r = {"entropy_bpd": entropy, "log2_num_levels": math.log2(17)}
  for _, _, prefix in quant_diffusion.ENTROPY_ESTIMATES:
    r.update(
      {
        f"{prefix}_mean": entropy + gap,
        f"{prefix}_stderr": 0.01,
        f"{prefix}_gap": gap,
        f"{prefix}_gap_stderr": 0.01,
        f"{prefix}_repeats_gap": [gap, -0.5],
        f"{prefix}_repeats_gap_stderr": [0.01, 0.01],
        "importance_sampled_C_mean": 4.08,
        "importance_sampled_C_stderr": 0.01,
      }
    )
  return r


def test_entropy_report_flags_estimates_below_the_entropy():
  config = qdpm_config.get_config("study_entropy")
  results = {
    f"{s}_{k}": _fake_arm_results(
      k, 3.0 if s == "iid_levels" else 2.0, -0.1 if k == "vdm" else 0.05
    )
    for s in es.NAMES
    for k in quant_diffusion.KINDS
  }
  report = quant_diffusion.entropy_report(config, results)
  assert len(report.rows) == len(es.NAMES) * len(quant_diffusion.ENTROPY_ESTIMATES)
  flagged = {
    (row["source"], row["estimate"]) for row in report.rows if row["below_entropy_beyond_3se"]
  }
  assert flagged == {(s, "VDM-style discrete (t_min = 0.2)") for s in es.NAMES}
  mc = [row for row in report.rows if row["estimate"] == "QDPM, plain Monte-Carlo C"]
  assert [row["repeats_below_entropy_beyond_3se"] for row in mc] == ["1/2", "1/2"]
  assert "entropy_gaps" in report.figures
