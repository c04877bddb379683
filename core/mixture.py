"""Data-mixture search: FastMix's bilevel hypergradient and the baselines' maths.

FastMix ("Fast Data Mixture Optimization via Gradient Descent", ICLR 2026) searches the mixture
`alpha` of K data sources as a bilevel problem (Sec. 3, Eq. 1):

  min_alpha L_target(w*(alpha))   s.t.   w*(alpha) = argmin_w sum_i alpha_i L_train(D_i, w).

Reparametrisation (Sec. 3.1): drawing a source `i ~ Cat(alpha)` and then `x ~ D_i` has expected loss
`sum_i alpha_i L(D_i, w)`, so a mixture ratio is a per-source loss weight under uniform per-source
sampling (`weighted_loss`; equal counts per source make the normalised weighted mean exactly
`sum_i alpha_i L_i`). With `alpha = softmax(z)` (`mixture_weights`) the ratio is differentiable.

Hypergradient (Sec. 3.2, Eq. 5, one unrolled inner step, n2 = 1): for
`w^{t+1} = w^t - eta sum_i alpha_i grad L_i(w^t)`,

  dL_target(w^{t+1}) / d alpha_i = -eta <grad L_target(w^{t+1}), grad L_i(w^t)>     (`hypergradient`)

exactly (`unrolled_hypergradient` is the autodiff reference, through any number of SGD steps). The
inner product runs over all parameters, or over the LM head only as the official code does
(hrtan/fastmix, `pretrain/train_fastmix_val.py`): the caller passes the gradients it wants dotted.
The search objective (Eq. 6) is `l_val(w) + beta L_train(w) + lambda sum_i alpha_i log alpha_i`; the
beta term enters through the target gradient `grad l_val + beta sum_j alpha_j grad L_j` at w^{t+1}
(differentiated through w only, `alpha` held fixed in it), the entropy term directly
(`outer_gradient`, via the surrogate `sum_i softmax(z)_i stop_grad(h_i) + lambda sum alpha log alpha`
whose z-gradient is the softmax chain rule `p_i (h_i - sum_j p_j h_j)`, `softmax_chain`).
`entropy_sign = -1` reproduces the released code, which adds `+lambda dH/dz` to the gradient it
descends and so *lowers* the entropy; +1 (default) is the paper's penalty.

Baselines:
  RegMix (Liu et al. 2025, sail-sg/regmix `mixture_config/synthesize_mixture.py`): `regmix_mixtures`
    draws Dirichlet(prior^T * s) with s random among logspace(0.1, 5, 15), rejects weights above
    `max_usage * prior`, zeroes those below `minimum` and rounds to its grid; a regressor maps
    mixture -> loss: in place of LightGBM a Nadaraya-Watson smoother (`kernel_smoother_fit`:
    bounded by the observed losses and never extrapolating, as trees), or RBF kernel ridge
    (`kernel_ridge_fit`, which can overshoot between distant samples), or a quadratic surface
    (`quadratic_ridge_fit`, RegMix's linear-regression variant with pairwise terms, which
    extrapolates), each with leave-one-out-chosen hyperparameters; `regmix_select` averages the
    `top_k` best-predicted of many simulated mixtures.
  CLIMB (Diao et al. 2025): rounds of proxies; `climb_candidates` draws around the best mixture so
    far with a concentration that grows each round (the search region shrinks) and keeps those
    the regressor fitted on every earlier proxy predicts best.
  DoReMi (Xie et al. 2023): `doremi_update`, the Group-DRO exponentiated-gradient step on the
    per-domain excess loss over a reference model, smoothed towards uniform; the answer is the
    average of the iterates.
  Brute force: `simplex_lattice`, every mixture of the active sources on a grid of step 1/r.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# ---------------------------------------------------------------------------------------------------
# Mixture weights and the reparametrised loss (Sec. 3.1)
# ---------------------------------------------------------------------------------------------------


def mixture_weights(logits: jax.Array) -> jax.Array:
  """`alpha = softmax(z)` over the last axis."""
  return jax.nn.softmax(logits, axis=-1)


def l1_distance(a, b) -> jax.Array:
  return jnp.sum(jnp.abs(jnp.asarray(a) - jnp.asarray(b)), axis=-1)


def negative_entropy(alpha: jax.Array) -> jax.Array:
  """`sum_i alpha_i log alpha_i` (0 log 0 = 0)."""
  return jnp.sum(jnp.where(alpha > 0, alpha * jnp.log(jnp.where(alpha > 0, alpha, 1.0)), 0.0), -1)


def per_source_mean(values: jax.Array, source: jax.Array, num_sources: int) -> jax.Array:
  """`[K]` mean of `values [B]` over the rows of each source (0 where a source has no row)."""
  onehot = jax.nn.one_hot(source, num_sources, dtype=values.dtype)
  return (onehot.T @ values) / jnp.maximum(onehot.sum(0), 1.0)


def weighted_loss(losses: jax.Array, source: jax.Array, alpha: jax.Array) -> jax.Array:
  """`sum_b alpha_{g(b)} l_b / sum_b alpha_{g(b)}`: the official code's normalised weighted mean;
  with equal rows per source it is `sum_i alpha_i L_i` (Sec. 3.1)."""
  weights = alpha[source]
  return jnp.sum(weights * losses) / jnp.sum(weights)


# ---------------------------------------------------------------------------------------------------
# The hypergradient and the outer update (Sec. 3.2)
# ---------------------------------------------------------------------------------------------------


def tree_dot(a, b) -> jax.Array:
  """`<a, b>` over every leaf of two equal pytrees."""
  return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def alignment(target_grad, source_grads) -> jax.Array:
  """`[K]`: `<g_target, g_i>` for per-source gradients stacked on a leading K axis."""
  return jax.vmap(lambda g: tree_dot(target_grad, g))(source_grads)


def hypergradient(target_grad, source_grads, inner_lr) -> jax.Array:
  """`dL_target(w^{t+1}) / d alpha_i = -eta <grad L_target(w^{t+1}), grad L_i(w^t)>` (Eq. 5)."""
  return -inner_lr * alignment(target_grad, source_grads)


def outer_objective(
  logits: jax.Array, dl_dalpha: jax.Array, entropy_weight: float, entropy_sign: float = 1.0
) -> jax.Array:
  """The surrogate whose z-gradient is the outer gradient: `sum_i softmax(z)_i stop_grad(h_i) +
  sign * lambda * sum_i alpha_i log alpha_i`."""
  alpha = mixture_weights(logits)
  linear = jnp.sum(alpha * jax.lax.stop_gradient(dl_dalpha))
  return linear + entropy_sign * entropy_weight * negative_entropy(alpha)


def outer_gradient(
  logits: jax.Array, dl_dalpha: jax.Array, entropy_weight: float, entropy_sign: float = 1.0
) -> jax.Array:
  """`d objective / dz` of `outer_objective`."""
  return jax.grad(outer_objective)(logits, dl_dalpha, entropy_weight, entropy_sign)


def softmax_chain(logits: jax.Array, dl_dalpha: jax.Array) -> jax.Array:
  """`J^T h` with the softmax Jacobian `J_ij = p_i (delta_ij - p_j)` written out (tests)."""
  p = mixture_weights(logits)
  jacobian = jnp.diag(p) - jnp.outer(p, p)
  return jacobian.T @ dl_dalpha


def unrolled_hypergradient(source_losses_fn, target_loss_fn, params, logits, inner_lr, steps: int):
  """`d L_target(w_n) / dz` by autodiff through `steps` SGD steps
  `w_{k+1} = w_k - eta grad sum_i softmax(z)_i L_i(w_k)`: the reference for `hypergradient`
  (equal to it, through the softmax, for one step). `source_losses_fn(params) -> [K]`."""

  def target_after(z):
    alpha = mixture_weights(z)

    def sgd(w, _):
      grads = jax.grad(lambda v: jnp.sum(alpha * source_losses_fn(v)))(w)
      return jax.tree.map(lambda p, g: p - inner_lr * g, w, grads), None

    final, _ = jax.lax.scan(sgd, params, None, length=steps)
    return target_loss_fn(final)

  return jax.grad(target_after)(logits)


# ---------------------------------------------------------------------------------------------------
# Regression from mixtures to target loss (RegMix, CLIMB)
# ---------------------------------------------------------------------------------------------------


class KernelRidge(NamedTuple):
  inputs: jax.Array  # [n, K]
  coef: jax.Array  # [n]
  offset: jax.Array  # scalar: the mean target
  bandwidth: jax.Array  # scalar
  ridge: jax.Array  # scalar
  loo_error: jax.Array  # leave-one-out mean squared error of the chosen fit


def _rbf(a: jax.Array, b: jax.Array, bandwidth) -> jax.Array:
  sq = jnp.sum(a**2, -1)[:, None] + jnp.sum(b**2, -1)[None, :] - 2 * a @ b.T
  return jnp.exp(-jnp.maximum(sq, 0.0) / (2 * bandwidth**2))


def kernel_ridge_fit(
  inputs: jax.Array,
  targets: jax.Array,
  bandwidths=(0.05, 0.1, 0.2, 0.4, 0.8),
  ridges=(1e-6, 1e-4, 1e-3, 1e-2, 1e-1, 1.0),
  weights: jax.Array | None = None,
) -> KernelRidge:
  """RBF kernel ridge regression with bandwidth and ridge chosen by exact leave-one-out error
  (`r_i = (y_i - yhat_i) / (1 - H_ii)`, `H = K (K + ridge I)^-1`). `weights [n]` in {0, 1} mask
  rows out (a fixed-shape fit on the first rows only)."""
  inputs = jnp.asarray(inputs, jnp.float32)
  targets = jnp.asarray(targets, jnp.float32)
  n = inputs.shape[0]
  mask = jnp.ones(n) if weights is None else jnp.asarray(weights, jnp.float32)
  offset = jnp.sum(mask * targets) / jnp.sum(mask)
  centred = mask * (targets - offset)
  grid = jnp.array([(b, r) for b in bandwidths for r in ridges], jnp.float32)

  def fit(pair):
    bandwidth, ridge = pair
    gram = _rbf(inputs, inputs, bandwidth) * mask[:, None] * mask[None, :]
    system = gram + ridge * jnp.eye(n) + jnp.diag(1.0 - mask)
    coef = jnp.linalg.solve(system, centred)
    hat_diag = jnp.diag(gram @ jnp.linalg.inv(system))
    residual = (centred - gram @ coef) / jnp.maximum(1.0 - hat_diag, 1e-6)
    return coef, jnp.sum(mask * residual**2) / jnp.sum(mask)

  coefs, errors = jax.vmap(fit)(grid)
  best = jnp.argmin(jnp.where(jnp.isfinite(errors), errors, jnp.inf))
  return KernelRidge(inputs, coefs[best] * mask, offset, grid[best, 0], grid[best, 1], errors[best])


def kernel_ridge_predict(model: KernelRidge, inputs: jax.Array) -> jax.Array:
  return model.offset + _rbf(jnp.asarray(inputs, jnp.float32), model.inputs, model.bandwidth) @ (
    model.coef
  )


class QuadraticRidge(NamedTuple):
  coef: jax.Array  # [F] on `quadratic_features`
  offset: jax.Array  # scalar: the mean target
  ridge: jax.Array
  loo_error: jax.Array


def quadratic_features(inputs: jax.Array) -> jax.Array:
  """`[n, K + K(K+1)/2]`: the weights and their pairwise products (a quadratic surface)."""
  k = inputs.shape[-1]
  rows, cols = np.triu_indices(k)
  return jnp.concatenate([inputs, inputs[:, rows] * inputs[:, cols]], axis=-1)


def quadratic_ridge_fit(
  inputs: jax.Array,
  targets: jax.Array,
  ridges=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1),
  weights: jax.Array | None = None,
) -> QuadraticRidge:
  """Ridge regression of the centred targets on `quadratic_features`, the ridge chosen by exact
  leave-one-out error; unlike trees or RBF kernels it extrapolates past the sampled mixtures."""
  features = quadratic_features(jnp.asarray(inputs, jnp.float32))
  targets = jnp.asarray(targets, jnp.float32)
  mask = jnp.ones(targets.shape[0]) if weights is None else jnp.asarray(weights, jnp.float32)
  offset = jnp.sum(mask * targets) / jnp.sum(mask)
  centred = mask * (targets - offset)
  weighted = features * mask[:, None]

  def fit(ridge):
    gram = weighted.T @ weighted + ridge * jnp.eye(features.shape[1])
    coef = jnp.linalg.solve(gram, weighted.T @ centred)
    hat_diag = jnp.sum(weighted * jnp.linalg.solve(gram, weighted.T).T, axis=1)
    residual = (centred - weighted @ coef) / jnp.maximum(1.0 - hat_diag, 1e-6)
    return coef, jnp.sum(mask * residual**2) / jnp.sum(mask)

  grid = jnp.asarray(ridges, jnp.float32)
  coefs, errors = jax.vmap(fit)(grid)
  best = jnp.argmin(jnp.where(jnp.isfinite(errors), errors, jnp.inf))
  return QuadraticRidge(coefs[best], offset, grid[best], errors[best])


class KernelSmoother(NamedTuple):
  inputs: jax.Array  # [n, K]
  targets: jax.Array  # [n]
  mask: jax.Array  # [n] rows in use
  bandwidth: jax.Array
  loo_error: jax.Array


def _smoother_weights(inputs, data, mask, bandwidth) -> jax.Array:
  sq = jnp.sum(inputs**2, -1)[:, None] + jnp.sum(data**2, -1)[None, :] - 2 * inputs @ data.T
  logits = -jnp.maximum(sq, 0.0) / (2 * bandwidth**2)
  return jax.nn.softmax(jnp.where(mask[None, :] > 0, logits, -jnp.inf), axis=-1)


def kernel_smoother_fit(
  inputs: jax.Array,
  targets: jax.Array,
  bandwidths=(0.02, 0.05, 0.1, 0.2, 0.4),
  weights: jax.Array | None = None,
) -> KernelSmoother:
  """Nadaraya-Watson regression `yhat(x) = sum_i K(x, x_i) y_i / sum_i K(x, x_i)` (RBF), the
  bandwidth chosen by leave-one-out error. Its predictions stay within the observed losses and it
  does not extrapolate, as RegMix's gradient-boosted trees."""
  inputs = jnp.asarray(inputs, jnp.float32)
  targets = jnp.asarray(targets, jnp.float32)
  n = inputs.shape[0]
  mask = jnp.ones(n) if weights is None else jnp.asarray(weights, jnp.float32)
  sq = jnp.sum((inputs[:, None] - inputs[None]) ** 2, -1)
  others = (mask[None, :] * (1.0 - jnp.eye(n))) > 0

  def loo(bandwidth):
    logits = jnp.where(others, -sq / (2 * bandwidth**2), -jnp.inf)
    predicted = jax.nn.softmax(logits, axis=-1) @ targets
    return jnp.sum(mask * (predicted - targets) ** 2) / jnp.sum(mask)

  grid = jnp.asarray(bandwidths, jnp.float32)
  errors = jax.vmap(loo)(grid)
  best = jnp.argmin(jnp.where(jnp.isfinite(errors), errors, jnp.inf))
  return KernelSmoother(inputs, targets, mask, grid[best], errors[best])


