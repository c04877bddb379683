"""Debiased front-door learners for heterogeneous effects: FD-PI, FD-DR and FD-R.

Paper: Y. Jung, "Debiased Front-Door Learners for Heterogeneous Effects" (ICLR 2026, arXiv 2509.22531).
Claim: with X → Z → Y and U confounding X and Y, the conditional effect τ(C) is learned at a
quasi-oracle rate by regressing a doubly robust pseudo-outcome (FD-DR, Thm 1) or by a two-stage
R-learner τ = b·γ_g (FD-R, Thm 2-3); the plug-in is first-order biased. The formulas below were checked
against the author's code, github.com/yonghanjung/FD-CATE, file `FDCATE.py`.

Map to the paper and the official code:
- `plugin_effect`: FD-PI, the identification formula with binary Z.
- `dr_pseudo_outcome`: FD-DR's φ_1 − φ_0 (Def. 2, Lemma 2), exactly as `tau_fd_dr_oof`.
- `fit_b_stage`, `fit_g_direct`, `fit_g_ratio`, `pseudo_g`: FD-R (Prop. 2, Thm 2, Lemma 3), as
  `tau_fd_r_3way_oof_smoothed`.
- `stabilise`: numerators clipped to [1e-6, 1 − 1e-6], denominators floored to [floor, 1 − floor].
- `fold_assignment`, `fold_masks`, `three_way_roles`: 2-fold / K-fold and 3-way cross-fitting.
- `fit_frontdoor` (two jitted programs: `fit_predict_nuisances` vmapped over folds, then
  `fit_stages`, which vmaps its regressions over folds or 3-way roles),
  `predict_effect`, `bootstrap_fits`, `percentile_interval`: the pipeline.
- `FrontDoorLearner`: the sklearn-style wrapper with input validation.
- method "backdoor": the naive back-door DR-learner (`core.causal.backdoor`) on the same folds,
  nuisances and final stage, as the baseline that adjusting for C alone gets wrong.

Choices where the paper is open:
- Folds are balanced (sizes differ by at most one); the author's 3-fold split gives the remainder
  to the last fold.
- FD-DR and FD-PI fit nuisances on the complement of each fold (2 folds: the other half, as the
  author); the FD-DR final regression is fit and predicted on its own held-out fold (author quirk;
  `pooled_final=True` fits one regression on all out-of-fold ψ instead, with about half the
  variance). `effect(C)` at new points averages the per-fold (per-role for FD-R) predictors.
- Nuisances: e, q and m_Z by logistic regression on C (q per treatment arm), m and m_Y by RFF ridge
  per treatment arm on (Z, C) and C; `nuisance_learner="mlp"` uses small MLPs for all five. The
  b-stage and the `ratio` g-stage use RFF ridge where the author uses XGBoost; the `direct` g-stage
  standardises C with its training fold's statistics (the author re-standardises each evaluation
  set).
- FD-R final stage: `r_final="b_times_gamma"` regresses ζ on C and returns b̂·γ̂ (paper, and the
  author's 3-way code); `"regress_b_zeta"` regresses b̂ζ on C (the author's 2-way code).
- ATE: the mean cross-fitted ψ for FD-DR and the back-door baseline (AIPW-type estimates), the
  mean out-of-fold τ̂ otherwise.
- Intervals: percentile intervals from a Bayesian bootstrap (Exp(1) row weights) with the folds
  and random features held fixed. FD-DR and FD-R refit their stages on the point fit's nuisances
  (their nuisance error is second order); FD-PI refits everything.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.causal import backdoor
from core.causal import nuisance as nz
from core.data import frontdoor as fd_data

PROB_EPS = 1e-6  # Numerator probabilities are clipped to [PROB_EPS, 1 − PROB_EPS] only.
B_STAGE_MIN_RESIDUAL = 1e-3  # |X − ê| below this is dropped from the b-stage (author).
G_STAGE_MIN_RESIDUAL = 1e-8  # |Z − q̂| below this is dropped from the ratio g-stage (author).
_MIN_ARM_ROWS = 2
_METHODS = ("dr", "r", "plugin", "backdoor")
_FINAL_STAGES = ("linear", "rff")
_G_SOLVERS = ("direct", "ratio")
_R_FINALS = ("b_times_gamma", "regress_b_zeta")
_NUISANCE_LEARNERS = ("parametric", "mlp")


@dataclasses.dataclass(frozen=True)
class FrontDoorConfig:
  """Static settings of one front-door fit (hashable, so it is a static jit argument)."""

  method: str = "dr"  # "dr" (FD-DR), "r" (FD-R), "plugin" (FD-PI) or the naive "backdoor" baseline.
  final_stage: str = "linear"  # "linear" (author parity) or "rff" regression of the target on C.
  num_folds: int = 2  # Cross-fitting folds: ≥ 2 for "dr"/"plugin", exactly 3 for "r".
  floor: float = 0.05  # Denominators e and q(Z|X,C) are floored to [floor, 1 − floor].
  g_solver: str = "direct"  # FD-R g-stage: "direct" linear ridge or "ratio" weighted RFF.
  r_final: str = "b_times_gamma"  # FD-R output: b̂·γ̂ (paper) or a regression of b̂ζ (code).
  swap_average: bool = True  # FD-R: also swap the nuisance and stage folds (6 fits, not 3).
  b_learner: str = "rff"  # FD-R b-stage regressor: "rff" or "linear".
  pooled_final: bool = False  # FD-DR: one final regression on all out-of-fold ψ (not per fold).
  nuisance_learner: str = "parametric"  # "parametric" (logistic + RFF ridge) or "mlp".
  num_rff_features: int = 256  # Random Fourier features of every RFF ridge.
  logistic_l2: float = 1e-3  # L2 penalty (mean-loss scale) of the logistic nuisances.
  linear_l2: float = 1e-6  # Ridge α (sum scale) of linear final stages (author: 1e-6).
  g_l2: float = 1e-4  # Ridge α (sum scale) of the direct g-stage (author: 1e-4).


class NuisanceModels(NamedTuple):
  """Fitted nuisance learners of one training set; `q`, `m`, `m_y` stack the arms x = 0, 1."""

  e: nz.LinearParams
  q: nz.LinearParams
  m: nz.RFFParams
  m_y: nz.RFFParams
  m_z: nz.LinearParams


class RStage(NamedTuple):
  """FD-R learners of one (nuisance, stage, final) fold role."""

  b: Any
  g: Any
  final: Any


class FrontDoorFit(NamedTuple):
  """A cross-fitted front-door fit; leading axes of `nuisances`/`stages` index folds/roles."""

  nuisances: NuisanceModels | None  # None in stage-only bootstrap replicates.
  caches: nz.NuisanceCache | None  # (K, n) nuisances at the training rows, before perturbation.
  stages: Any  # FD-DR: final regressors per fold; FD-R: RStage per role; FD-PI: None.
  tau_oof: jax.Array  # (n,) out-of-fold τ̂(C_i).
  target_oof: jax.Array  # (n,) the out-of-fold regression target: ψ, ζ or b̂ζ, or τ̂ for FD-PI.
  ate: jax.Array  # () weighted ATE estimate.


# ----------------------------------------------------------------------------------------------
# Cross-fitting folds.
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("n",))
def fold_assignment(key: jax.Array, n: int, num_folds: int) -> jax.Array:
  """A random balanced fold id in [0, num_folds) for each of `n` rows."""
  order = jax.random.permutation(key, n)
  return jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32) % num_folds)


def fold_masks(folds: jax.Array, num_folds: int) -> jax.Array:
  """(num_folds, n) 0/1 float masks; column sums are 1, so the folds partition the rows."""
  return (folds[None, :] == jnp.arange(num_folds)[:, None]).astype(jnp.float32)


def three_way_roles(swap_average: bool = True) -> np.ndarray:
  """(nuisance, stage, final) fold triples of FD-R's 3-way rotation, author's order.

  Each fold is the final fold once, or twice with the nuisance and stage folds swapped.
  """
  roles = [(0, 1, 2), (1, 0, 2), (1, 2, 0), (2, 1, 0), (2, 0, 1), (0, 2, 1)]
  return np.asarray(roles if swap_average else roles[::2], np.int32)


# ----------------------------------------------------------------------------------------------
# Nuisances.
# ----------------------------------------------------------------------------------------------


def _arm_weights(x: jax.Array, weights: jax.Array) -> jax.Array:
  """(2, n) weights restricted to X = 0 and X = 1."""
  return jnp.stack([1.0 - x, x]) * weights


def _with_column(value, c: jax.Array) -> jax.Array:
  """[value, C]: the mediator column of m's features (a zero column for m_Y's)."""
  return jnp.concatenate([jnp.broadcast_to(value, c.shape[:1])[:, None], c], 1)


def fit_nuisances(
  c, x, z, y, weights, key, num_rff_features: int = 256, logistic_l2: float = 1e-3,
  learner: str = "parametric",
) -> NuisanceModels:  # fmt: skip
  """Fits e, q, m_Z (classifiers on C) and m, m_Y (regressions per arm) on weighted rows.

  `learner="parametric"`: logistic regressions and RFF ridges; `"mlp"`: small MLPs for all five
  (`nuisance.fit_mlp`). The four classifier and the four regression fits each run as one vmapped
  call, which keeps the compiled program small; m_Y uses the features [0, C], equivalent to C.
  """
  arms = _arm_weights(x, weights)
  class_targets = jnp.stack([x, z, z, z])
  class_weights = jnp.stack([weights, weights, arms[0], arms[1]])
  zc, zero_c = _with_column(z, c), _with_column(0.0, c)
  features = jnp.stack([zc, zc, zero_c, zero_c])
  key_class, key_regression = jax.random.split(key)
  if learner == "mlp":
    classify = jax.vmap(lambda t, w, k: nz.fit_mlp(c, t, w, k, loss="logistic"))
    e_mz_q = classify(class_targets, class_weights, jax.random.split(key_class, 4))
    regress = jax.vmap(lambda f, w, k: nz.fit_mlp(f, y, w, k))
    m_my = regress(features, jnp.concatenate([arms, arms]), jax.random.split(key_regression, 4))
  else:
    fit_logistic = jax.vmap(nz.fit_logistic, (None, 0, 0, None))
    e_mz_q = fit_logistic(c, class_targets, class_weights, logistic_l2)
    fit_rff = jax.vmap(nz.fit_rff_ridge, (0, None, 0, 0, None))
    m_my = fit_rff(
      features, y, jnp.concatenate([arms, arms]), jax.random.split(key, 4), num_rff_features
    )
  pick = lambda tree, rows: jax.tree.map(lambda leaf: leaf[rows], tree)
  return NuisanceModels(
    e=pick(e_mz_q, 0), q=pick(e_mz_q, slice(2, 4)), m=pick(m_my, slice(0, 2)),
    m_y=pick(m_my, slice(2, 4)), m_z=pick(e_mz_q, 1),
  )  # fmt: skip


def _predictors(models: NuisanceModels):
  """(probability, regression) predict functions of the fitted learners' kind."""
  if isinstance(models.e, nz.MLPParams):
    return nz.predict_mlp_probability, nz.predict_mlp
  return nz.predict_logistic, nz.predict_rff


