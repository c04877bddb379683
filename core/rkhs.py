"""Kernels on state-action pairs, kernel TD and the exponentiated (KL-proximal) policy step.

Zou, Ren, Zhang, Ding, Li, "Sampling Complexity of TD and PPO in RKHS" (ICLR 2026, arXiv 2509.24991).
Notation of the paper's Alg. 1 ("NPG in RKHS"): omega = (s, a); a batch of n one-step tuples
(omega0_i, r_i, omega1_i); K_ij = K(omega0_i, omega0_j), C_ij = K(omega1_i, omega0_j).

* Kernel. K((s, a), (s', a')) = k_RBF(s, s') 1[a = a'] (`state_action_gram`). An action enters as a
  weight vector over actions: one-hot for a taken or sampled action, pi(.|s) for the expectation over
  a1 (then C_ij = k(s1_i, s0_j) pi(a0_j | s1_i)). Random Fourier features (Rahimi and Recht 2007)
  approximate k_RBF, and phi(s) (x) e_a the product kernel (`random_features`, `feature_values`).
* Kernel TD in coefficient form (Alg. 1 (ii), the paper's RKHS functional-gradient iteration): with
  f = sum_i b_i K(omega0_i, .), f_{t+1} = (1 - alpha) f_t - eta sum_i delta_i K(omega0_i, .) is
  b_{t+1} = (1 - alpha) b_t - eta (K b_t - r - gamma C b_t)  (`kernel_td_iterate`), whose fixed point
  is b = (K + (alpha/eta) I - gamma C)^{-1} r, the fixed-point kernel ridge regression with
  lambda n = alpha / eta (`kernel_td_fixed_point`). Terminal transitions carry a zero discount, so
  `discounts` is the vector gamma (1 - terminal_i) and gamma C is diag(discounts) C.
* The same iteration on features theta (primal form, `feature_td_iterate`): theta = Psi0^T b, so its
  fixed point predicts exactly what the coefficient form predicts with K = Psi0 Psi0^T.
* Policy step (Alg. 1 (iii)): pi_{k+1} = argmax_pi Delta_k <f^(k), pi> - KL(pi || pi_k)
  = softmax(log pi_k + Delta_k f^(k)) (`proximal_policy_update`), so
  pi_{k+1} = softmax(sum_{j<=k} Delta_j f^(j)): the logits are one kernel expansion whose
  coefficients accumulate (`KernelExpansion` for the exact kernel, `Theta_k = Theta_{k-1} +
  Delta_k theta^(k)` for features).
* One critic per batch (`exact_td_critic`, `feature_td_critic`): the iteration or the closed form,
  and the mean squared TD residual of the result over the valid rows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# ---------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------


def _check_points(name: str, x: jax.Array) -> None:
  if x.ndim != 2:
    raise ValueError(f"{name}: expected points of shape (n, d), got {x.shape}")


def rbf_gram(x: jax.Array, y: jax.Array, lengthscale: float | jax.Array = 1.0) -> jax.Array:
  """`k(x_i, y_j) = exp(-||(x_i - y_j) / lengthscale||^2 / 2)`, `(n, m)`; `lengthscale` scalar or (d,)."""
  _check_points("x", x)
  _check_points("y", y)
  if x.shape[1] != y.shape[1]:
    raise ValueError(f"x and y differ in dimension: {x.shape} vs {y.shape}")
  x, y = x / lengthscale, y / lengthscale
  sq = (
    jnp.sum(x * x, -1)[:, None] + jnp.sum(y * y, -1)[None, :] - 2.0 * x @ y.T
  )  # MXU-friendly; clipped below for rounding
  return jnp.exp(-0.5 * jnp.maximum(sq, 0.0))


def state_action_gram(
  x: jax.Array,
  x_actions: jax.Array,
  y: jax.Array,
  y_actions: jax.Array,
  lengthscale: float | jax.Array = 1.0,
) -> jax.Array:
  """`K((x_i, a_i), (y_j, a_j)) = k_RBF(x_i, y_j) <w_i, w_j>` with action weights `(n, A)`, `(m, A)`.

  One-hot weights give the indicator 1[a_i = a_j]; probabilities give the expectation over actions.
  """
  if x_actions.shape[0] != x.shape[0] or y_actions.shape[0] != y.shape[0]:
    raise ValueError(
      f"action weights must have one row per point: x {x.shape} / {x_actions.shape}, "
      f"y {y.shape} / {y_actions.shape}"
    )
  return rbf_gram(x, y, lengthscale) * (x_actions @ y_actions.T)


class RandomFeatures(NamedTuple):
  """Random Fourier features of k_RBF: phi(x) = sqrt(2/D) cos(x W + c), W ~ N(0, 1/l^2), c ~ U[0, 2pi)."""

  frequencies: jax.Array  # (d, D)
  phases: jax.Array  # (D,)


def random_features(
  rng: jax.Array, dim: int, num_features: int, lengthscale: float | jax.Array = 1.0
) -> RandomFeatures:
  if num_features <= 0 or dim <= 0:
    raise ValueError(f"need dim > 0 and num_features > 0, got {dim}, {num_features}")
  freq_rng, phase_rng = jax.random.split(rng)
  lengthscale = jnp.broadcast_to(jnp.asarray(lengthscale, jnp.float32), (dim,))
  frequencies = jax.random.normal(freq_rng, (dim, num_features)) / lengthscale[:, None]
  phases = jax.random.uniform(phase_rng, (num_features,), maxval=2 * jnp.pi)
  return RandomFeatures(frequencies, phases)


def feature_map(features: RandomFeatures, x: jax.Array) -> jax.Array:
  """`phi(x)`, `(..., D)`, with `E[phi(x) . phi(y)] = k_RBF(x, y)`."""
  if x.shape[-1] != features.frequencies.shape[0]:
    raise ValueError(
      f"points have dimension {x.shape[-1]}, the features expect {features.frequencies.shape[0]}"
    )
  scale = jnp.sqrt(2.0 / features.frequencies.shape[1])
  return scale * jnp.cos(x @ features.frequencies + features.phases)


def feature_values(theta: jax.Array, phi: jax.Array) -> jax.Array:
  """`f(s, .) = (theta_a . phi(s))_a`, `(..., A)`, for `theta (A, D)`: the kernel phi(s)(x)e_a."""
  return phi @ theta.T


# ---------------------------------------------------------------------------------------------------
# Kernel TD in coefficient form (exact kernel, one batch)
# ---------------------------------------------------------------------------------------------------


def _masked(mask: jax.Array | None, n: int) -> jax.Array:
  return jnp.ones((n,), bool) if mask is None else mask


def _check_td_shapes(gram0, gram10, rewards, discounts) -> None:
  n = rewards.shape[0]
  if gram0.shape != (n, n) or gram10.shape != (n, n) or discounts.shape != (n,):
    raise ValueError(
      f"kernel TD needs K (n, n), C (n, n), rewards (n,), discounts (n,); got K {gram0.shape}, "
      f"C {gram10.shape}, rewards {rewards.shape}, discounts {discounts.shape}"
    )


def kernel_td_residual(b, gram0, gram10, rewards, discounts) -> jax.Array:
  """`delta = K b - r - diag(discounts) C b`: f(omega0_i) - r_i - gamma f(omega1_i) for each tuple."""
  return gram0 @ b - rewards - discounts * (gram10 @ b)


def kernel_td_iterate(
  gram0: jax.Array,
  gram10: jax.Array,
  rewards: jax.Array,
  discounts: jax.Array,
  alpha: float,
  eta: float | jax.Array,
  num_iters: int,
  init: jax.Array | None = None,
  mask: jax.Array | None = None,
) -> jax.Array:
  """`num_iters` steps of b <- (1 - alpha) b - eta (K b - r - gamma C b), from `init` (default 0).

  Rows where `mask` is False take no part (their residual is zero, so their coefficient stays 0).
  """
  _check_td_shapes(gram0, gram10, rewards, discounts)
  valid = _masked(mask, rewards.shape[0])

  def one_iteration(_, b):
    residual = jnp.where(valid, kernel_td_residual(b, gram0, gram10, rewards, discounts), 0.0)
    return (1.0 - alpha) * b - eta * residual

  b0 = jnp.zeros_like(rewards) if init is None else init
  return jax.lax.fori_loop(0, num_iters, one_iteration, b0)


def kernel_td_fixed_point(
  gram0: jax.Array,
  gram10: jax.Array,
  rewards: jax.Array,
  discounts: jax.Array,
  alpha: float,
  eta: float | jax.Array,
  mask: jax.Array | None = None,
) -> jax.Array:
  """The closed form b = (K + (alpha/eta) I - gamma C)^{-1} r, O(n^3): for small n and for tests."""
  _check_td_shapes(gram0, gram10, rewards, discounts)
  n = rewards.shape[0]
  valid = _masked(mask, n)
  system = gram0 - discounts[:, None] * gram10 + (alpha / eta) * jnp.eye(n)
  both = valid[:, None] & valid[None, :]
  system = jnp.where(both, system, jnp.eye(n))
  return jnp.linalg.solve(system, jnp.where(valid, rewards, 0.0))


def kernel_td_contraction(gram0, gram10, discounts, alpha, eta) -> jax.Array:
  """Spectral radius of (1 - alpha) I - eta (K - gamma C): the iteration converges when it is < 1."""
  n = gram0.shape[0]
  step = (1.0 - alpha) * jnp.eye(n) - eta * (gram0 - discounts[:, None] * gram10)
  return jnp.max(jnp.abs(jnp.linalg.eigvals(step)))


# ---------------------------------------------------------------------------------------------------
# Kernel TD on features (primal form)
# ---------------------------------------------------------------------------------------------------


class FeatureBatch(NamedTuple):
  """One batch of tuples in feature form: phi(s0), action weights of a0, phi(s1), action weights of a1."""

  phi0: jax.Array  # (n, D)
  actions0: jax.Array  # (n, A)
  phi1: jax.Array  # (n, D)
  actions1: jax.Array  # (n, A)
  rewards: jax.Array  # (n,)
  discounts: jax.Array  # (n,)


def feature_td_residual(theta: jax.Array, batch: FeatureBatch) -> jax.Array:
  """`delta_i = f(omega0_i) - r_i - gamma_i f(omega1_i)` for `f = theta^T (phi (x) e_a)`."""
  f0 = jnp.sum(batch.actions0 * feature_values(theta, batch.phi0), -1)
  f1 = jnp.sum(batch.actions1 * feature_values(theta, batch.phi1), -1)
  return f0 - batch.rewards - batch.discounts * f1


def feature_td_iterate(
  theta: jax.Array,
  batch: FeatureBatch,
  alpha: float,
  eta: float | jax.Array,
  num_iters: int,
  mask: jax.Array | None = None,
) -> jax.Array:
  """theta <- (1 - alpha) theta - eta sum_i delta_i phi(s0_i) (x) e_{a0_i}, `num_iters` times."""
  valid = _masked(mask, batch.rewards.shape[0])

  def one_iteration(_, theta):
    residual = jnp.where(valid, feature_td_residual(theta, batch), 0.0)
    gradient = (batch.actions0 * residual[:, None]).T @ batch.phi0
    return (1.0 - alpha) * theta - eta * gradient

  return jax.lax.fori_loop(0, num_iters, one_iteration, theta)


def _design(phi: jax.Array, actions: jax.Array) -> jax.Array:
  """Rows phi(s_i) (x) w_i flattened to `(n, A * D)` in the layout of `theta.reshape(-1)`."""
  return (actions[:, :, None] * phi[:, None, :]).reshape(phi.shape[0], -1)


def feature_td_fixed_point(
  batch: FeatureBatch, alpha: float, eta: float | jax.Array, mask: jax.Array | None = None
) -> jax.Array:
  """theta = (Psi0^T (Psi0 - gamma Psi1) + (alpha/eta) I)^{-1} Psi0^T r, an (A D)-sized solve."""
  valid = _masked(mask, batch.rewards.shape[0]).astype(batch.phi0.dtype)[:, None]
  psi0 = _design(batch.phi0, batch.actions0) * valid
  psi1 = _design(batch.phi1, batch.actions1) * batch.discounts[:, None]
  system = psi0.T @ (psi0 - psi1) + (alpha / eta) * jnp.eye(psi0.shape[1])
  theta = jnp.linalg.solve(system, psi0.T @ batch.rewards)
  return theta.reshape(batch.actions0.shape[1], batch.phi0.shape[1])


# ---------------------------------------------------------------------------------------------------
# One critic per batch: iterate or solve, and the fit's mean squared TD residual
# ---------------------------------------------------------------------------------------------------

TD_SOLVERS = ("iterate", "solve")


def _mean_square(residual: jax.Array, valid: jax.Array) -> jax.Array:
  residual = jnp.where(valid, residual, 0.0)
  return jnp.sum(residual**2) / jnp.maximum(jnp.sum(valid), 1)


def exact_td_critic(
  x0: jax.Array,
  actions0: jax.Array,
  x1: jax.Array,
  actions1: jax.Array,
  rewards: jax.Array,
  discounts: jax.Array,
  alpha: float,
  eta: float | jax.Array,
  num_iters: int,
  solver: str = "iterate",
  mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """b^(k) of one batch with the exact kernel: the dense Grams K = K(omega0, omega0) and
  C = K(omega1, omega0), then `num_iters` coefficient iterations from 0 (`solver="iterate"`) or the
  closed-form fixed point (`"solve"`). Returns b and the mean squared TD residual of the valid rows."""
  valid = _masked(mask, rewards.shape[0])
  gram0 = state_action_gram(x0, actions0, x0, actions0)
  gram10 = state_action_gram(x1, actions1, x0, actions0)
  if solver == "solve":
    b = kernel_td_fixed_point(gram0, gram10, rewards, discounts, alpha, eta, valid)
  else:
    b = kernel_td_iterate(gram0, gram10, rewards, discounts, alpha, eta, num_iters, mask=valid)
  return b, _mean_square(kernel_td_residual(b, gram0, gram10, rewards, discounts), valid)


def feature_td_critic(
  batch: FeatureBatch,
  init: jax.Array,
  alpha: float,
  eta: float | jax.Array,
  num_iters: int,
  solver: str = "iterate",
  mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """theta^(k) of one batch in feature form: `num_iters` iterations from `init` (`solver="iterate"`;
  a warm start or zeros) or the closed-form fixed point (`"solve"`, which ignores `init`). Returns
  theta and the mean squared TD residual of the valid rows."""
  valid = _masked(mask, batch.rewards.shape[0])
  if solver == "solve":
    theta = feature_td_fixed_point(batch, alpha, eta, valid)
  else:
    theta = feature_td_iterate(init, batch, alpha, eta, num_iters, valid)
  return theta, _mean_square(feature_td_residual(theta, batch), valid)


# ---------------------------------------------------------------------------------------------------
# The exponentiated (KL-proximal) policy step
# ---------------------------------------------------------------------------------------------------


def proximal_policy_update(
  log_policy: jax.Array, critic_values: jax.Array, step_size: float | jax.Array
) -> jax.Array:
  """log pi_{k+1} = log softmax(log pi_k + Delta_k f^(k)), the maximiser of
  Delta_k <f^(k)(s, .), pi> - KL(pi || pi_k) over the simplex (explicit PPO = NPG, Alg. 1 (iii))."""
  return jax.nn.log_softmax(log_policy + step_size * critic_values, axis=-1)


def proximal_objective(
  policy: jax.Array, log_policy: jax.Array, critic_values: jax.Array, step_size
) -> jax.Array:
  """Delta <f, pi> - KL(pi || pi_k) for a distribution `policy` over the last axis."""
  kl = jnp.sum(policy * (jnp.log(jnp.maximum(policy, 1e-30)) - log_policy), -1)
  return step_size * jnp.sum(policy * critic_values, -1) - kl


class KernelExpansion(NamedTuple):
  """Logits sum_j k(x_j, s) weights_j as one kernel expansion with accumulating coefficients.

  A critic f = sum_i b_i K((x_i, a_i), .) enters with weights_i = Delta b_i e_{a_i}; rows past `size`
  have zero weight.
  """

  points: jax.Array  # (capacity, d)
  weights: jax.Array  # (capacity, A)
  size: jax.Array  # () int32


def empty_expansion(capacity: int, dim: int, num_actions: int) -> KernelExpansion:
  return KernelExpansion(
    jnp.zeros((capacity, dim)), jnp.zeros((capacity, num_actions)), jnp.zeros((), jnp.int32)
  )


def expansion_values(
  expansion: KernelExpansion, x: jax.Array, lengthscale: float | jax.Array = 1.0
) -> jax.Array:
  """`(n, A)` values at points `x (n, d)`."""
  return rbf_gram(x, expansion.points, lengthscale) @ expansion.weights


def expansion_append(
  expansion: KernelExpansion, points: jax.Array, weights: jax.Array, count: jax.Array
) -> KernelExpansion:
  """Writes `points`/`weights` (rows past `count` must have zero weight) at `size`; size += count.

  The caller sizes `capacity` for the whole run plus one block, since `dynamic_update_slice` would
  otherwise shift a block that overruns the end onto earlier entries.
  """
  start = expansion.size
  return KernelExpansion(
    jax.lax.dynamic_update_slice_in_dim(expansion.points, points, start, 0),
    jax.lax.dynamic_update_slice_in_dim(expansion.weights, weights, start, 0),
    expansion.size + count,
  )