REGRESSORS = ("smoother", "kernel", "quadratic")


def fit_regressor(kind: str, inputs, targets, weights=None):
  """`kernel_smoother_fit`, `kernel_ridge_fit` or `quadratic_ridge_fit`."""
  if kind == "quadratic":
    return quadratic_ridge_fit(inputs, targets, weights=weights)
  if kind == "kernel":
    return kernel_ridge_fit(inputs, targets, weights=weights)
  return kernel_smoother_fit(inputs, targets, weights=weights)


def predict(model, inputs: jax.Array) -> jax.Array:
  inputs = jnp.asarray(inputs, jnp.float32)
  if isinstance(model, QuadraticRidge):
    return model.offset + quadratic_features(inputs) @ model.coef
  if isinstance(model, KernelSmoother):
    return _smoother_weights(inputs, model.inputs, model.mask, model.bandwidth) @ model.targets
  return kernel_ridge_predict(model, inputs)


def regmix_mixtures(
  key: jax.Array,
  prior: jax.Array,
  num: int,
  temperature: float = 0.5,
  min_strength: float = 0.1,
  max_strength: float = 5.0,
  num_strengths: int = 15,
  minimum: float = 2e-4,
  max_usage: float = 15.0,
  oversample: int = 4,
) -> jax.Array:
  """`[num, K]` RegMix mixtures: Dirichlet(prior^T / sum * s), s uniform among
  `logspace(min, max, num_strengths)`; weights above `max_usage * prior` rejected (the first `num`
  accepted of `oversample * num` draws are kept); weights below `minimum` zeroed; rounded to
  multiples of `minimum`."""
  prior = jnp.asarray(prior, jnp.float32) / jnp.sum(prior)
  tempered = prior**temperature / jnp.sum(prior**temperature)
  strengths = jnp.logspace(jnp.log10(min_strength), jnp.log10(max_strength), num_strengths)
  key_s, key_d = jax.random.split(key)
  total = num * oversample
  chosen = strengths[jax.random.randint(key_s, (total,), 0, num_strengths)]
  draws = jax.random.dirichlet(key_d, tempered[None, :] * chosen[:, None], (total,))
  accept = jnp.all(draws <= jnp.minimum(max_usage * prior, 1.0), axis=-1)
  order = jnp.argsort(~accept, stable=True)
  draws = draws[order[:num]]
  return round_mixtures(draws, minimum)