def predict_nuisances(models: NuisanceModels, c: jax.Array) -> nz.NuisanceCache:
  """Evaluates every nuisance at every row of `c` (all cells z, x ∈ {0, 1})."""
  probability, regression = _predictors(models)
  per_arm = lambda predict, params, features: jax.vmap(predict, (0, None), 1)(params, features)
  e1 = probability(models.e, c)
  q1 = per_arm(probability, models.q, c)
  m = jnp.stack([per_arm(regression, models.m, _with_column(v, c)) for v in (0.0, 1.0)], 1)
  m_y = per_arm(regression, models.m_y, _with_column(0.0, c))
  return nz.NuisanceCache(e1, q1, m, m_y, probability(models.m_z, c), e1, q1)


@functools.partial(jax.jit, static_argnames=("num_rff_features", "logistic_l2", "learner"))
def fit_predict_nuisances(
  c, x, z, y, weights, key, num_rff_features: int = 256, logistic_l2: float = 1e-3,
  learner: str = "parametric",
) -> tuple[NuisanceModels, nz.NuisanceCache]:  # fmt: skip
  """Nuisances fit on the rows weighted by `weights` and evaluated at every row of `c`."""
  models = fit_nuisances(c, x, z, y, weights, key, num_rff_features, logistic_l2, learner)
  return models, predict_nuisances(models, c)


