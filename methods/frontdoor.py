"""Front-door HTE: "Debiased Front-Door Learners for Heterogeneous Effects" (ICLR 2026, arXiv 2509.22531;
official code github.com/yonghanjung/FD-CATE).

Claim: the debiased FD-DR and FD-R learners estimate the heterogeneous front-door effect tau(C) with
lower error than the plug-in FD-PI, most of all when the nuisances converge slowly (the gap widens
with the perturbation delta); FD-R is the most stable under weak overlap; back-door adjustment for C
alone gets the effect wrong.

One evaluate-only phase, `simulate` (an estimator pipeline: no optimiser steps). For each of
`config.replications` seeds it simulates the author's DGP (`core/data/frontdoor.py`), cross-fits the
plug-in, FD-DR, FD-R and the naive back-door DR-learner (`core/causal`) on the same arrays, with the
author's nuisance perturbation `config.delta` (`core/data/frontdoor.py`), and scores the out-of-fold
tau(C_i) against the truth. The replications are one `jax.vmap` over seeds. Results are means over
replications with standard errors, each replication's RMSEs (`rmse_<learner>/replications`, for slopes
with intervals), and the ATEs. The plug-in, FD-DR and back-door learners share their 2-fold nuisances.

`config.external` names optional packages run on the first replication's arrays (the last section
below; `pip install -e ".[frontdoor]"`): econml and doubleml back-door learners, and the author's
fd-cate for a parity check (difference in tau estimates, speed ratio).

The study (`configs/frontdoor.py:study`) sweeps n (at delta = 0 and at delta = 1, the n^-1/4 rate),
delta, the overlap strength kappa of the weak-overlap DGP (at both deltas), and the front-door
violation alpha_u.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from core.causal import backdoor
from core.causal import frontdoor as fd
from core.data import frontdoor as dgp
from kernels.timing import median_seconds
from methods.base import (
  Method,
  Phase,
  Report,
  figure_grid,
  interval_cell,
  require,
  require_choice,
  require_positive_int,
  with_changes,
)

LEARNERS = ("plugin", "dr", "r", "backdoor")
EXTERNAL = ("econml", "doubleml", "fdcate")
EXTRA_INSTALL = "pip install -e '.[frontdoor]'"  # the optional extra the external baselines need
PER_REPLICATION = "/replications"  # suffix of the (R,) array of a metric's per-replication values


def simulate(config, key) -> dgp.FrontDoorSample:
  d = config.data
  if d.dgp == "main":
    return dgp.simulate_main(key, d.n, d.dim, alpha_u=d.alpha_u)
  return dgp.simulate_weak_overlap(key, d.n, d.dim, kappa_e=d.kappa, kappa_q=d.kappa)


def learner_config(config, method: str) -> fd.FrontDoorConfig:
  return fd.FrontDoorConfig(
    method=method,
    final_stage=config.final_stage,
    num_folds=3 if method == "r" else 2,
    floor=config.floor,
    nuisance_learner=config.nuisance_learner,
  )


def _rmse(estimate: jax.Array, truth: jax.Array) -> jax.Array:
  return jnp.sqrt(jnp.mean((estimate - truth) ** 2))


def replication_key(rng: jax.Array, r) -> jax.Array:
  return jax.random.fold_in(rng, r)


def replication(config, key: jax.Array) -> dict[str, jax.Array]:
  """Every learner on one simulated data set: RMSE of out-of-fold tau(C_i) and the ATEs (pure)."""
  key_data, key_folds, key_fit = jax.random.split(key, 3)
  sample = simulate(config, key_data)
  c, x, z, y = (jnp.asarray(v, jnp.float32) for v in (sample.c, sample.x, sample.z, sample.y))
  weights = jnp.ones_like(y)
  out = {"ate_true": jnp.mean(sample.tau), "ate_naive": backdoor.difference_in_means(x, y, weights)}
  configs = [learner_config(config, method) for method in LEARNERS]
  folds = {
    k: fd.fold_assignment(key_folds, y.shape[0], k) for k in {cf.num_folds for cf in configs}
  }
  fits = fd.fit_frontdoor_methods(c, x, z, y, weights, folds, key_fit, configs, config.delta)
  for method, fit in zip(LEARNERS, fits, strict=True):
    out[f"rmse_{method}"] = _rmse(fit.tau_oof, sample.tau)
    out[f"ate_{method}"] = fit.ate
  return out


def replications(config, rng: jax.Array) -> dict[str, np.ndarray]:
  """`replication` vmapped over `config.replications` seeds: each value has a leading (R,) axis."""
  keys = jax.vmap(lambda r: replication_key(rng, r))(jnp.arange(config.replications))
  return jax.tree.map(np.asarray, jax.vmap(lambda key: replication(config, key))(keys))


def summarise(runs: Mapping[str, np.ndarray]) -> dict[str, float | np.ndarray]:
  """Means over replications, standard errors of the RMSEs, and each replication's RMSEs."""
  results = {}
  for name, values in runs.items():
    results[name] = float(values.mean())
    if name.startswith("rmse_"):
      if values.size > 1:
        results[f"{name}_stderr"] = float(values.std(ddof=1) / math.sqrt(values.size))
      results[f"{name}{PER_REPLICATION}"] = values
  return results


