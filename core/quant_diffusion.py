"""QDPM maths and its two baselines.

Paper: "Quantization-Aware Diffusion Models for Maximum Likelihood Training" (QDPM), ICLR 2026,
OpenReview 5ekhMkawuT (no arXiv version; its code link was empty at review time). Claim: with
the denoiser `x_hat = softround(x_t, t) + u * delta_hat`, `u = exp(-1/t^2)`, the reverse VE SDE
ends on the data's quantization grid (Prop. 2), and `L = E[(1/2u) ||u delta_hat - delta_t||^2]`
bounds the discrete NLL with no truncation and no dequantization.

Map to the paper:
- The parameterisation `x_hat = softround + u delta_hat`: `Grid`, `grid_levels`, `softround_moments`,
  `softround`, `qdpm_x_hat`.
- The change of variables `u = exp(-1/t^2)`, `dt/t^3 = du/(2u)`: `t_from_v`, `u_from_t`,
  `sample_u_and_t` (drawn through `v = -ln u = 1/t^2`, our choice for float32).
- The likelihood bound (the VDM continuous-time loss with SNR(t) = 1/t^2, no t_min, no t_max):
  `qdpm_integrand`, `qdpm_train_loss` (C-free), `qdpm_bound_bits_per_dim` (with the analytic
  `C = D ln K`, which we derived and check in `tests/test_quant_diffusion_math.py`),
  `monte_carlo_C_bits_per_dim` (the biased plain estimate, for the study).
- Checks on data of known entropy (ours): the Bayes denoisers of i.i.d. and Markov sources in QDPM's
  parameterisation (`iid_prior_shift`, `markov_prior_shift`), whose expected bound is the entropy, and
  the bound sampled in `ln t` (`log_t_estimates`), finite-variance even for those denoisers and an
  importance-sampled check of the analytic C.
- QDPM-Solver-1 and -2: `qdpm_time_grid`, `qdpm_sample`.
- The baselines of our CPU study (VDM-style discrete model (V), uniformly dequantized model (U)):
  `vdm_discrete_loss`, `dequantized_loss`, `baseline_sample`.

Conventions: `x` has shape `(B, ...)`; per-example results have shape `(B,)`; `t` and `u` are
scalars or `(B,)`. `Grid` holds Python numbers and is static (close over it or mark it static), as
are `t_min`, `t_max`, `num_steps` and `num_u_samples`. Denoisers: QDPM `delta_fn(x_t, t, u) ->
delta_hat`, baselines `x_hat_fn(x_t, t) -> x_hat`, with `t`, `u` of shape `(B,)`; input scaling
(`core.diffusion.network_input`) is the caller's business.
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from core import diffusion

DeltaFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
XHatFn = Callable[[jax.Array, jax.Array], jax.Array]

# Floor on the softround temperature: below t = 1e-10 softround is round in float32 anyway, and the
# floor keeps logits and the derivatives var/t^2, cov/t^3 finite at t = 0.
_MIN_T_SQ = 1e-20
# Clip on v = -ln u = 1/t^2: v -> 0 (t = inf) and v -> inf (u underflows) have probability ~1e-7
# under float32 sampling and a bounded integrand there, so clipping changes the bound by ~1e-12.
_V_MIN, _V_MAX = 1e-12, 80.0


class Grid(NamedTuple):
  """Levels `offset + spacing * k`, `k = 0..num_levels-1` (spacing O(1): `u` underflows below t ~ 0.1)."""

  num_levels: int
  spacing: float = 1.0
  offset: float = 0.0


def grid_levels(grid: Grid) -> jax.Array:
  """The `(K,)` float32 levels."""
  return grid.offset + grid.spacing * jnp.arange(grid.num_levels, dtype=jnp.float32)


def grid_center(grid: Grid) -> float:
  """The mid-level `c`, the prior mean of the samplers (prior `N(c, T^2 I)`, our reading)."""
  return grid.offset + grid.spacing * (grid.num_levels - 1) / 2


def nearest_level(x: jax.Array, grid: Grid) -> jax.Array:
  """`round(x)`: the nearest level per coordinate (the paper's Prop. 2)."""
  k = jnp.clip(jnp.round((x - grid.offset) / grid.spacing), 0, grid.num_levels - 1)
  return grid.offset + grid.spacing * k


def on_grid_fraction(x: jax.Array, grid: Grid, tol: float = 1e-3) -> jax.Array:
  """Fraction of coordinates within `tol` of a level (the study's on-grid metric)."""
  return jnp.mean(jnp.abs(x - nearest_level(x, grid)) <= tol)


def bits_per_dim(nats_per_example: jax.Array, dim: int) -> jax.Array:
  """Nats per example -> bits per dimension (bpd = L / (D ln 2))."""
  return nats_per_example / (dim * math.log(2.0))


def _as_float(x: jax.Array) -> jax.Array:
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _dim(x: jax.Array) -> int:
  return math.prod(x.shape[1:])


def _sum_per_example(x: jax.Array) -> jax.Array:
  return jnp.sum(x, axis=tuple(range(1, x.ndim)))


# --------------------------------------------------------------------------------------------------
# Softround: the posterior mean under an iid uniform prior over the levels
# --------------------------------------------------------------------------------------------------


def _shifted_logits(levels: jax.Array, x: jax.Array, t: jax.Array, grid: Grid) -> jax.Array:
  """`(-(levels - x)^2 + (round(x) - x)^2) / (2 t^2)`, broadcast over `levels`' trailing axis.

  Factored as `-(l - n)(l + n - 2x) / (2 t^2)` around the nearest level `n`, so the largest logit is
  exactly 0: subtracting a huge max logit (`d^2/t^2` at tiny `t`) goes wrong in float32 when XLA
  rounds the two recomputations of a fused softmax differently.
  """
  t_sq = jnp.maximum(jnp.square(t), _MIN_T_SQ)[..., None]
  nearest = nearest_level(x, grid)[..., None]
  return -(levels - nearest) * (levels + nearest - 2.0 * x[..., None]) / (2.0 * t_sq)


def _level_logits(x: jax.Array, t: jax.Array, grid: Grid) -> jax.Array:
  """Posterior logits `-(x^(k) - x)^2 / (2 t^2)` up to a constant, shape `x.shape + (K,)`."""
  return _shifted_logits(grid_levels(grid), x, t, grid)


def softround_moments(x: jax.Array, t: jax.Array, grid: Grid) -> tuple[jax.Array, jax.Array]:
  """Posterior mean and variance of `x_0` given `x_t = x`, iid uniform prior over the levels.

  `softround(x, t)_i = sum_k softmax_k(-(x^(k) - x_i)^2 / (2 t^2)) x^(k)` (the paper's
  parameterisation), a stable softmax over all K levels (restricting it to the levels within ~8t of
  `x_i` is left to a future streaming kernel).
  """
  x = _as_float(x)
  t = jnp.broadcast_to(diffusion.broadcast_time(t, x), x.shape)
  weights = jax.nn.softmax(_level_logits(x, t, grid), axis=-1)
  levels = grid_levels(grid)
  mean = jnp.sum(weights * levels, axis=-1)
  var = jnp.sum(weights * jnp.square(levels - mean[..., None]), axis=-1)
  return mean, var


def softround(x: jax.Array, t: jax.Array, grid: Grid) -> jax.Array:
  """`softround(x, t)` with closed-form derivatives (`d/dx_i = Var_post / t^2`), finite for all `t >= 0`."""
  x = _as_float(x)
  return _softround(grid, x, jnp.broadcast_to(diffusion.broadcast_time(t, x), x.shape))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _softround(grid: Grid, x: jax.Array, t: jax.Array) -> jax.Array:
  return softround_moments(x, t, grid)[0]


@_softround.defjvp
def _softround_jvp(grid, primals, tangents):
  """`d mean/dx = Var/t^2`, `d mean/dt = Cov(x0, (x0 - x)^2)/t^3`: exponential-family identities."""
  x, t = primals
  x_dot, t_dot = tangents
  levels = grid_levels(grid)
  weights = jax.nn.softmax(_level_logits(x, t, grid), axis=-1)
  mean = jnp.sum(weights * levels, axis=-1)
  centred = levels - mean[..., None]
  var = jnp.sum(weights * jnp.square(centred), axis=-1)
  cov = jnp.sum(weights * centred * jnp.square(levels - x[..., None]), axis=-1)
  t_sq = jnp.maximum(jnp.square(t), _MIN_T_SQ)
  return mean, var / t_sq * x_dot + cov / (t_sq * jnp.sqrt(t_sq)) * t_dot


def qdpm_x_hat(
  delta_hat: jax.Array, x_t: jax.Array, t: jax.Array, u: jax.Array, grid: Grid
) -> jax.Array:
  """`x_hat = softround(x_t, t) + u * delta_hat` (the paper's parameterisation)."""
  return softround(x_t, t, grid) + diffusion.broadcast_time(u, x_t) * delta_hat


# --------------------------------------------------------------------------------------------------
# Time variables
# --------------------------------------------------------------------------------------------------


def t_from_v(v: jax.Array) -> jax.Array:
  """`t = v^(-1/2)` with `v = -ln u = 1/t^2`."""
  return jax.lax.rsqrt(jnp.asarray(v, jnp.float32))


def u_from_t(t: jax.Array) -> jax.Array:
  """`u = exp(-1/t^2)`; `u(0) = 0`."""
  return jnp.exp(-1.0 / jnp.square(jnp.asarray(t, jnp.float32)))


def _clip_v(v: jax.Array) -> jax.Array:
  return jnp.clip(v, _V_MIN, _V_MAX)


def _sample_v(rng: jax.Array, batch: int) -> jax.Array:
  """`v = -ln u ~ Exp(1)` for `u ~ U(0, 1)`: no `log(1 - eps)` cancellation at `u ~ 1` (1.1)."""
  return _clip_v(jax.random.exponential(rng, (batch,), jnp.float32))


def sample_u_and_t(rng: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
  """`u ~ U(0, 1)` and `t(u) = (-ln u)^(-1/2)`, drawn through `v` (no cancellation near u = 1)."""
  v = _sample_v(rng, batch)
  return jnp.exp(-v), t_from_v(v)


def _stratified_v(rng: jax.Array, stratum: jax.Array, num_strata: int, batch: int) -> jax.Array:
  """`v = -ln u` for `u ~ U[i/M, (i+1)/M)`, as `-log1p(-(1 - u))` to stay exact as `u -> 1`."""
  jitter = jax.random.uniform(rng, (batch,), jnp.float32)
  one_minus_u = (num_strata - stratum - jitter) / num_strata
  return _clip_v(-jnp.log1p(-one_minus_u))


# --------------------------------------------------------------------------------------------------
# QDPM bound
# --------------------------------------------------------------------------------------------------


def qdpm_integrand(
  delta_fn: DeltaFn, x0: jax.Array, eps: jax.Array, v: jax.Array, grid: Grid
) -> jax.Array:
  """Per-example `delta_hat^T ((u/2) delta_hat - delta_t)` at `v = -ln u` (shape `(B,)`), in nats.

  `delta_t = x0 - softround(x_t, t)`, `x_t = x0 + t eps`: the theta-dependent part of the bound
  `L = E[(1/2u) ||u delta_hat - delta_t||^2] = E[this] + C`. Exactly 0 for
  `delta_hat = 0`.
  """
  x0 = _as_float(x0)
  v = _clip_v(v)
  t, u = t_from_v(v), jnp.exp(-v)
  x_t = diffusion.ve_perturb(x0, t, eps)
  delta_t = x0 - softround(x_t, t, grid)
  delta_hat = delta_fn(x_t, t, u)
  return _sum_per_example(delta_hat * (0.5 * diffusion.broadcast_time(u, x0) * delta_hat - delta_t))


def qdpm_train_loss(delta_fn: DeltaFn, x0: jax.Array, rng: jax.Array, grid: Grid) -> jax.Array:
  """Per-example C-free training loss in nats, one `u ~ U(0, 1)` and `eps` per example.

  Same gradient as the full bound; add `D ln K` (or use `qdpm_bound_bits_per_dim`) for a bound.
  """
  key_v, key_eps = jax.random.split(rng)
  eps = jax.random.normal(key_eps, x0.shape, jnp.float32)
  return qdpm_integrand(delta_fn, x0, eps, _sample_v(key_v, x0.shape[0]), grid)


def qdpm_bound_bits_per_dim(
  delta_fn: DeltaFn, x0: jax.Array, rng: jax.Array, grid: Grid, num_u_samples: int
) -> tuple[jax.Array, jax.Array]:
  """Full bound in bits/dim per example, and its Monte-Carlo standard error.

  bpd `= log2 K + E[delta_hat^T ((u/2) delta_hat - delta_t)] / (D ln 2)`: `C = D ln K` exactly for
  every on-grid `x0`, so only the finite-variance theta term is sampled. Its `M = num_u_samples`
  draws are stratified, `u_i ~ U[i/M, (i+1)/M)` with fresh `eps` each; the standard error uses the
  iid formula `std / sqrt(M)`, which over-estimates the stratified error (conservative). `M >= 2`.
  """
  x0 = _as_float(x0)

  def one_stratum(inputs):
    stratum, key = inputs
    key_v, key_eps = jax.random.split(key)
    v = _stratified_v(key_v, stratum, num_u_samples, x0.shape[0])
    eps = jax.random.normal(key_eps, x0.shape, jnp.float32)
    return qdpm_integrand(delta_fn, x0, eps, v, grid)

  strata = jnp.arange(num_u_samples, dtype=jnp.float32)
  terms = jax.lax.map(one_stratum, (strata, jax.random.split(rng, num_u_samples)))
  dim = _dim(x0)
  mean = math.log2(grid.num_levels) + bits_per_dim(jnp.mean(terms, axis=0), dim)
  std_err = bits_per_dim(jnp.std(terms, axis=0, ddof=1) / math.sqrt(num_u_samples), dim)
  return mean, std_err


def monte_carlo_C_bits_per_dim(
  x0: jax.Array, rng: jax.Array, grid: Grid, num_u_samples: int
) -> jax.Array:
  """Plain Monte-Carlo `C = E[||delta_t||^2 / (2u)]` in bits/dim per example, iid `u ~ U(0, 1)`.

  The estimator a naive evaluation of the full form would use: its variance is infinite (integrand
  ~ u^(-7/8) as u -> 0), so it comes out biased low against the exact `log2 K`.
  """
  x0 = _as_float(x0)

  def one_sample(key):
    key_v, key_eps = jax.random.split(key)
    v = _sample_v(key_v, x0.shape[0])
    x_t = diffusion.ve_perturb(x0, t_from_v(v), jax.random.normal(key_eps, x0.shape, jnp.float32))
    delta_t = x0 - softround(x_t, t_from_v(v), grid)
    return 0.5 * jnp.exp(v) * _sum_per_example(jnp.square(delta_t))

  terms = jax.lax.map(one_sample, jax.random.split(rng, num_u_samples))
  return bits_per_dim(jnp.mean(terms, axis=0), _dim(x0))


# --------------------------------------------------------------------------------------------------
# Closed-form denoisers of known sources, and a finite-variance estimator in log t
# --------------------------------------------------------------------------------------------------

ShiftFn = Callable[[jax.Array, jax.Array], jax.Array]


def _shift_from_posterior(
  log_posterior: jax.Array, x: jax.Array, t: jax.Array, grid: Grid
) -> jax.Array:
  """`E[x_0 | x_t] - softround(x_t, t)` from posterior logits over the levels, `(..., K) -> (...)`.

  Summed as `sum_k (w_k - w^unif_k)(x^(k) - round(x))`: the nearest level's weights, both ~1, drop
  out, so the tiny difference of two means near the grid keeps its relative precision.
  """
  uniform = jax.nn.softmax(_level_logits(x, t, grid), axis=-1)
  weights = jax.nn.softmax(log_posterior, axis=-1)
  centred = grid_levels(grid) - nearest_level(x, grid)[..., None]
  return jnp.sum((weights - uniform) * centred, axis=-1)


def iid_prior_shift(x: jax.Array, t: jax.Array, log_probs: jax.Array, grid: Grid) -> jax.Array:
  """`u delta*` of the Bayes denoiser for pixels i.i.d. with level log-probabilities `log_probs (K,)`:
  `E_p[x_0 | x_t] - softround(x_t, t)`, the posterior being `softmax(log p_k - (x^(k) - x)^2 / 2t^2)`."""
  x = _as_float(x)
  t = jnp.broadcast_to(diffusion.broadcast_time(t, x), x.shape)
  return _shift_from_posterior(_level_logits(x, t, grid) + log_probs, x, t, grid)


def markov_prior_shift(
  x: jax.Array, t: jax.Array, log_initial: jax.Array, log_transition: jax.Array, grid: Grid
) -> jax.Array:
  """`u delta*` of the Bayes denoiser for a Markov chain along the last axis of `x (B, D)`.

  Forward-backward in log space: the chain `x_0` has initial law `log_initial (K,)` and transition
  `log_transition[i, j] = log P(j | i)`; each `x_t,d = x_0,d + t eps_d` is a Gaussian emission. The
  posterior marginal of `x_0,d` is `softmax(log alpha_d + log beta_d)`.
  """
  x = _as_float(x)
  t = jnp.broadcast_to(diffusion.broadcast_time(t, x), x.shape)
  emission = jnp.moveaxis(_level_logits(x, t, grid), 1, 0)  # (D, B, K)

  def forward(log_alpha, log_e):
    log_alpha = jax.nn.logsumexp(log_alpha[..., None] + log_transition, axis=-2) + log_e
    return log_alpha, log_alpha

  def backward(log_beta, log_e):
    new = jax.nn.logsumexp(log_transition + (log_e + log_beta)[..., None, :], axis=-1)
    return new, log_beta

  first = log_initial + emission[0]
  _, rest = jax.lax.scan(forward, first, emission[1:])
  log_alpha = jnp.concatenate([first[None], rest])
  beta_first, beta_rest = jax.lax.scan(backward, jnp.zeros_like(first), emission[1:], reverse=True)
  log_beta = jnp.concatenate([beta_first[None], beta_rest])
  log_posterior = jnp.moveaxis(log_alpha + log_beta, 0, 1)
  return _shift_from_posterior(log_posterior, x, t, grid)


def log_t_proposal(grid: Grid) -> tuple[float, float]:
  """Location and scale of the logistic proposal for `ln t` of `log_t_estimates`.

  `t^-2 E||delta_t||^2` is roughly flat from `t ~ spacing / 2` to `t ~` the levels' standard deviation
  and falls off outside; the proposal is centred on that plateau, its scale a quarter of its width
  plus 1/2 (any scale above 1/4 gives a finite variance against the `t^-2` tail).
  """
  low = math.log(0.5 * grid.spacing)
  high = math.log(grid.spacing * math.sqrt((grid.num_levels**2 - 1) / 12))
  return 0.5 * (low + high), 0.25 * (high - low) + 0.5


def log_t_estimates(
  shift_fn: ShiftFn | None, x0: jax.Array, rng: jax.Array, grid: Grid, num_samples: int
) -> dict[str, jax.Array]:
  """The bound in `t`, sampled through `ln t`: per example, in bits/dim, with standard errors.

  With `du / (2u) = dt / t^3` both parts of the bound become integrals over `ln t` of bounded
  integrands: `C = int t^-2 ||delta_t||^2 d ln t` and the theta term
  `E_u[delta_hat . ((u/2) delta_hat - delta_t)] = int t^-2 s . (s - 2 delta_t) d ln t`, `s = u delta_hat`
  (`shift_fn(x_t, t) -> s`; None: `s = 0`). `ln t` is drawn from a logistic (`log_t_proposal`),
  stratified in its CDF, weighted by the inverse density. Unlike uniform `u` this has finite variance
  even for an unbounded `delta_hat` (the Bayes denoiser's grows like `1/u`), so it gives
  - `"bound"`: `log2 K + theta` (analytic C), `"C"`: `C / (D ln 2)`, an importance-sampled check of
    the analytic `log2 K`, and their `"..._stderr"` (iid formula over the `num_samples` draws).
  """
  x0 = _as_float(x0)
  loc, scale = log_t_proposal(grid)

  def one_stratum(inputs):
    stratum, key = inputs
    key_p, key_eps = jax.random.split(key)
    jitter = jax.random.uniform(key_p, x0.shape[:1], jnp.float32)
    p = jnp.maximum((stratum + jitter) / num_samples, 1e-12)
    q = jnp.maximum((num_samples - stratum - jitter) / num_samples, 1e-12)  # 1 - p, exactly
    t = jnp.exp(loc + scale * (jnp.log(p) - jnp.log(q)))
    weight = scale / (p * q * jnp.square(t))  # 1 / (logistic density * t^2)
    x_t = diffusion.ve_perturb(x0, t, jax.random.normal(key_eps, x0.shape, jnp.float32))
    delta_t = x0 - softround(x_t, t, grid)
    s = jnp.zeros_like(x0) if shift_fn is None else shift_fn(x_t, t)
    return weight * _sum_per_example(s * (s - 2.0 * delta_t)), weight * _sum_per_example(
      jnp.square(delta_t)
    )

  strata = jnp.arange(num_samples, dtype=jnp.float32)
  theta, c = jax.lax.map(one_stratum, (strata, jax.random.split(rng, num_samples)))
  dim = _dim(x0)

  def mean_and_stderr(terms):
    return bits_per_dim(jnp.mean(terms, 0), dim), bits_per_dim(
      jnp.std(terms, 0, ddof=1) / math.sqrt(num_samples), dim
    )

  (theta_mean, theta_se), (c_mean, c_se) = mean_and_stderr(theta), mean_and_stderr(c)
  return {
    "bound": math.log2(grid.num_levels) + theta_mean,
    "bound_stderr": theta_se,
    "C": c_mean,
    "C_stderr": c_se,
  }


# --------------------------------------------------------------------------------------------------
# QDPM-Solver-1/2
# --------------------------------------------------------------------------------------------------


def qdpm_time_grid(num_steps: int, t_max: float) -> tuple[jax.Array, jax.Array]:
  """Times `t(u_j)` for `u_j = u_max j/N`, `j = N..1`, and the u-midpoints `u_max (j - 1/2)/N`.

  `u_max = exp(-1/t_max^2)`, so the first node is the prior's time `t_max`. Built in `v`:
  `v = 1/t_max^2 + ln(N/j)` is exact where `u` would round to 1 in float32.
  """
  n = num_steps
  j = jnp.arange(n, 0, -1, dtype=jnp.float32)
  v_max_u = 1.0 / jnp.square(jnp.asarray(t_max, jnp.float32))
  ts = t_from_v(v_max_u + jnp.log(n / j))
  mid_ts = t_from_v(v_max_u + jnp.log(n / (j[:-1] - 0.5)))
  return ts, mid_ts


def qdpm_sample(
  delta_fn: DeltaFn,
  rng: jax.Array,
  shape: tuple[int, ...],
  grid: Grid,
  num_steps: int,
  order: int = 1,
  t_max_prior: float = 80.0,
  snap_to_grid: bool = True,
) -> jax.Array:
  """QDPM-Solver-`order` samples of `shape`.

  Prior `x_T ~ N(c, T^2 I)`, `T = t_max_prior`, `c = grid_center`; time grid uniform in `u` on
  `(0, u_max]`, `u_max = exp(-1/T^2)` (`T = 80`: `u_max = exp(-1/6400)`), `num_steps` nodes, so
  the first node is the prior's own time. Order 1: exact Gaussian transitions
  `q(x_t | x_s, x_0 = x_hat)` (`num_steps` evaluations). Order 2 [inferred]: the same transitions
  with the midpoint prediction of `core.diffusion.ve_midpoint_x_hat`, midpoint in `u`
  (`2 num_steps - 1` evaluations). The step from the last node `u_max/N` to `t = 0` returns
  `x_hat(x_s, s)`; with `snap_to_grid` that is mapped through `x_hat(., 0) = round` (Prop. 2:
  `u(0) = 0`, no network call). `snap_to_grid=False` returns the solver's own last prediction (for
  N = 32 its `t` is 0.54: mostly off the grid).
  """
  ts, mid_ts = qdpm_time_grid(num_steps, t_max_prior)

  def x_hat_fn(x_t, t):
    u = u_from_t(t)
    return qdpm_x_hat(delta_fn(x_t, t, u), x_t, t, u, grid)

  key_init, key_steps = jax.random.split(rng)
  x_init = grid_center(grid) + ts[0] * jax.random.normal(key_init, shape, jnp.float32)
  if order == 1:
    x = diffusion.ve_ancestral_sample(key_steps, x_hat_fn, x_init, ts)
  elif order == 2:
    x = diffusion.ve_midpoint_sample(key_steps, x_hat_fn, x_init, ts, mid_ts)
  else:
    raise ValueError(f"order must be 1 or 2, got {order}")
  return nearest_level(x, grid) if snap_to_grid else x


# --------------------------------------------------------------------------------------------------
# Baselines of the CPU study: VDM-style discrete model (V) and uniformly dequantized model (U)
# --------------------------------------------------------------------------------------------------


def _diffusion_term(
  x_hat_fn: XHatFn, x0: jax.Array, rng: jax.Array, t_min: float, t_max: float
) -> jax.Array:
  """`int_{t_min}^{t_max} t^-3 ||x0 - x_hat(x_t, t)||^2 dt`, one draw per example, `ln t ~ U`.

  Importance sampling uniform in `ln t` (uniform in log-SNR): `dt / t^3 = t^-2 d(ln t)`, so the
  estimate is `ln(t_max / t_min) ||x0 - x_hat||^2 / t^2`.
  """
  key_t, key_eps = jax.random.split(rng)
  log_t = jax.random.uniform(key_t, x0.shape[:1], jnp.float32, math.log(t_min), math.log(t_max))
  t = jnp.exp(log_t)
  x_t = diffusion.ve_perturb(x0, t, jax.random.normal(key_eps, x0.shape, jnp.float32))
  sq_err = _sum_per_example(jnp.square(x0 - x_hat_fn(x_t, t)))
  return math.log(t_max / t_min) * sq_err / jnp.square(t)


def _prior_kl(x0: jax.Array, grid: Grid, t_max: float) -> jax.Array:
  """`KL(N(x0, t_max^2 I) || N(c, t_max^2 I)) = ||x0 - c||^2 / (2 t_max^2)` (equal variances)."""
  return _sum_per_example(jnp.square(x0 - grid_center(grid))) / (2.0 * t_max**2)


def categorical_decoder_log_probs(z: jax.Array, t: jax.Array, grid: Grid) -> jax.Array:
  """`log p(x0 = x^(k) | z)`, `p ∝ N(z; x^(k), t^2)` per coordinate, shape `z.shape + (K,)`."""
  z = _as_float(z)
  t = jnp.broadcast_to(diffusion.broadcast_time(t, z), z.shape)
  return jax.nn.log_softmax(_level_logits(z, t, grid), axis=-1)


def vdm_discrete_loss(
  x_hat_fn: XHatFn, x0: jax.Array, rng: jax.Array, grid: Grid, t_min: float, t_max: float
) -> jax.Array:
  """Per-example VDM bound on the discrete NLL of on-grid `x0`, in nats (baseline (V)).

  `-log p(x0) <= KL(q(z_tmax|x0) || N(c, t_max^2 I)) + int_{t_min}^{t_max} t^-3 E||x0 - x_hat||^2 dt
  + E[-log p(x0 | z_tmin)]`: VDM's continuous-time bound with SNR `1/t^2` (`-SNR'/2 = t^-3`),
  truncated at `t_min` with the categorical decoder `p(x0 = x^(k) | z) ∝ N(z; x^(k), t_min^2)` per
  coordinate (VDM's `p(x|z_0) ∝ q(z_0|x)`), `z_tmin = x0 + t_min eps`. Diffusion term: one
  `ln t ~ U` draw per example (`_diffusion_term`). Decoder NLL: `logsumexp_k logit_k - logit(x0)`.
  """
  x0 = _as_float(x0)
  key_diff, key_dec = jax.random.split(rng)
  z = diffusion.ve_perturb(x0, t_min, jax.random.normal(key_dec, x0.shape, jnp.float32))
  t_min_full = jnp.full_like(z, t_min)
  logits = _level_logits(z, t_min_full, grid)
  true_logit = _shifted_logits(x0[..., None], z, t_min_full, grid)[..., 0]
  decoder_nll = _sum_per_example(jax.nn.logsumexp(logits, axis=-1) - true_logit)
  diffusion_term = _diffusion_term(x_hat_fn, x0, key_diff, t_min, t_max)
  return _prior_kl(x0, grid, t_max) + diffusion_term + decoder_nll


def dequantized_loss(
  x_hat_fn: XHatFn, x0: jax.Array, rng: jax.Array, grid: Grid, t_min: float, t_max: float
) -> jax.Array:
  """Per-example bound on the discrete NLL through uniform dequantization, in nats (baseline (U)).

  `y = x0 + spacing * U[0, 1)^D`. `-log P(x0) <= -E_y log p(y) - D ln(spacing)` (Jensen over the
  cell), and `-log p(y) <=` prior KL + diffusion term (as in `vdm_discrete_loss`, on `y`) + Gaussian
  decoder NLL `-log N(y; x_hat(z_tmin, t_min), t_min^2 I)`, `z_tmin = y + t_min eps`, centred on the
  model's posterior mean `z + t_min^2 score` rather than on `z` (VDM's choice for continuous data).
  """
  x0 = _as_float(x0)
  key_y, key_diff, key_dec = jax.random.split(rng, 3)
  y = x0 + grid.spacing * jax.random.uniform(key_y, x0.shape, jnp.float32)
  z = diffusion.ve_perturb(y, t_min, jax.random.normal(key_dec, y.shape, jnp.float32))
  t_min_batch = jnp.full(y.shape[:1], t_min, jnp.float32)
  sq_err = _sum_per_example(jnp.square(y - x_hat_fn(z, t_min_batch)))
  dim = _dim(y)
  decoder_nll = sq_err / (2.0 * t_min**2) + 0.5 * dim * math.log(2.0 * math.pi * t_min**2)
  diffusion_term = _diffusion_term(x_hat_fn, y, key_diff, t_min, t_max)
  volume = dim * math.log(grid.spacing)
  return _prior_kl(y, grid, t_max) + diffusion_term + decoder_nll - volume


def baseline_sample(
  x_hat_fn: XHatFn,
  rng: jax.Array,
  shape: tuple[int, ...],
  grid: Grid,
  num_steps: int,
  t_min: float,
  t_max: float,
) -> jax.Array:
  """Ancestral VE samples for the baselines: `x_hat(z_tmin, t_min)`, not rounded.

  Prior `N(c, t_max^2 I)`; `num_steps` nodes uniform in `ln t` from `t_max` to `t_min` (the
  baselines' importance distribution in training). Dequantized models give `y`: floor it to a level.
  """
  key_init, key_steps = jax.random.split(rng)
  ts = jnp.exp(jnp.linspace(math.log(t_max), math.log(t_min), num_steps, dtype=jnp.float32))
  x_init = grid_center(grid) + t_max * jax.random.normal(key_init, shape, jnp.float32)
  return diffusion.ve_ancestral_sample(key_steps, x_hat_fn, x_init, ts)