def crossfit_nuisances(
  c, x, z, y, train_weights, key, num_rff_features: int = 256, logistic_l2: float = 1e-3,
  learner: str = "parametric",
) -> tuple[NuisanceModels, nz.NuisanceCache]:  # fmt: skip
  """`fit_predict_nuisances` vmapped over the rows of `train_weights` (K, n): one fit per fold."""
  keys = jax.random.split(key, train_weights.shape[0])
  fit = lambda w, k: fit_predict_nuisances(c, x, z, y, w, k, num_rff_features, logistic_l2, learner)
  return jax.vmap(fit)(train_weights, keys)


def stabilise(cache: nz.NuisanceCache, floor: float) -> nz.NuisanceCache:
  """Clips numerator probabilities to [1e-6, 1 − 1e-6] and floors denominators (as FD-CATE's code and README).

  The author floors only e and q(Z|X,C) where they divide (`cap01_denom`); flooring numerators would
  bias the orthogonal moment.
  """
  clip = lambda p, low: jnp.clip(p, low, 1.0 - low)
  return cache._replace(
    e1=clip(cache.e1, PROB_EPS),
    q1=clip(cache.q1, PROB_EPS),
    m_z=clip(cache.m_z, PROB_EPS),
    e1_denom=clip(cache.e1_denom, floor),
    q1_denom=clip(cache.q1_denom, floor),
  )


def _at_arm(table: jax.Array, x: jax.Array) -> jax.Array:
  """table[i, x_i] for a (n, 2) table indexed by a binary value."""
  return jnp.where(x == 1, table[:, 1], table[:, 0])


def _prob_of(p1: jax.Array, value: jax.Array) -> jax.Array:
  """P(V = value) from P(V = 1)."""
  return jnp.where(value == 1, p1, 1.0 - p1)


# ----------------------------------------------------------------------------------------------
# FD-PI and FD-DR.
# ----------------------------------------------------------------------------------------------


def plugin_effect(cache: nz.NuisanceCache) -> jax.Array:
  """τ̂_PI = (q(1|1,C) − q(1|0,C))·[e_1 (m_11 − m_01) + e_0 (m_10 − m_00)], m_zx = m(z,x,C)."""
  m, e1 = cache.m, cache.e1
  mediator_contrast = e1 * (m[:, 1, 1] - m[:, 0, 1]) + (1 - e1) * (m[:, 1, 0] - m[:, 0, 0])
  return (cache.q1[:, 1] - cache.q1[:, 0]) * mediator_contrast