def evaluate(config, rng) -> dict[str, float]:
  results = summarise(replications(config, rng))
  if config.external:
    key_data = jax.random.split(replication_key(rng, 0), 3)[0]  # as in `replication`
    results.update(run_external(config, simulate(config, key_data)))
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
  require_choice(config, "nuisance_learner", ("parametric", "mlp"))
  for field in ("data.n", "data.dim", "replications"):
    require_positive_int(config, field)
  require(
    config.data.n >= 100,
    "data.n",
    f"needs at least 100 rows for 3-way cross-fitting, got {config.data.n}",
  )
  require(0.0 < config.floor < 0.5, "floor", f"must lie in (0, 0.5), got {config.floor}")
  require(config.data.alpha_u >= 0.0, "data.alpha_u", "must be >= 0")
  require(config.data.kappa > 0.0, "data.kappa", f"must be > 0, got {config.data.kappa}")
  require(config.delta >= 0.0, "delta", f"must be >= 0, got {config.delta}")
  unknown = sorted(set(config.external) - set(EXTERNAL))
  require(not unknown, "external", f"unknown baselines {unknown}; choose from {EXTERNAL}")
  if config.external:
    missing = sorted(set(config.external) - set(available_external()))
    require(not missing, "external", f"{missing} need the optional extra: {EXTRA_INSTALL}")


# ---------------------------------------------------------------------------------------------------
# Study: RMSE against n, delta, overlap and front-door violation.
# ---------------------------------------------------------------------------------------------------


def _grid_arms(config):
  """(sweep, value, arm name, fields) for every grid point; shared points run once."""
  study = config.study
  points = [("n", n, dict(data__n=n, delta=0.0)) for n in study.sizes]
  points += [("n_slow", n, dict(data__n=n, delta=study.slow_delta)) for n in study.sizes]
  points += [("delta", v, dict(delta=v)) for v in study.deltas]
  for sweep, delta in (("kappa", 0.0), ("kappa_slow", study.slow_delta)):
    weak = dict(data__dgp="weak_overlap", delta=delta)
    points += [(sweep, v, dict(weak, data__kappa=v)) for v in study.kappas]
  points += [("alpha_u", v, dict(data__alpha_u=v, delta=0.0)) for v in study.alpha_us]
  grid = []
  for sweep, value, fields in points:
    fields = {"data__n": study.n, **fields}
    grid.append((sweep, value, _arm_name(fields), fields))
  return grid


def _arm_name(fields) -> str:
  """Equal configurations get equal names, so a point shared by two sweeps runs once."""
  name = f"n{fields['data__n']}_delta{fields['delta']:g}"
  if fields.get("data__dgp") == "weak_overlap":
    name = f"weak{fields['data__kappa']:g}_{name}"
  if fields.get("data__alpha_u", 0.0) > 0:
    name += f"_alpha{fields['data__alpha_u']:g}"
  return name


def study_arms(config: ml_collections.ConfigDict):
  arms = {}
  for _, _, name, fields in _grid_arms(config):
    arms.setdefault(name, with_changes(config, **fields, external=()))
  if external := _external_baselines(config):
    arms["external"] = with_changes(config, data__n=config.study.n, delta=0.0, external=external)
  return list(arms.items())


def _skipped(config) -> list[str]:
  return sorted(set(config.study.external) - set(_external_baselines(config)))


def external_note(config) -> str:
  """The report's line on which optional baselines ran and how to enable the skipped ones."""
  ran = list(_external_baselines(config)) or "none"
  skipped = _skipped(config)
  return f"External baselines run: {ran}" + (
    f" (skipped: {skipped}; install them with {EXTRA_INSTALL})." if skipped else "."
  )


