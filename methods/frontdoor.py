"""Front-door HTE: "Debiased Front-Door Learners for Heterogeneous Effects" (ICLR 2026).

Claim: the debiased FD-DR and FD-R learners estimate the heterogeneous front-door effect tau(C) with
lower error than the plug-in FD-PI, most of all when the nuisances converge slowly; FD-R is the most
stable under weak overlap.

One evaluate-only phase, `simulate` (an estimator pipeline: no optimiser steps): for each of
`config.replications` seeds it simulates the spec's DGP (`core/data/frontdoor.py`), cross-fits the
plug-in, FD-DR and FD-R learners of `core/causal/frontdoor.py` on the same arrays, and scores the
out-of-fold tau(C_i) against the truth. Results are means over replications with their standard
errors, plus the DR ATE against the true average effect.

Still to come (see the issue): the study (RMSE against n with the log-log slope, against the nuisance
perturbation delta, overlap and front-door violation, back-door baselines, parity with fd-cate).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from core.causal.frontdoor import FrontDoorLearner
from core.data import frontdoor as dgp
from methods.base import Method, Phase, require, require_choice, require_positive_int

LEARNERS = ("plugin", "dr", "r")


def simulate(config, key):
  d = config.data
  if d.dgp == "main":
    return dgp.simulate_main(key, d.n, d.dim, alpha_u=d.alpha_u)
  return dgp.simulate_weak_overlap(key, d.n, d.dim, kappa_e=d.kappa, kappa_q=d.kappa)


def replication(config, key) -> dict[str, float]:
  """Every learner on one simulated data set: RMSE of out-of-fold tau(C_i), and the ATEs."""
  sample = simulate(config, key)
  arrays = [np.asarray(a) for a in (sample.c, sample.x, sample.z, sample.y)]
  tau = np.asarray(sample.tau)
  out = {"ate_true": float(tau.mean())}
  for method in LEARNERS:
    learner = FrontDoorLearner(
      method=method, final_stage=config.final_stage, floor=config.floor, seed=config.seed
    ).fit(*arrays)
    out[f"rmse_{method}"] = float(np.sqrt(np.mean((learner.oof_effect() - tau) ** 2)))
    out[f"ate_{method}"] = learner.ate()
  return out


def evaluate(config, rng) -> dict[str, float]:
  runs = [replication(config, jax.random.fold_in(rng, r)) for r in range(config.replications)]
  results = {}
  for name in runs[0]:
    values = np.array([run[name] for run in runs])
    results[name] = float(values.mean())
    if name.startswith("rmse_") and len(values) > 1:
      results[f"{name}_stderr"] = float(values.std(ddof=1) / math.sqrt(len(values)))
  return results


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  return [
    Phase(
      name="simulate",
      num_steps=0,
      init=lambda rng, inputs: {"replications": jnp.arange(config.replications)},
      evaluate=lambda state, rng, inputs: evaluate(config, rng),
    )
  ]


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "data.dgp", ("main", "weak_overlap"))
  require_choice(config, "final_stage", ("linear", "rff"))
  for field in ("data.n", "data.dim", "replications"):
    require_positive_int(config, field)
  require(
    config.data.n >= 100,
    "data.n",
    f"needs at least 100 rows for 3-way cross-fitting, got {config.data.n}",
  )
  require(0.0 < config.floor < 0.5, "floor", f"must lie in (0, 0.5), got {config.floor}")
  require(config.data.alpha_u >= 0.0, "data.alpha_u", "must be >= 0")


METHOD = Method(name="frontdoor", phases=phases, validate=validate)
