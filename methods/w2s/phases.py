"""The phases of a W2S run: `config.task` picks the E1 regression pipeline (`regression.py`) or the
classification pipeline of E2, digits and tfds (`classification.py`); see the package docstring."""

from __future__ import annotations

import ml_collections

from methods.base import Phase
from methods.w2s import classification, regression


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  if config.task == "regression":
    return regression.regression_phases(config)
  return classification.classification_phases(config)