def _external_baselines(config) -> tuple[str, ...]:
  """The study's optional baselines whose packages are installed: a study skips the others (its
  notes say how to enable them); a run that names one in `config.external` fails validation."""
  return tuple(b for b in config.study.external if b in available_external())


def _interval(arm: Mapping[str, float], key: str) -> tuple[float, float]:
  """Mean and the 95% half-width 1.96 s.e. over replications."""
  return arm[key], 1.96 * arm.get(f"{key}_stderr", float("nan"))


def loglog_slope(sizes, arms, method: str) -> tuple[float, float]:
  """Slope of log RMSE on log n, fitted per replication: mean and 95% half-width."""
  log_n = np.log(np.asarray(sizes, float))
  log_rmse = np.log([np.asarray(arm[f"rmse_{method}{PER_REPLICATION}"]) for arm in arms])
  slopes = np.polyfit(log_n, log_rmse, 1)[0]  # one fit per replication (column)
  half = 1.96 * np.std(slopes, ddof=1) / np.sqrt(len(slopes)) if len(slopes) > 1 else float("nan")
  return float(np.mean(slopes)), float(half)


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  grid = _grid_arms(config)
  rows = []
  for sweep, value, name, _ in grid:
    row = {"sweep": sweep, "value": value, "arm": name}
    for method in LEARNERS:
      mean, half = _interval(results[name], f"rmse_{method}")
      row[f"rmse_{method}"] = interval_cell(mean, half)
    row["ate_true"] = results[name]["ate_true"]
    row["ate_dr"] = results[name]["ate_dr"]
    row["ate_backdoor"] = results[name]["ate_backdoor"]
    row["ate_naive"] = results[name]["ate_naive"]
    rows.append(row)
  summary = _summary(config, grid, results)
  if "external" in results:
    summary.update({k: v for k, v in results["external"].items() if _is_external_key(k)})
  return Report(
    rows=rows,
    summary=summary,
    figures={"frontdoor_study": _figure(config, grid, results)},
    notes=(
      "RMSE of out-of-fold tau(C_i): mean ± 1.96 s.e. over "
      f"{config.replications} replications; final stage {config.final_stage!r}. Sweeps: n at "
      f"delta = 0 ('n') and delta = {config.study.slow_delta:g} ('n_slow', nuisances at the "
      f"n^-1/4 rate); delta, weak-overlap kappa (at both deltas) and front-door violation alpha_u at n = "
      f"{config.study.n}. 'backdoor' is the naive DR-learner of X -> Y given C; ate_naive the "
      "unadjusted contrast. " + external_note(config)
    ),
  )


def _is_external_key(key: str) -> bool:
  return any(key.startswith(f"{name}_") for name in EXTERNAL) or key.startswith("parity_")


def _sweep(grid, sweep: str):
  return [(value, name) for s, value, name, _ in grid if s == sweep]


def _summary(config, grid, results) -> dict[str, float]:
  summary = {}
  for sweep in ("n", "n_slow"):
    points = _sweep(grid, sweep)
    arms = [results[name] for _, name in points]
    for method in LEARNERS[:3]:
      slope, half = loglog_slope([v for v, _ in points], arms, method)
      summary[f"slope_{sweep}_{method}"] = slope
      summary[f"slope_{sweep}_{method}_ci95"] = half
  deltas = _sweep(grid, "delta")
  low, high = results[deltas[0][1]], results[deltas[-1][1]]
  for method in LEARNERS[:3]:
    summary[f"rmse_growth_delta_{method}"] = high[f"rmse_{method}"] / low[f"rmse_{method}"]
  for sweep in ("kappa", "kappa_slow"):
    kappas = _sweep(grid, sweep)
    for method in LEARNERS[:3]:
      values = [results[name][f"rmse_{method}"] for _, name in kappas]
      summary[f"rmse_growth_{sweep}_{method}"] = values[-1] / values[0]
  base = results[deltas[0][1]]
  summary["ate_true"] = base["ate_true"]
  summary["ate_backdoor"] = base["ate_backdoor"]
  summary["ate_naive"] = base["ate_naive"]
  return summary