def dr_pseudo_outcome(cache: nz.NuisanceCache, x: jax.Array, z: jax.Array, y: jax.Array):
  """ψ = φ_1 − φ_0, φ_x̄ = ξ_x̄(Y − m(Z,X,C)) + π_x̄(r_me(Z,C) − ν_meq(X,C)) + s_x̄(X,C).

  Expects a `stabilise`d cache: `e1_denom` and `q1_denom` enter only π_x̄ and ξ_x̄ as denominators.
  """
  m = cache.m
  r_me = m[:, :, 1] * cache.e1[:, None] + m[:, :, 0] * (1 - cache.e1[:, None])  # (n, z)
  q1_at_x = _at_arm(cache.q1, x)
  nu_meq = r_me[:, 1] * q1_at_x + r_me[:, 0] * (1 - q1_at_x)
  m_1x, m_0x = _at_arm(m[:, 1], x), _at_arm(m[:, 0], x)
  residual_y = y - jnp.where(z == 1, m_1x, m_0x)
  residual_r = _at_arm(r_me, z) - nu_meq
  q_denom = _prob_of(_at_arm(cache.q1_denom, x), z)
  e_denom = _prob_of(cache.e1_denom, x)

  def phi(x_bar: int) -> jax.Array:
    q1_bar = cache.q1[:, x_bar]
    density_ratio = _prob_of(q1_bar, z) / q_denom
    inverse_propensity = (x == x_bar) / e_denom
    s_bar = m_1x * q1_bar + m_0x * (1 - q1_bar)
    return density_ratio * residual_y + inverse_propensity * residual_r + s_bar

  return phi(1) - phi(0)


# ----------------------------------------------------------------------------------------------
# FD-R (Prop. 2, Thm 2, Lemma 3).
# ----------------------------------------------------------------------------------------------


def _fit_regressor(kind: str, features, targets, weights, key, config: FrontDoorConfig):
  if kind == "linear":
    return nz.fit_linear_ridge(features, targets, weights, config.linear_l2)
  return nz.fit_rff_ridge(features, targets, weights, key, config.num_rff_features)


def _predict_regressor(kind: str, params, features) -> jax.Array:
  return (
    nz.predict_linear(params, features) if kind == "linear" else nz.predict_rff(params, features)
  )


def _ratio_target(numerator, denominator, min_abs):
  """(numerator/denominator, keep) with rows |denominator| < min_abs dropped (target 0)."""
  keep = jnp.abs(denominator) >= min_abs
  return jnp.where(keep, numerator / jnp.where(keep, denominator, 1.0), 0.0), keep


def fit_b_stage(c, x, z, cache, weights, key, config: FrontDoorConfig):
  """b-stage: min Σ (r_Z − r_X b(C))², as a regression of r_Z/r_X on C with weights r_X²."""
  residual_x = x - cache.e1
  target, keep = _ratio_target(z - cache.m_z, residual_x, B_STAGE_MIN_RESIDUAL)
  return _fit_regressor(config.b_learner, c, target, weights * keep * residual_x**2, key, config)


def predict_b(params, c, config: FrontDoorConfig) -> jax.Array:
  """b̂(C), clipped to [−1, 1] since b is a difference of probabilities."""
  return jnp.clip(_predict_regressor(config.b_learner, params, c), -1.0, 1.0)


def _g_design(standardizer: nz.Standardizer, x, c) -> jax.Array:
  """φ(x, C) = [1, x, zscore(C)] (author's `_g_features`)."""
  return jnp.concatenate(
    [jnp.ones_like(x)[:, None], x[:, None], nz.standardize(standardizer, c)], 1
  )


def _g_residuals(x, z, y, cache):
  """(r_Y, r_Z') = (Y − m_Y(X,C), Z − q(1|X,C)) of the g-stage."""
  return y - _at_arm(cache.m_y, x), z - _at_arm(cache.q1, x)


def fit_g_direct(c, x, z, y, cache, weights, config: FrontDoorConfig):
  """g-stage `direct` solver: min Σ (r_Y − r_Z' φ(X,C)ᵀθ)² + α‖θ‖², α = 1e-4."""
  standardizer = nz.fit_standardizer(c, weights)
  residual_y, residual_z = _g_residuals(x, z, y, cache)
  design = residual_z[:, None] * _g_design(standardizer, x, c)
  return standardizer, nz.weighted_ridge_solve(design, residual_y, weights, config.g_l2)


def fit_g_ratio(c, x, z, y, cache, weights, key, config: FrontDoorConfig) -> nz.RFFParams:
  """g-stage `ratio` solver: RFF regression of r_Y/r_Z' on (X, C) with weights r_Z'²."""
  residual_y, residual_z = _g_residuals(x, z, y, cache)
  target, keep = _ratio_target(residual_y, residual_z, G_STAGE_MIN_RESIDUAL)
  features = jnp.concatenate([x[:, None], c], 1)
  return nz.fit_rff_ridge(
    features, target, weights * keep * residual_z**2, key, config.num_rff_features
  )


