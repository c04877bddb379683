"""A workaround both W2S pipelines (`regression.py`, `classification.py`) share for the shared loop on
CPU."""

from __future__ import annotations

import jax


def runtime_barrier(tree, rng):
  """`tree` unchanged but tied to the phase's runtime `rng`. Data closed over `init` are HLO
  constants; without this, XLA constant-folds whole fits at compile time in its slow evaluator
  (minutes for E2's pseudolabels)."""
  return jax.lax.optimization_barrier((tree, rng))[0]
