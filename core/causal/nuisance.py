"""Weighted nuisance learners and the per-row nuisance cache of the front-door learners.

The nuisances are those of "Debiased Front-Door Learners for Heterogeneous Effects" (arXiv 2509.22531):
e, q, m for FD-PI and FD-DR, and m_Y, m_Z for FD-R. Learners: logistic regression, a
random-Fourier-feature ridge with the median heuristic, a linear ridge on z-scored features, and
small MLPs; the author's code uses XGBoost.

Every learner is a pair of pure functions, `fit_*(features, targets, weights, ...) -> params` and
`predict_*(params, features)`. Rows enter only through `weights`: a zero weight excludes a row,
so a cross-fitting fold is a 0/1 mask and a bootstrap replicate is a positive weight vector, and
both vmap without ragged shapes. Fits assume at least one row has positive weight (and, for the
logistic fit, that both classes do); input validation lives in the user-facing estimator.

Choices where the paper is open:
- Logistic regression is Newton's method (IRLS) with a fixed iteration count and a step chosen from
  {1, 1/2, 1/4, 1/8, 0} by the penalised loss, so it is monotone and jit-able. The L2 penalty is on
  the mean loss (1e-3 matches sklearn's C=1 at n=1000); the intercept is unpenalised.
- The RFF ridge appends the z-scored inputs to the 256 cosine features (the DGPs are largely
  linear) and picks its penalty by generalised cross-validation over a log grid, from one
  eigendecomposition.
- The MLP option (`fit_mlp`) is `core.nn.mlp.MLP` with two ReLU layers of 64 on z-scored inputs,
  trained full-batch with Adam for a fixed number of steps (a `lax.scan`, so it vmaps over folds
  and replications) on the weighted mean log-loss or squared loss (targets z-scored), with an L2
  penalty of 1e-2 on the weight matrices and no early stopping. Without the penalty (1e-4) the
  networks overfit the noisy outcome: the counterfactual contrast m(1,x,C) - m(0,x,C) was off by 3
  (RMSE against the oracle; 0.29 at 1e-2) and e-hat reached 0 and 1.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import jax.scipy.special
import numpy as np
import optax

from core.nn.mlp import MLP

# Penalties of the RFF ridge on the mean squared loss, searched by GCV.
RFF_L2_GRID = tuple(float(v) for v in np.logspace(-5, 1, 13))
_NEWTON_STEPS = (1.0, 0.5, 0.25, 0.125, 0.0)
_MIN_SCALE = 1e-8
MLP_HIDDEN = (64, 64)
_MLP = MLP(hidden=MLP_HIDDEN, num_outputs=1)


class Standardizer(NamedTuple):
  """Weighted column means and population standard deviations (the author's `_zscore_fit`)."""

  mean: jax.Array
  scale: jax.Array


class LinearParams(NamedTuple):
  """A linear predictor `standardize(features) @ coef + intercept`."""

  standardizer: Standardizer
  coef: jax.Array
  intercept: jax.Array


class RFFParams(NamedTuple):
  """Ridge on `[z, sqrt(2/D) cos(z @ freqs + phases)]` with `z` the standardized inputs."""

  standardizer: Standardizer
  freqs: jax.Array
  phases: jax.Array
  coef: jax.Array
  design_mean: jax.Array
  intercept: jax.Array


class NuisanceCache(NamedTuple):
  """The front-door nuisances evaluated at each row (leading axes are free: folds, replications).

  `e1`, `q1` and `m` are the numerator copies, which the author's perturbation degrades; `e1_denom` and
  `q1_denom` are the copies used in denominators (inverse propensity and density ratio), frozen
  before any perturbation as in the author's `nuisance_cache_on`.
  """

  e1: jax.Array  # (n,) e_1(C) = P(X=1 | C).
  q1: jax.Array  # (n, 2) q(1 | x, C) = P(Z=1 | X=x, C), column x.
  m: jax.Array  # (n, 2, 2) m(z, x, C) = E[Y | Z=z, X=x, C], at [:, z, x].
  m_y: jax.Array  # (n, 2) m_Y(x, C) = E[Y | X=x, C], column x.
  m_z: jax.Array  # (n,) m_Z(C) = P(Z=1 | C).
  e1_denom: jax.Array  # (n,) e_1(C) for denominators.
  q1_denom: jax.Array  # (n, 2) q(1 | x, C) for denominators.


def fit_standardizer(features: jax.Array, weights: jax.Array) -> Standardizer:
  """Weighted mean and population standard deviation per column; tiny scales become 1."""
  w = weights / jnp.sum(weights)
  mean = w @ features
  scale = jnp.sqrt(w @ (features - mean) ** 2)
  return Standardizer(mean, jnp.where(scale < _MIN_SCALE, 1.0, scale))


def standardize(standardizer: Standardizer, features: jax.Array) -> jax.Array:
  return (features - standardizer.mean) / standardizer.scale


def spd_solve(matrix: jax.Array, rhs: jax.Array) -> jax.Array:
  """Solves a symmetric positive-definite system by Cholesky, with a 1e-6 relative jitter."""
  jitter = 1e-6 * jnp.mean(jnp.diag(matrix)) + 1e-12
  factor = jax.scipy.linalg.cho_factor(matrix + jitter * jnp.eye(matrix.shape[0]))
  return jax.scipy.linalg.cho_solve(factor, rhs)


def weighted_ridge_solve(
  design: jax.Array, targets: jax.Array, weights: jax.Array, l2: float
) -> jax.Array:
  """Solves min_θ Σ w_i (t_i − design_i θ)² + l2 ‖θ‖² (sum scale, no intercept)."""
  gram = (design * weights[:, None]).T @ design + l2 * jnp.eye(design.shape[1])
  return spd_solve(gram, design.T @ (weights * targets))


def fit_linear_ridge(
  features: jax.Array, targets: jax.Array, weights: jax.Array, l2: float = 1e-6
) -> LinearParams:
  """Weighted ridge on z-scored features, intercept unpenalised.

  Parity with the author's final stage, sklearn `Ridge(alpha=1e-6)` on z-scored C (FDCATE.py).
  """
  standardizer = fit_standardizer(features, weights)
  scaled = standardize(standardizer, features)
  w = weights / jnp.sum(weights)
  target_mean = w @ targets
  coef = weighted_ridge_solve(scaled - w @ scaled, targets - target_mean, weights, l2)
  return LinearParams(standardizer, coef, target_mean - (w @ scaled) @ coef)


def predict_linear(params: LinearParams, features: jax.Array) -> jax.Array:
  return standardize(params.standardizer, features) @ params.coef + params.intercept


def fit_logistic(
  features: jax.Array,
  targets: jax.Array,
  weights: jax.Array,
  l2: float = 1e-3,
  num_iters: int = 25,
) -> LinearParams:
  """L2-penalised weighted logistic regression by damped Newton steps (for e, q and m_Z)."""
  standardizer = fit_standardizer(features, weights)
  design = jnp.concatenate(
    [jnp.ones_like(targets)[:, None], standardize(standardizer, features)], 1
  )
  w = weights / jnp.sum(weights)
  penalty = jnp.full(design.shape[1], l2).at[0].set(0.0)

  def loss(beta):
    logits = design @ beta
    return w @ (jax.nn.softplus(logits) - targets * logits) + 0.5 * penalty @ beta**2

  def newton_step(beta, _):
    probs = jax.nn.sigmoid(design @ beta)
    grad = design.T @ (w * (probs - targets)) + penalty * beta
    hess = (design * (w * probs * (1 - probs))[:, None]).T @ design + jnp.diag(penalty)
    candidates = beta - jnp.asarray(_NEWTON_STEPS)[:, None] * spd_solve(hess, grad)
    return candidates[jnp.argmin(jax.vmap(loss)(candidates))], None

  beta, _ = jax.lax.scan(newton_step, jnp.zeros(design.shape[1]), None, length=num_iters)
  return LinearParams(standardizer, beta[1:], beta[0])


def predict_logistic(params: LinearParams, features: jax.Array) -> jax.Array:
  return jax.nn.sigmoid(predict_linear(params, features))


def median_bandwidth(scaled: jax.Array, weights: jax.Array, num_rows: int = 128) -> jax.Array:
  """Weighted median pairwise distance among `num_rows` evenly spaced rows (median heuristic).

  The rows are a fixed stride through the data, which keeps the fit free of random draws; a pair
  counts with weight w_i w_j, so rows outside a fold are ignored. Falls back to sqrt(2d), the
  root mean squared distance of standardized rows, when no sampled pair has positive weight.
  """
  rows = np.linspace(0, scaled.shape[0] - 1, min(num_rows, scaled.shape[0])).astype(np.int32)
  sample, sample_weights = scaled[rows], weights[rows]
  sq_dist = jnp.sum((sample[:, None] - sample[None]) ** 2, axis=-1).ravel()
  upper = jnp.triu(jnp.ones((rows.size, rows.size), bool), k=1).ravel()
  pair_weights = jnp.where(upper, jnp.outer(sample_weights, sample_weights).ravel(), 0.0)
  order = jnp.argsort(sq_dist)
  cumulative = jnp.cumsum(pair_weights[order])
  median_index = jnp.sum(cumulative < 0.5 * cumulative[-1])
  median = jnp.sqrt(sq_dist[order][jnp.minimum(median_index, sq_dist.size - 1)])
  fallback = jnp.sqrt(2.0 * scaled.shape[1])
  return jnp.where(cumulative[-1] > 0, jnp.maximum(median, _MIN_SCALE), fallback)


def _rff_design(scaled: jax.Array, freqs: jax.Array, phases: jax.Array) -> jax.Array:
  cosines = jnp.sqrt(2.0 / freqs.shape[1]) * jnp.cos(scaled @ freqs + phases)
  return jnp.concatenate([scaled, cosines], axis=1)


def ridge_gcv(
  design: jax.Array, targets: jax.Array, weights: jax.Array, l2_grid: tuple[float, ...]
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Weighted ridge with unpenalised intercept; the penalty minimises GCV over `l2_grid`.

  Returns `(coef, design_mean, intercept)`. Penalties are on the mean loss; the effective sample
  size in GCV is (Σw)²/Σw², which is the row count for 0/1 weights.
  """
  w = weights / jnp.sum(weights)
  design_mean, target_mean = w @ design, w @ targets
  centred, centred_targets = design - design_mean, targets - target_mean
  evals, evecs = jnp.linalg.eigh((centred * w[:, None]).T @ centred)
  evals = jnp.maximum(evals, 0.0)
  projected = centred @ evecs
  grid = jnp.asarray(l2_grid)[:, None]
  eigen_coef = (projected.T @ (w * centred_targets)) / (evals + grid)
  residuals = centred_targets - eigen_coef @ projected.T
  dof = 1.0 + jnp.sum(evals / (evals + grid), axis=1)
  dof_fraction = jnp.minimum(dof * jnp.sum(w**2), 1.0 - 1e-6)
  gcv = (residuals**2 @ w) / (1.0 - dof_fraction) ** 2
  coef = evecs @ eigen_coef[jnp.argmin(gcv)]
  return coef, design_mean, target_mean


def fit_rff_ridge(
  features: jax.Array,
  targets: jax.Array,
  weights: jax.Array,
  key: jax.Array,
  num_features: int = 256,
  l2_grid: tuple[float, ...] = RFF_L2_GRID,
) -> RFFParams:
  """Random-Fourier-feature ridge, Gaussian kernel with median-heuristic bandwidth."""
  standardizer = fit_standardizer(features, weights)
  scaled = standardize(standardizer, features)
  gaussians = jax.random.normal(key, (features.shape[1] + 1, num_features))
  freqs = gaussians[:-1] / median_bandwidth(scaled, weights)
  phases = 2 * jnp.pi * jax.scipy.special.ndtr(gaussians[-1])  # Uniform on [0, 2π).
  design = _rff_design(scaled, freqs, phases)
  coef, design_mean, intercept = ridge_gcv(design, targets, weights, l2_grid)
  return RFFParams(standardizer, freqs, phases, coef, design_mean, intercept)


def predict_rff(params: RFFParams, features: jax.Array) -> jax.Array:
  scaled = standardize(params.standardizer, features)
  design = _rff_design(scaled, params.freqs, params.phases)
  return (design - params.design_mean) @ params.coef + params.intercept


class MLPParams(NamedTuple):
  """A fitted MLP nuisance: flax parameters of `MLP(MLP_HIDDEN, 1)` on z-scored inputs, and the
  affine map back to the target's scale (identity for the logistic loss)."""

  standardizer: Standardizer
  params: dict
  target_mean: jax.Array
  target_scale: jax.Array


def fit_mlp(
  features: jax.Array,
  targets: jax.Array,
  weights: jax.Array,
  key: jax.Array,
  loss: str = "squared",
  num_steps: int = 300,
  learning_rate: float = 1e-2,
  l2: float = 1e-2,
) -> MLPParams:
  """Weighted full-batch MLP regression (`loss="squared"`) or classification (`"logistic"`)."""
  standardizer = fit_standardizer(features, weights)
  scaled = standardize(standardizer, features)
  w = weights / jnp.sum(weights)
  if loss == "logistic":
    target_mean, target_scale = jnp.zeros(()), jnp.ones(())
  else:
    target_mean = w @ targets
    target_scale = jnp.maximum(jnp.sqrt(w @ (targets - target_mean) ** 2), _MIN_SCALE)
  scaled_targets = (targets - target_mean) / target_scale

  def objective(params):
    out = _MLP.apply(params, scaled)[:, 0]
    if loss == "logistic":
      row_loss = jax.nn.softplus(out) - scaled_targets * out
    else:
      row_loss = 0.5 * (out - scaled_targets) ** 2
    penalty = sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(params) if leaf.ndim == 2)
    return w @ row_loss + l2 * penalty

  optimizer = optax.adam(learning_rate)

  def step(carry, _):
    params, opt_state = carry
    updates, opt_state = optimizer.update(jax.grad(objective)(params), opt_state)
    return (optax.apply_updates(params, updates), opt_state), None

  params = _MLP.init(key, scaled[:1])
  (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), None, length=num_steps)
  return MLPParams(standardizer, params, target_mean, target_scale)


def predict_mlp(params: MLPParams, features: jax.Array) -> jax.Array:
  """The fitted value (the logit for the logistic loss)."""
  out = _MLP.apply(params.params, standardize(params.standardizer, features))[:, 0]
  return out * params.target_scale + params.target_mean


def predict_mlp_probability(params: MLPParams, features: jax.Array) -> jax.Array:
  return jax.nn.sigmoid(predict_mlp(params, features))