def predict_g(params, x_value: float, c, config: FrontDoorConfig) -> jax.Array:
  """ĝ(x, C) at a fixed treatment value for every row of `c`."""
  x = jnp.full(c.shape[0], x_value)
  if config.g_solver == "direct":
    standardizer, coef = params
    return _g_design(standardizer, x, c) @ coef
  return nz.predict_rff(params, jnp.concatenate([x[:, None], c], 1))


def pseudo_g(g1, g0, e1, x) -> jax.Array:
  """ζ = (1 − ê)ĝ(0,C) + ê ĝ(1,C) + (X − ê)(ĝ(1,C) − ĝ(0,C)), E[ζ|C] = γ_g(C) (Lemma 3)."""
  return (1 - e1) * g0 + e1 * g1 + (x - e1) * (g1 - g0)


def fit_r_role(c, x, z, y, cache, stage_weights, final_weights, key, config: FrontDoorConfig):
  """b and g on the stage fold, then the final regression of ζ (or b̂ζ) on the final fold."""
  key_b, key_g, key_final = jax.random.split(key, 3)
  b = fit_b_stage(c, x, z, cache, stage_weights, key_b, config)
  if config.g_solver == "direct":
    g = fit_g_direct(c, x, z, y, cache, stage_weights, config)
  else:
    g = fit_g_ratio(c, x, z, y, cache, stage_weights, key_g, config)
  zeta = pseudo_g(predict_g(g, 1.0, c, config), predict_g(g, 0.0, c, config), cache.e1, x)
  target = zeta if config.r_final == "b_times_gamma" else predict_b(b, c, config) * zeta
  final = _fit_regressor(config.final_stage, c, target, final_weights, key_final, config)
  return RStage(b, g, final), target


def predict_r_role(stage: RStage, c, config: FrontDoorConfig) -> jax.Array:
  """τ̂_R = b̂·γ̂ (paper, Thm 2) or the regression of b̂ζ (author's 2-way code)."""
  final = _predict_regressor(config.final_stage, stage.final, c)
  return predict_b(stage.b, c, config) * final if config.r_final == "b_times_gamma" else final


# ----------------------------------------------------------------------------------------------
# Cross-fitted pipelines.
# ----------------------------------------------------------------------------------------------


def _weighted_mean(values, weights) -> jax.Array:
  return jnp.sum(values * weights) / jnp.sum(weights)


def _backdoor_pseudo_outcome(cache, x, z, y):
  del z
  return backdoor.aipw_pseudo_outcome(cache, x, y)


def _pseudo_outcome_stages(pseudo_outcome, c, x, z, y, weights, masks, caches, key, config):
  """Per-fold ψ from each fold's nuisances, then the final regression of ψ on C (FD-DR)."""
  psi = jax.vmap(pseudo_outcome, (0, None, None, None))(caches, x, z, y)
  psi_oof = jnp.sum(masks * psi, 0)
  targets, final_weights = (
    (psi_oof[None], weights[None]) if config.pooled_final else (psi, weights * masks)
  )
  keys = jax.random.split(key, targets.shape[0])
  fit = lambda target, w, k: _fit_regressor(config.final_stage, c, target, w, k, config)
  finals = jax.vmap(fit)(targets, final_weights, keys)
  preds = jax.vmap(_predict_regressor, (None, 0, None))(config.final_stage, finals, c)
  tau_oof = preds[0] if config.pooled_final else jnp.sum(masks * preds, 0)
  return finals, tau_oof, psi_oof, _weighted_mean(psi_oof, weights)


def _r_stages(c, x, z, y, weights, masks, caches, key, config: FrontDoorConfig):
  roles = three_way_roles(config.swap_average)
  role_caches = jax.tree.map(lambda leaf: leaf[roles[:, 0]], caches)
  keys = jax.random.split(key, roles.shape[0])
  fit = lambda cache, w_stage, w_final, k: fit_r_role(
    c, x, z, y, cache, w_stage, w_final, k, config
  )
  stage_weights, final_masks = weights * masks[roles[:, 1]], masks[roles[:, 2]]
  stages, targets = jax.vmap(fit)(role_caches, stage_weights, weights * final_masks, keys)
  preds = jax.vmap(predict_r_role, (0, None, None))(stages, c, config)
  out_of_fold = lambda values: jnp.sum(final_masks * values, 0) / jnp.sum(final_masks, 0)
  tau_oof = out_of_fold(preds)
  return stages, tau_oof, out_of_fold(targets), _weighted_mean(tau_oof, weights)


def _plugin_stages(c, x, z, y, weights, masks, caches, key, config):
  del c, x, z, y, key, config
  tau_oof = jnp.sum(masks * jax.vmap(plugin_effect)(caches), 0)
  return None, tau_oof, tau_oof, _weighted_mean(tau_oof, weights)


_STAGES = {
  "dr": functools.partial(_pseudo_outcome_stages, dr_pseudo_outcome),
  "r": _r_stages,
  "plugin": _plugin_stages,
  "backdoor": functools.partial(_pseudo_outcome_stages, _backdoor_pseudo_outcome),
}