def round_mixtures(mixtures: jax.Array, minimum: float) -> jax.Array:
  """Weights below `minimum` zeroed, renormalised, rounded to multiples of `minimum`."""
  kept = jnp.where(mixtures < minimum, 0.0, mixtures)
  kept = kept / jnp.maximum(kept.sum(-1, keepdims=True), 1e-12)
  rounded = jnp.round(kept / minimum) * minimum
  return rounded / jnp.maximum(rounded.sum(-1, keepdims=True), 1e-12)


def top_predicted(model, candidates: jax.Array, count: int) -> jax.Array:
  """The `count` candidates with the lowest predicted loss, best first."""
  predicted = predict(model, candidates)
  return candidates[jnp.argsort(predicted)[:count]]


def regmix_select(model, candidates: jax.Array, top_k: int) -> jax.Array:
  """The mean of the `top_k` best-predicted candidates (RegMix's final mixture)."""
  return jnp.mean(top_predicted(model, candidates, top_k), axis=0)


# ---------------------------------------------------------------------------------------------------
# CLIMB, DoReMi, brute force
# ---------------------------------------------------------------------------------------------------


def climb_candidates(
  key: jax.Array, centre: jax.Array, concentration: float, num: int, floor: float = 0.0
) -> jax.Array:
  """`[num, K]` draws from Dirichlet(concentration * (centre + floor) / sum): a region around
  `centre` that narrows as `concentration` grows. CLIMB (Diao et al. 2025, arXiv 2504.13161,
  Sec. 3) draws plain Dirichlet mixtures with no minimum weight, so `floor` defaults to 0; a
  positive floor keeps every source reachable but also keeps the draws away from a sparse centre
  (each draw's expected weight on a source is at least floor / (1 + K floor)). The Dirichlet
  parameter is kept above 1e-6 so that a source at exactly 0 stays a valid (near-zero) draw."""
  base = (centre + floor) / jnp.sum(centre + floor)
  return jax.random.dirichlet(key, jnp.maximum(concentration * base, 1e-6), (num,))


def doremi_update(
  alpha: jax.Array, excess: jax.Array, step_size: float, smoothing: float
) -> jax.Array:
  """`alpha' = (1 - c) normalise(alpha exp(eta excess)) + c / K` (DoReMi, Alg. 1)."""
  logits = jnp.log(jnp.maximum(alpha, 1e-30)) + step_size * excess
  return (1.0 - smoothing) * jax.nn.softmax(logits) + smoothing / alpha.shape[-1]


def simplex_lattice(num_sources: int, active: tuple[int, ...], resolution: int) -> np.ndarray:
  """`[n, K]` every mixture of the `active` sources with weights in {0, 1/r, ..., 1} (the other
  sources at 0): `C(r + a - 1, a - 1)` points."""
  points = []

  def walk(prefix: list[int], left: int, slots: int):
    if slots == 1:
      points.append(prefix + [left])
      return
    for value in range(left + 1):
      walk(prefix + [value], left - value, slots - 1)

  walk([], resolution, len(active))
  out = np.zeros((len(points), num_sources))
  out[:, list(active)] = np.asarray(points, np.float64) / resolution
  return out
