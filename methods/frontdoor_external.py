"""Optional external baselines for the front-door study: econml, doubleml and the author's fd-cate.

Install with `pip install -e ".[frontdoor]"`; nothing else in the codebase imports these packages.
All run on one simulated data set (numpy arrays) of `methods/frontdoor.py`:

- `econml`: `LinearDML` of X -> Y given C (a back-door CATE learner, linear in C). Spec §6: it
  adjusts for C only, so U makes it recover the confounded, wrong-signed contrast.
- `doubleml`: `DoubleMLIRM` ATE of X -> Y given C (back-door, same failure).
- `fdcate`: parity with fd-cate 0.1.1 (`FDCATE(method="fd-dr" | "fd-r")`, XGBoost nuisances) against
  this codebase's FD-DR and FD-R (logistic/RFF nuisances, linear final stage as the author) on the
  same arrays: RMSE of each against the true tau, the RMSE between the two out-of-fold estimates,
  their correlation, and the wall-time ratio fd-cate / ours (medians of 3 fits after a first
  one, which compiles ours). The
  nuisance learners differ, so the estimates agree only up to nuisance error.

Nuisance models of the back-door baselines are scikit-learn's histogram gradient boosting (fast
on 2 cores) and logistic regression; every result key starts with the baseline's name.
"""

from __future__ import annotations

import importlib

import numpy as np

from core.causal.frontdoor import FrontDoorLearner
from kernels.timing import median_seconds

_PACKAGES = {"econml": "econml", "doubleml": "doubleml", "fdcate": "fd_cate"}
_PARITY_METHODS = {"dr": "fd-dr", "r": "fd-r"}
_TIMING_REPEATS = 3


def _require(name: str):
  try:
    return importlib.import_module(_PACKAGES[name])
  except ImportError as error:
    raise ImportError(
      f"config.external: {name!r} needs the optional extra: pip install -e '.[frontdoor]'"
    ) from error


def _arrays(sample):
  return tuple(
    np.asarray(v, np.float64) for v in (sample.c, sample.x, sample.z, sample.y, sample.tau)
  )


def _rmse(a, b) -> float:
  return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def econml_backdoor(c, x, y, tau, seed: int) -> dict[str, float]:
  _require("econml")
  from econml.dml import LinearDML
  from sklearn.ensemble import HistGradientBoostingRegressor
  from sklearn.linear_model import LogisticRegression

  model = LinearDML(
    model_y=HistGradientBoostingRegressor(max_iter=100, random_state=seed),
    model_t=LogisticRegression(max_iter=1000),
    discrete_treatment=True,
    cv=2,
    random_state=seed,
  ).fit(y, x, X=c)
  effect = model.effect(c)
  return {"econml_rmse": _rmse(effect, tau), "econml_ate": float(np.mean(effect))}


def doubleml_backdoor(c, x, y, seed: int) -> dict[str, float]:
  _require("doubleml")
  import doubleml
  from sklearn.ensemble import HistGradientBoostingRegressor
  from sklearn.linear_model import LogisticRegression

  np.random.seed(seed)  # doubleml draws its sample splits from numpy's global generator
  data = doubleml.DoubleMLData.from_arrays(c, y, x)
  model = doubleml.DoubleMLIRM(
    data,
    ml_g=HistGradientBoostingRegressor(max_iter=100, random_state=seed),
    ml_m=LogisticRegression(max_iter=1000),
    n_folds=2,
  ).fit()
  return {"doubleml_ate": float(model.coef[0]), "doubleml_ate_se": float(model.se[0])}


def _parity(fd_cate, ours_name: str, c, x, z, y, tau, seed: int) -> dict[str, float]:
  """One learner of this codebase against its fd-cate counterpart on the same arrays."""
  learner = FrontDoorLearner(method=ours_name, final_stage="linear", seed=seed)
  fit_ours = lambda: learner.fit(c, x, z, y).oof_effect()  # numpy: waits for the device
  estimator = fd_cate.FDCATE(method=_PARITY_METHODS[ours_name], random_state=seed, n_jobs=1)
  fit_theirs = lambda: estimator.fit(c, y, t=x, m=z)
  ours_seconds = median_seconds(fit_ours, repeats=_TIMING_REPEATS)
  theirs_seconds = median_seconds(fit_theirs, repeats=_TIMING_REPEATS)
  ours, theirs_model = fit_ours(), fit_theirs()
  theirs = np.asarray(theirs_model.tau_train_)
  prefix = f"parity_{ours_name}"
  return {
    f"{prefix}_rmse_ours": _rmse(ours, tau),
    f"{prefix}_rmse_fdcate": _rmse(theirs, tau),
    f"{prefix}_rmse_between": _rmse(ours, theirs),
    f"{prefix}_correlation": float(np.corrcoef(ours, theirs)[0, 1]),
    f"{prefix}_ate_ours": float(np.mean(ours)),
    f"{prefix}_ate_fdcate": float(theirs_model.ate_),
    f"{prefix}_speed_ratio": theirs_seconds / ours_seconds,
  }


def fdcate_parity(c, x, z, y, tau, seed: int) -> dict[str, float]:
  """fd-cate vs this codebase on the same arrays, for FD-DR and FD-R."""
  fd_cate = _require("fdcate")
  out = {}
  for ours_name in _PARITY_METHODS:
    out.update(_parity(fd_cate, ours_name, c, x, z, y, tau, seed))
  return out


def run(config, sample) -> dict[str, float]:
  """Runs each baseline named in `config.external` on `sample`."""
  c, x, z, y, tau = _arrays(sample)
  out = {}
  if "econml" in config.external:
    out.update(econml_backdoor(c, x, y, tau, config.seed))
  if "doubleml" in config.external:
    out.update(doubleml_backdoor(c, x, y, config.seed))
  if "fdcate" in config.external:
    out.update(fdcate_parity(c, x, z, y, tau, config.seed))
  return out


def available() -> tuple[str, ...]:
  """The baselines whose packages import here."""
  found = []
  for name, module in _PACKAGES.items():
    try:
      importlib.import_module(module)
    except ImportError:
      continue
    found.append(name)
  return tuple(found)