@functools.partial(jax.jit, static_argnames=("config",))
def fit_stages(c, x, z, y, weights, masks, caches, key, config: FrontDoorConfig, delta=0.0):
  """Perturbs (if delta > 0) and stabilises the caches, then runs the method's stages.

  Returns (stages, tau_oof, target_oof, ate) as in `FrontDoorFit`.
  """
  key_perturb, key_stage = jax.random.split(key)
  caches = fd_data.perturb_nuisances(caches, key_perturb, delta, x.shape[0])
  caches = stabilise(caches, config.floor)
  return _STAGES[config.method](c, x, z, y, weights, masks, caches, key_stage, config)


def fit_frontdoor(
  c, x, z, y, weights, folds, key, config: FrontDoorConfig, delta=0.0
) -> FrontDoorFit:
  """Cross-fitted FD-PI/FD-DR/FD-R on rows weighted by `weights`; `folds` from `fold_assignment`.

  FD-DR and FD-PI fit nuisances on the complement of each fold and evaluate on the fold; FD-R fits
  nuisances on one fold, b and g on another and the final stage on the third (FD-R). `delta` > 0
  applies the author's perturbation to the numerator nuisances. Pure: it vmaps over replications, keys
  and `delta`, and vmaps over folds inside. It is two jitted programs (the nuisances, shared by
  every method with the same fold count, and the stages), so eager callers compile each once.
  """
  return fit_frontdoor_methods(
    c, x, z, y, weights, {config.num_folds: folds}, key, [config], delta
  )[0]


def _nuisance_rows(config: FrontDoorConfig) -> tuple:
  """Learners with equal keys fit identical nuisances on the same folds."""
  return (
    config.num_folds, config.method == "r", config.num_rff_features, config.logistic_l2,
    config.nuisance_learner,
  )  # fmt: skip


def fit_frontdoor_methods(
  c, x, z, y, weights, folds: dict, key, configs, delta=0.0
) -> list[FrontDoorFit]:
  """`fit_frontdoor` for several learners on one data set; `folds` maps a fold count to its ids.

  Learners whose nuisances are fit on the same rows (FD-DR, FD-PI and the back-door baseline with
  equal fold counts) share one cross-fitted nuisance fit. Each learner's fit equals its own
  `fit_frontdoor` with the same `key`.
  """
  x, z, y, c = (jnp.asarray(v, jnp.float32) for v in (x, z, y, c))
  key_nuisance, key_stage = jax.random.split(key)
  shared, fits = {}, []
  for config in configs:
    masks = fold_masks(folds[config.num_folds], config.num_folds)
    rows = _nuisance_rows(config)
    if rows not in shared:
      train = masks if config.method == "r" else 1.0 - masks
      shared[rows] = crossfit_nuisances(
        c, x, z, y, weights * train, key_nuisance, config.num_rff_features, config.logistic_l2,
        config.nuisance_learner,
      )  # fmt: skip
    nuisances, caches = shared[rows]
    stages = fit_stages(c, x, z, y, weights, masks, caches, key_stage, config, delta)
    fits.append(FrontDoorFit(nuisances, caches, *stages))
  return fits


@functools.partial(jax.jit, static_argnames=("config",))
def predict_effect(fit: FrontDoorFit, c, config: FrontDoorConfig) -> jax.Array:
  """τ̂(C) at new rows: the mean over folds (FD-DR, FD-PI) or roles (FD-R) of their predictors."""
  c = jnp.asarray(c, jnp.float32)
  if config.method in ("dr", "backdoor"):
    preds = jax.vmap(_predict_regressor, (None, 0, None))(config.final_stage, fit.stages, c)
  elif config.method == "r":
    preds = jax.vmap(predict_r_role, (0, None, None))(fit.stages, c, config)
  else:
    caches = jax.vmap(predict_nuisances, (0, None))(fit.nuisances, c)
    preds = jax.vmap(plugin_effect)(stabilise(caches, config.floor))
  return jnp.mean(preds, 0)


def bootstrap_fits(
  c, x, z, y, fit: FrontDoorFit, folds, key, bootstrap_key, config: FrontDoorConfig,
  num_bootstrap: int, refit_nuisances: bool | None = None, delta=0.0,
) -> FrontDoorFit:  # fmt: skip
  """Refits under `num_bootstrap` Bayesian-bootstrap row weights Exp(1), stacked on axis 0.

  `fit`, `folds`, `key` and `delta` are the point fit's, so splits and random features stay fixed.
  By default FD-DR and FD-R keep the point fit's nuisances and refit only their stages (the
  nuisance error is second order for orthogonal learners, Thm 1 and 3); FD-PI, whose error is the
  nuisance error, refits everything. Replicates run one by one, reusing the point fit's compiled
  programs; `jax.vmap` `fit_frontdoor`/`fit_stages` over weights instead on accelerators.
  """
  refit_nuisances = config.method == "plugin" if refit_nuisances is None else refit_nuisances
  x, z, y, c = (jnp.asarray(v, jnp.float32) for v in (x, z, y, c))
  masks = fold_masks(folds, config.num_folds)
  key_stage = jax.random.split(key)[1]

  def refit(weights):
    if refit_nuisances:
      return fit_frontdoor(c, x, z, y, weights, folds, key, config, delta)
    stages = fit_stages(c, x, z, y, weights, masks, fit.caches, key_stage, config, delta)
    return FrontDoorFit(None, None, *stages)

  weights = jax.random.exponential(bootstrap_key, (num_bootstrap, x.shape[0]))
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *[refit(w) for w in weights])


