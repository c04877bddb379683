"""The frontdoor method through the shared loop: one small simulation, its results, and bad fields."""

import math

import jax
import pytest

from configs import frontdoor as frontdoor_config
from experiments import loop
from methods import frontdoor


def tiny_config():
  config = frontdoor_config.get_config()
  config.data.n = 600
  config.replications = 2
  return config


def test_simulation_reports_every_learner(tmp_path):
  results = loop.run(tiny_config(), str(tmp_path)).results
  for key in ("rmse_dr", "rmse_r", "rmse_plugin", "ate_dr", "ate_true", "rmse_dr_stderr"):
    assert math.isfinite(results[key]), key
  assert 0.0 < results["ate_true"] < 1.4  # tau(C) = 1.4 x a difference of probabilities, positive
  assert results["rmse_dr"] > 0 and results["rmse_r"] > 0 and results["rmse_plugin"] > 0


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("data.dgp", "iv", "config.data.dgp: must be one of"),
    ("data.n", 50, "config.data.n: needs at least 100"),
  ],
)
def test_bad_fields_are_named(tmp_path, field, value, message):
  config = tiny_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(loop.ConfigError, match=message):
    loop.run(config, str(tmp_path))


@pytest.mark.slow
def test_replications_vmap_and_perturbation_hurts_the_plugin_most(tmp_path):
  """One vmap over replications; at delta = 1 the plug-in degrades more than FD-DR (paper)."""
  config = tiny_config()
  config.data.n, config.replications = 1000, 3
  clean = frontdoor.summarise(frontdoor.replications(config, jax.random.key(0)))
  config.delta = 1.0
  slow = frontdoor.summarise(frontdoor.replications(config, jax.random.key(0)))
  assert slow["rmse_dr/replications"].shape == (3,)
  assert slow["rmse_backdoor"] == pytest.approx(clean["rmse_backdoor"])  # its nuisances unperturbed
  assert slow["rmse_plugin"] - clean["rmse_plugin"] > slow["rmse_dr"] - clean["rmse_dr"]
  assert slow["ate_backdoor"] < 0 < slow["ate_true"]


def test_loglog_slope_recovers_a_power_law():
  sizes = (1000, 2000, 4000, 8000)
  arms = [{"rmse_dr/replications": [(1.0 + 0.1 * r) * n**-0.5 for r in range(3)]} for n in sizes]
  slope, half_width = frontdoor.loglog_slope(sizes, arms, "dr")
  assert slope == pytest.approx(-0.5, abs=1e-6) and half_width < 1e-6


def _fake_results(config):
  results = {}
  for _, _, name, fields in frontdoor._grid_arms(config):
    n = fields["data__n"]
    arm = {"ate_true": 0.34, "ate_naive": -1.1}
    for i, method in enumerate(frontdoor.LEARNERS):
      arm[f"rmse_{method}"], arm[f"rmse_{method}_stderr"] = (i + 1) * n**-0.4, 0.01
      arm[f"ate_{method}"] = 0.3
      arm[f"rmse_{method}/replications"] = [
        (i + 1 + 0.1 * r) * n**-0.4 for r in range(config.replications)
      ]
    results[name] = arm
  return results


def test_study_arms_share_grid_points_and_report():
  config = frontdoor_config.get_config("study")
  config.study.external = ()
  names = [name for name, _ in frontdoor.study_arms(config)]
  assert len(names) == len(set(names))
  grid_points = len(frontdoor._grid_arms(config))
  assert len(names) < grid_points  # delta = 0, alpha_u = 0 and n = study.n points run once
  report = frontdoor.report(config, _fake_results(config))
  assert len(report.rows) == grid_points
  assert report.summary["slope_n_dr"] == pytest.approx(-0.4, abs=1e-6)
  assert "frontdoor_study" in report.figures
  assert report.rows[0]["rmse_dr"].count("±") == 1


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("delta", -0.5, "config.delta: must be >= 0"),
    ("external", ("causalml",), "config.external: unknown baselines"),
  ],
)
def test_bad_top_level_fields_are_named(tmp_path, field, value, message):
  config = tiny_config()
  config[field] = value
  with pytest.raises(loop.ConfigError, match=message):
    loop.run(config, str(tmp_path))


@pytest.mark.slow
def test_external_baselines_and_parity(tmp_path):
  for module in ("econml", "doubleml", "fd_cate"):
    pytest.importorskip(module)
  config = tiny_config()
  config.data.n, config.replications, config.external = 800, 1, ("econml", "doubleml", "fdcate")
  results = loop.run(config, str(tmp_path)).results
  assert results["econml_ate"] < 0 and results["doubleml_ate"] < 0  # back-door: wrong sign
  assert results["parity_dr_correlation"] > 0 and results["parity_dr_speed_ratio"] > 0
