"""Gaussian-process meta-learning tasks with their exact joint densities (the oracle).

The 1-D GP regression benchmark of transformer neural processes (Garnelo et al. 2018; Nguyen &
Grover 2022, "Transformer Neural Processes"), used by the GP experiments of "Efficient
Autoregressive Inference for Transformer Probabilistic Models" (ICLR 2026): each task draws a kernel
(RBF or Matern-5/2) and a lengthscale `l ~ U[l_min, l_max]`, inputs `x ~ U[x_min, x_max]`, and
noisy outputs `y ~ N(0, K_l(x, x) + (sigma_n^2 + jitter) I)` with unit output scale. Because the
prior is known, `log p(y_T | x_T, C)` is exact (a Gaussian conditional): the upper bound, in
expectation, of any model's joint log-likelihood of the same targets.

  `sample_tasks`         x, y, lengthscale and kernel id of `num_tasks` tasks of `num_points` each.
  `conditional_log_density`  the exact joint `log p(y_T | x_T, x_C, y_C)` (padded contexts allowed).
  `marginal_log_density`     the exact sum of the per-target marginals `sum_m log p(y_m | x_m, C)`.
  `posterior`                the Gaussian conditional itself (mean and covariance of the targets).
Pure functions of plain arguments and keys; everything in float32 with a Cholesky factorisation.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

KERNELS = ("rbf", "matern52")


@dataclasses.dataclass(frozen=True)
class GPPrior:
  """The task distribution (defaults: the CPU benchmark of the paper's GP experiments)."""

  kernels: tuple[str, ...] = KERNELS
  lengthscale_min: float = 0.2
  lengthscale_max: float = 0.8
  noise_std: float = 0.05
  jitter: float = 1e-5
  x_min: float = -2.0
  x_max: float = 2.0

  def __post_init__(self):
    unknown = [k for k in self.kernels if k not in KERNELS]
    if unknown or not self.kernels:
      raise ValueError(
        f"GPPrior.kernels must be a non-empty subset of {KERNELS}, got {self.kernels}"
      )
    if not 0 < self.lengthscale_min <= self.lengthscale_max:
      raise ValueError(
        f"GPPrior: need 0 < lengthscale_min <= lengthscale_max, got {self.lengthscale_min}, "
        f"{self.lengthscale_max}"
      )

  @property
  def kernel_ids(self) -> tuple[int, ...]:
    return tuple(KERNELS.index(k) for k in self.kernels)


def kernel_matrix(x1, x2, lengthscale, kernel_id) -> jax.Array:
  """`k(x1_i, x2_j)` for 1-D inputs `[P1]`, `[P2]`: RBF `exp(-r^2 / 2l^2)` (id 0) or Matern-5/2
  `(1 + sqrt5 r/l + 5r^2/3l^2) exp(-sqrt5 r/l)` (id 1); unit output scale."""
  r = jnp.abs(x1[:, None] - x2[None, :]) / lengthscale
  rbf = jnp.exp(-0.5 * r**2)
  s5 = math.sqrt(5.0) * r
  matern = (1.0 + s5 + s5**2 / 3.0) * jnp.exp(-s5)
  return jnp.where(kernel_id == 0, rbf, matern)


def _covariance(x, lengthscale, kernel_id, prior: GPPrior) -> jax.Array:
  noise = prior.noise_std**2 + prior.jitter
  return kernel_matrix(x, x, lengthscale, kernel_id) + noise * jnp.eye(x.shape[0])


def sample_task(key, num_points: int, prior: GPPrior = GPPrior()) -> dict[str, jax.Array]:
  """One task: `x [P]`, `y [P]` (noisy), `lengthscale []`, `kernel []` (index into `KERNELS`)."""
  k_kernel, k_length, k_x, k_y = jax.random.split(key, 4)
  kernel = jnp.asarray(prior.kernel_ids)[jax.random.randint(k_kernel, (), 0, len(prior.kernels))]
  lengthscale = jax.random.uniform(
    k_length, (), minval=prior.lengthscale_min, maxval=prior.lengthscale_max
  )
  x = jax.random.uniform(k_x, (num_points,), minval=prior.x_min, maxval=prior.x_max)
  chol = jnp.linalg.cholesky(_covariance(x, lengthscale, kernel, prior))
  y = chol @ jax.random.normal(k_y, (num_points,))
  return {"x": x, "y": y, "lengthscale": lengthscale, "kernel": kernel}


def sample_tasks(key, num_tasks: int, num_points: int, prior: GPPrior = GPPrior()):
  """`num_tasks` independent tasks, each field with a leading `[num_tasks]` axis."""
  return jax.vmap(lambda k: sample_task(k, num_points, prior))(jax.random.split(key, num_tasks))


def posterior(
  x_ctx, y_ctx, x_tgt, lengthscale, kernel_id, prior: GPPrior = GPPrior(), ctx_valid=None
):
  """Mean `[M]` and covariance `[M, M]` of the noisy targets given the valid context points.

  Padding (`ctx_valid` False) is decoupled: its rows/columns of the context covariance become the
  identity and its cross-covariances and outputs zero, so it conditions on nothing."""
  valid = jnp.ones(x_ctx.shape, bool) if ctx_valid is None else ctx_valid
  pair = valid[:, None] & valid[None, :]
  k_cc = jnp.where(pair, _covariance(x_ctx, lengthscale, kernel_id, prior), jnp.eye(x_ctx.shape[0]))
  k_tc = jnp.where(valid[None, :], kernel_matrix(x_tgt, x_ctx, lengthscale, kernel_id), 0.0)
  y_c = jnp.where(valid, y_ctx, 0.0)
  chol = jnp.linalg.cholesky(k_cc)
  solve = lambda b: jax.scipy.linalg.cho_solve((chol, True), b)  # noqa: E731
  mean = k_tc @ solve(y_c)
  cov = _covariance(x_tgt, lengthscale, kernel_id, prior) - k_tc @ solve(k_tc.T)
  return mean, cov


def conditional_log_density(
  x_ctx, y_ctx, x_tgt, y_tgt, lengthscale, kernel_id, prior: GPPrior = GPPrior(), ctx_valid=None
) -> jax.Array:
  """Exact `log p(y_T | x_T, x_C, y_C)` of one task (a scalar, in nats)."""
  mean, cov = posterior(x_ctx, y_ctx, x_tgt, lengthscale, kernel_id, prior, ctx_valid)
  return jax.scipy.stats.multivariate_normal.logpdf(y_tgt, mean, cov)


def marginal_log_density(
  x_ctx, y_ctx, x_tgt, y_tgt, lengthscale, kernel_id, prior: GPPrior = GPPrior(), ctx_valid=None
) -> jax.Array:
  """Exact `sum_m log p(y_m | x_m, x_C, y_C)`: the best that independent predictions can do."""
  mean, cov = posterior(x_ctx, y_ctx, x_tgt, lengthscale, kernel_id, prior, ctx_valid)
  return jnp.sum(jax.scipy.stats.norm.logpdf(y_tgt, mean, jnp.sqrt(jnp.diag(cov))))