def _figure(config, grid, results):
  panels = [
    ("n", "n (delta = 0)", True),
    ("n_slow", f"n (delta = {config.study.slow_delta:g})", True),
    ("delta", f"delta (n = {config.study.n})", False),
    ("kappa", "weak-overlap kappa (delta = 0)", False),
    ("kappa_slow", f"weak-overlap kappa (delta = {config.study.slow_delta:g})", False),
    ("alpha_u", "front-door violation alpha_u", False),
  ]
  fig, axes = figure_grid(2, 3, figsize=(13, 7.5))
  axes = axes.ravel()
  for ax, (sweep, label, log) in zip(axes, panels, strict=True):
    points = _sweep(grid, sweep)
    values = [v for v, _ in points]
    for method in LEARNERS:
      means, halves = zip(
        *[_interval(results[name], f"rmse_{method}") for _, name in points], strict=True
      )
      ax.errorbar(values, means, yerr=halves, marker="o", capsize=3, label=method)
    if log:
      ax.set_xscale("log")
      ax.set_yscale("log")
      ax.set_xticks(values, [f"{v:g}" for v in values], minor=False)
      ax.minorticks_off()
    ax.set_xlabel(label)
    ax.set_ylabel("RMSE of tau(C)")
  axes[0].legend()
  fig.suptitle("Front-door learners: RMSE of the heterogeneous effect (95% intervals)")
  fig.tight_layout()
  return fig


# ---------------------------------------------------------------------------------------------------
# Optional external baselines (pip install -e ".[frontdoor]"); nothing else imports these packages.
# ---------------------------------------------------------------------------------------------------
# Each runs on one simulated data set (numpy arrays):
# - `econml`: `LinearDML` of X -> Y given C (a back-door CATE learner, linear in C). It adjusts
#   for C only, so U makes it recover the confounded, wrong-signed contrast.
# - `doubleml`: `DoubleMLIRM` ATE of X -> Y given C (back-door, same failure).
# - `fdcate`: parity with fd-cate 0.1.1 (`FDCATE(method="fd-dr" | "fd-r")`, XGBoost nuisances)
#   against this codebase's FD-DR and FD-R (linear final stage as the author) on the same arrays:
#   RMSE of each against the true tau, the RMSE between the two out-of-fold estimates, their
#   correlation, and the wall-time ratio fd-cate / ours (medians of 3 fits after a first one, which
#   compiles ours). The nuisance learners differ, so the estimates agree only to nuisance error.
# The back-door baselines' nuisance models are scikit-learn's histogram gradient boosting (fast on
# 2 cores) and logistic regression; every result key starts with the baseline's name.

_PACKAGES = {"econml": "econml", "doubleml": "doubleml", "fdcate": "fd_cate"}
_PARITY_METHODS = {"dr": "fd-dr", "r": "fd-r"}
_TIMING_REPEATS = 3


def _require(name: str):
  try:
    return importlib.import_module(_PACKAGES[name])
  except ImportError as error:
    raise ImportError(
      f"config.external: {name!r} needs the optional extra: {EXTRA_INSTALL}"
    ) from error


def _arrays(sample):
  return tuple(
    np.asarray(v, np.float64) for v in (sample.c, sample.x, sample.z, sample.y, sample.tau)
  )


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
  return {"econml_rmse": float(_rmse(effect, tau)), "econml_ate": float(np.mean(effect))}


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
  learner = fd.FrontDoorLearner(method=ours_name, final_stage="linear", seed=seed)
  fit_ours = lambda: learner.fit(c, x, z, y).oof_effect()  # numpy: waits for the device
  estimator = fd_cate.FDCATE(method=_PARITY_METHODS[ours_name], random_state=seed, n_jobs=1)
  fit_theirs = lambda: estimator.fit(c, y, t=x, m=z)
  ours_seconds = median_seconds(fit_ours, repeats=_TIMING_REPEATS)
  theirs_seconds = median_seconds(fit_theirs, repeats=_TIMING_REPEATS)
  ours, theirs_model = fit_ours(), fit_theirs()
  theirs = np.asarray(theirs_model.tau_train_)
  prefix = f"parity_{ours_name}"
  return {
    f"{prefix}_rmse_ours": float(_rmse(ours, tau)),
    f"{prefix}_rmse_fdcate": float(_rmse(theirs, tau)),
    f"{prefix}_rmse_between": float(_rmse(ours, theirs)),
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


def run_external(config, sample) -> dict[str, float]:
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


def available_external() -> tuple[str, ...]:
  """The baselines whose packages import here."""
  found = []
  for name, module in _PACKAGES.items():
    try:
      importlib.import_module(module)
    except ImportError:
      continue
    found.append(name)
  return tuple(found)


METHOD = Method(
  name="frontdoor", phases=phases, validate=validate, study_arms=study_arms, report=report
)