def percentile_interval(samples: jax.Array, alpha: float = 0.05):
  """(lower, upper) equal-tailed percentiles over the leading (bootstrap) axis."""
  return tuple(jnp.quantile(samples, jnp.asarray([alpha / 2, 1 - alpha / 2]), axis=0))


# ----------------------------------------------------------------------------------------------
# User-facing estimator.
# ----------------------------------------------------------------------------------------------


def _check_choice(name: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")


def _as_numeric(name: str, value, ndim: int) -> np.ndarray:
  """`value` as a finite float64 array of rank `ndim`, or a ValueError naming `name`."""
  try:
    array = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError) as error:
    raise ValueError(f"{name} must be a numeric array; {error}.") from None
  if array.ndim != ndim:
    expected = "2-D (n, d); reshape one covariate with C[:, None]" if ndim == 2 else "1-D (n,)"
    raise ValueError(f"{name} must be {expected}; got shape {array.shape}.")
  bad = int(np.sum(~np.isfinite(array)))
  if bad:
    raise ValueError(f"{name} contains NaN or inf ({bad} entries).")
  return array


def _check_binary(name: str, array: np.ndarray) -> None:
  values = np.unique(array)
  if not np.all(np.isin(values, (0.0, 1.0))):
    raise ValueError(f"{name} must be binary with values in {{0, 1}}; found {values[:6].tolist()}.")


def validate_inputs(C, X, Z, Y) -> tuple[np.ndarray, ...]:
  """Checks ranks, lengths, finiteness and binary X, Z; returns float64 copies (C, X, Z, Y)."""
  c = _as_numeric("C", C, 2)
  x, z, y = (_as_numeric(name, v, 1) for name, v in (("X", X), ("Z", Z), ("Y", Y)))
  for name, array in (("X", x), ("Z", z), ("Y", y)):
    if array.shape[0] != c.shape[0]:
      raise ValueError(
        f"{name} has {array.shape[0]} rows but C has {c.shape[0]}; C, X, Z and Y must have the "
        "same number of rows."
      )
  _check_binary("X", x)
  _check_binary("Z", z)
  return c, x, z, y


def _check_arm_overlap(x: np.ndarray, z: np.ndarray, where: str) -> None:
  """Both treatment arms, and both mediator values within each arm, must occur."""
  for arm in (0, 1):
    in_arm = x == arm
    if in_arm.sum() < _MIN_ARM_ROWS:
      raise ValueError(
        f"X: no overlap {where}: {int(in_arm.sum())} rows have X={arm} (need at least "
        f"{_MIN_ARM_ROWS}); e(C) and the arm-{arm} nuisances cannot be estimated."
      )
    mediator_values = np.unique(z[in_arm])
    if mediator_values.size < 2:
      raise ValueError(
        f"Z: no overlap {where}: every row with X={arm} has Z={int(mediator_values[0])}; "
        "q(z | x, C) needs both mediator values in each treatment arm."
      )


def check_overlap(x: np.ndarray, z: np.ndarray, folds: np.ndarray, config: FrontDoorConfig):
  """Overlap in every nuisance training set of the cross-fit."""
  for fold in range(config.num_folds):
    train = folds == fold if config.method == "r" else folds != fold
    where = f"in the nuisance training set of fold {fold + 1} of {config.num_folds}"
    _check_arm_overlap(x[train], z[train], where)


