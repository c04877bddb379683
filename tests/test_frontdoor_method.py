"""The frontdoor method through the shared loop: one small simulation, its results, and bad fields."""

import math

import pytest

from configs import frontdoor as frontdoor_config
from experiments import loop


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
