"""The official-code drivers' own logic (experiments/peers/), without the official checkouts or the
`peers` extra: reading released settings from a notebook, the notebook's selection rule, the
synthesis statistics."""

import json

import numpy as np
import pytest

from experiments.peers import regmix


def _notebook(tmp_path, cells):
  folder = tmp_path / "regression_fitting"
  folder.mkdir()
  book = {"cells": [{"cell_type": "code", "source": [c]} for c in cells]}
  (folder / "regression.ipynb").write_text(json.dumps(book))
  return str(tmp_path)


def test_hyper_params_are_read_from_the_notebook_cell_that_defines_them(tmp_path):
  repo = _notebook(
    tmp_path,
    [
      "import lightgbm as lgb",
      "hyper_params = {\n 'objective': 'regression',\n 'num_iterations': 7,\n}\n\n"
      "np.random.seed(42)\nfor i in range(3):\n  raise RuntimeError('the fitting loop must not run')",
    ],
  )
  assert regmix.official_hyper_params(repo) == {"objective": "regression", "num_iterations": 7}


def test_a_checkout_without_the_notebook_is_named(tmp_path):
  with pytest.raises(SystemExit, match="regression.ipynb not found"):
    regmix.official_hyper_params(str(tmp_path))


def test_notebook_selection_averages_the_best_predicted_draws():
  prior = np.array([0.5, 0.3, 0.2])
  point = np.array([0.1, 0.1, 0.8])
  chosen = regmix.notebook_selection(lambda x: np.abs(x - point).sum(-1), prior, seed=0)
  assert np.abs(chosen - point).sum() < 0.15  # the 128 of 100,000 draws nearest the point
  assert np.isclose(chosen.sum(), 1.0)


def test_synthesis_stats_count_draws_above_the_usage_bound():
  prior = np.array([0.9, 0.1])
  mixtures = np.array([[0.9, 0.1], [0.0, 1.0], [0.5, 0.5]])
  stats = regmix.synthesis_stats(mixtures, prior, max_usage=4.0)
  assert stats["above_usage_bound"] == pytest.approx(2 / 3)  # 1.0 and 0.5 exceed 4 x 0.1
  assert stats["mean_l1_to_prior"] == pytest.approx((0 + 1.8 + 0.8) / 3)