class FrontDoorLearner:
  """Heterogeneous front-door effects τ(C) by FD-DR, FD-R or the plug-in (sklearn-style).

  Example:
    learner = FrontDoorLearner(method="dr").fit(C, X, Z, Y)
    tau_hat, (low, high) = learner.effect(C_new), learner.effect_interval(C_new)

  The wrapper validates input and holds the fit; the work is done by the jitted pure functions
  `fit_frontdoor`, `predict_effect` and `bootstrap_fits`.
  """

  def __init__(
    self,
    method: str = "dr",
    final_stage: str = "linear",
    folds: int | None = None,
    floor: float = 0.05,
    seed: int = 0,
    **options,
  ):
    """Configures the learner.

    Args:
      method: "dr" (FD-DR), "r" (FD-R), "plugin" (FD-PI), or "backdoor": the naive
        back-door DR-learner of X → Y given C (`core.causal.backdoor`), a baseline that is
        biased whenever U confounds X and Y.
      final_stage: "linear" (ridge on z-scored C, author parity) or "rff" (RFF ridge).
      folds: cross-fitting folds; default 2 for "dr"/"plugin" (≥ 2 allowed), 3 for "r" (only 3).
      floor: denominators are floored to [floor, 1 − floor]; 0 < floor < 0.5.
      seed: seeds the folds, random features and the bootstrap.
      **options: other `FrontDoorConfig` fields (g_solver, r_final, swap_average, ...).
    """
    _check_choice("method", method, _METHODS)
    _check_choice("final_stage", final_stage, _FINAL_STAGES)
    default_folds = 3 if method == "r" else 2
    folds = default_folds if folds is None else folds
    if method == "r" and folds != 3:
      raise ValueError(f"folds must be 3 for method='r' (3-way cross-fitting); got {folds}.")
    if not isinstance(folds, int) or folds < 2:
      raise ValueError(f"folds must be an integer ≥ 2; got {folds!r}.")
    if not 0.0 < floor < 0.5:
      raise ValueError(f"floor must lie in (0, 0.5); got {floor}.")
    unknown = set(options) - {f.name for f in dataclasses.fields(FrontDoorConfig)}
    if unknown:
      raise ValueError(f"options: unknown FrontDoorConfig fields {sorted(unknown)}.")
    self.config = FrontDoorConfig(
      method=method, final_stage=final_stage, num_folds=folds, floor=floor, **options
    )
    _check_choice("g_solver", self.config.g_solver, _G_SOLVERS)
    _check_choice("r_final", self.config.r_final, _R_FINALS)
    _check_choice("b_learner", self.config.b_learner, _FINAL_STAGES)
    _check_choice("nuisance_learner", self.config.nuisance_learner, _NUISANCE_LEARNERS)
    self.seed = seed
    self._fit = None
    self._bootstrap = {}

  def fit(self, C, X, Z, Y) -> "FrontDoorLearner":
    """Cross-fits the learner on covariates C (n, d), binary X and Z (n,), outcome Y (n,)."""
    c, x, z, y = validate_inputs(C, X, Z, Y)
    _check_arm_overlap(x, z, "in the data")
    key_folds, self._key = jax.random.split(jax.random.key(self.seed))
    folds = fold_assignment(key_folds, x.shape[0], self.config.num_folds)
    check_overlap(x, z, np.asarray(folds), self.config)
    self._data = tuple(jnp.asarray(v, jnp.float32) for v in (c, x, z, y)) + (folds,)
    weights = jnp.ones(x.shape[0], jnp.float32)
    c, x, z, y = self._data[:4]
    self._fit = fit_frontdoor(c, x, z, y, weights, folds, self._key, self.config)
    self._bootstrap = {}
    return self

  def _fitted(self) -> FrontDoorFit:
    if self._fit is None:
      raise RuntimeError("FrontDoorLearner is not fitted; call fit(C, X, Z, Y) first.")
    return self._fit

  def _query(self, C) -> jax.Array:
    c = _as_numeric("C", C, 2)
    expected = self._data[0].shape[1]
    if c.shape[1] != expected:
      raise ValueError(f"C must have {expected} columns as in fit; got {c.shape[1]}.")
    return jnp.asarray(c, jnp.float32)

  def effect(self, C) -> np.ndarray:
    """τ̂(C) at new covariate rows, averaging the cross-fitted predictors."""
    return np.asarray(predict_effect(self._fitted(), self._query(C), self.config))

  def oof_effect(self) -> np.ndarray:
    """Out-of-fold τ̂(C_i) on the training rows (the author's simulations compute RMSE on these)."""
    return np.asarray(self._fitted().tau_oof)

  def ate(self) -> float:
    """The average effect: mean cross-fitted ψ (FD-DR, back-door) or mean out-of-fold τ̂ (FD-R, FD-PI)."""
    return float(self._fitted().ate)

  def _bootstrap_fits(self, num_bootstrap: int) -> FrontDoorFit:
    self._fitted()
    if num_bootstrap not in self._bootstrap:
      bootstrap_key = jax.random.fold_in(self._key, num_bootstrap)
      c, x, z, y, folds = self._data
      self._bootstrap[num_bootstrap] = bootstrap_fits(
        c, x, z, y, self._fit, folds, self._key, bootstrap_key, self.config, num_bootstrap
      )
    return self._bootstrap[num_bootstrap]

  def effect_interval(self, C, alpha: float = 0.05, num_bootstrap: int = 200):
    """Bootstrap percentile interval (lower, upper) for τ(C) at each row of C, level 1 − alpha."""
    query = self._query(C)
    fits = self._bootstrap_fits(num_bootstrap)
    samples = jax.vmap(predict_effect, (0, None, None))(fits, query, self.config)
    return tuple(np.asarray(bound) for bound in percentile_interval(samples, alpha))

  def ate_interval(self, alpha: float = 0.05, num_bootstrap: int = 200) -> tuple[float, float]:
    """Bootstrap percentile interval (lower, upper) for the ATE, level 1 − alpha."""
    fits = self._bootstrap_fits(num_bootstrap)
    return tuple(float(bound) for bound in percentile_interval(fits.ate, alpha))
