"""The phases of a W2S run: `config.task` picks the E1 regression pipeline (`regression.py`) or the
classification pipeline of E2, digits and tfds (`classification.py`); see the package docstring."""

from __future__ import annotations

import jax
import ml_collections

from methods.base import Phase


def runtime_barrier(tree, rng):
  """`tree` unchanged but tied to the phase's runtime `rng`. Data closed over `init` are HLO
  constants; without this, XLA constant-folds whole fits at compile time in its slow evaluator
  (minutes for E2's pseudolabels)."""
  return jax.lax.optimization_barrier((tree, rng))[0]


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  # imported here: both pipelines import `runtime_barrier` from this module
  from methods.w2s import classification, regression

  if config.task == "regression":
    return regression.regression_phases(config)
  return classification.classification_phases(config)
