"""Weak-to-strong (W2S) maths under spurious correlations: features, solvers, losses, metrics, theory.

Paper: "Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026,
arXiv 2509.24005). The data generators live in `core/data/spurious.py`.

Regression model (the paper's theoretical setting): `phi_T(x) = z (x) w`, `w = [1; T^T xi]`,
`phi_S(x) = z (x) psi`, `psi = [1; S^T xi]` (`teacher_features`, `student_features`; the rotations
U_T, U_S are the identity: min-norm least squares is equivariant under orthogonal maps, so they change
no prediction). With the coefficient matrix `B` (d_z x p_w, row-major `vec`) the excess risk is exact
in closed form, `ER_eta(f) = E_{D(eta)}[(z^T (B - beta* e_1^T) w)^2] = tr(E M_eta E^T)`
(`excess_risk`), because z is independent of xi and standard normal.

Theory (`predicted_*`: our exact-moment derivation, the "exact-moment" predictor of the W2S metrics;
`relayed_*`: the paper's Thm 1 and Thm 2 as relayed by secondary summaries of it, their constants not
checked against the paper), pieces of its remedy Enhanced-W2S (`generalized_cross_entropy`,
`predictive_entropy`, `top_p_mask`) and group metrics (`group_accuracies`, `worst_group_accuracy`).

Choices where the paper is open:
* `predicted_student_risk` adds to the population term the finite-N misfit term under a
  homoscedastic approximation: the student's residual `r = z^T E (w - A B^-1 psi)` is treated as noise
  of variance `E r^2`, giving `E r^2 * d_z tr(B_u^-1 B_t) / (N - d_S - 1)` (the relayed Theta(nu_z)).
* The relayed formulas drop their Theta(nu_z) term (its constant is not relayed).
* GCE with soft targets is the expected GCE under the target distribution, sum_c t_c (1 - p_c^q) / q,
  which is the paper's (1 - p_y^q) / q for one-hot targets and soft cross-entropy as q -> 0.
* The "average accuracy" of a group metric is the mean of the per-group accuracies (equal to the plain
  accuracy on group-balanced test sets, and robust when a test group is small).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from core.data.spurious import ClassificationDesign, RegressionDesign

# ---------------------------------------------------------------------------------------------------
# Feature maps (the paper's phi_T and phi_S)
# ---------------------------------------------------------------------------------------------------


def group_features(xi: jax.Array, projection: jax.Array) -> jax.Array:
  """`[1; P^T xi]` for every row of `xi` (num, p): the teacher's w (P = T) or student's psi (P = S)."""
  if xi.ndim != 2 or projection.ndim != 2 or xi.shape[1] != projection.shape[0]:
    raise ValueError(
      f"need xi (num, p) and projection (p, k), got {xi.shape} and {projection.shape}"
    )
  return jnp.concatenate([jnp.ones_like(xi[:, :1]), xi @ projection], axis=1)


def kron_features(z: jax.Array, w: jax.Array) -> jax.Array:
  """Row-wise Kronecker product `z (x) w`: (num, d_z) and (num, p_w) -> (num, d_z * p_w)."""
  if z.ndim != 2 or w.ndim != 2 or z.shape[0] != w.shape[0]:
    raise ValueError(f"need z (num, d_z) and w (num, p_w) with equal num, got {z.shape}, {w.shape}")
  return (z[:, :, None] * w[:, None, :]).reshape(z.shape[0], -1)


def teacher_features(z: jax.Array, xi: jax.Array, teacher_map: jax.Array) -> jax.Array:
  """phi_T(x) = z (x) [1; T^T xi], dimension d_T = p_T d_z: the weak teacher's features."""
  return kron_features(z, group_features(xi, teacher_map))


def student_features(z: jax.Array, xi: jax.Array, student_map: jax.Array) -> jax.Array:
  """phi_S(x) = z (x) [1; S^T xi], dimension d_S = p_S d_z, "partially disentangled": the strong student's."""
  return kron_features(z, group_features(xi, student_map))


def _e2_blocks(x, design: ClassificationDesign):
  d_c, d_s = len(design.mu_core), len(design.mu_spurious)
  if x.ndim != 2 or x.shape[1] != design.input_dim:
    raise ValueError(f"x must be (num, {design.input_dim}), got {x.shape}")
  return x[:, :d_c], x[:, d_c : d_c + d_s], x[:, d_c + d_s :]


def e2_weak_features(x: jax.Array, design: ClassificationDesign) -> jax.Array:
  """E2 teacher view (`configs/w2s.py`): R^T [a core + sqrt(1 - a^2) noise_{:d_c}; spurious], R random.

  The core signal's amplitude is scaled by a (0.3) at unit noise, so the core SNR drops by a^2 while
  the spurious block enters intact; R projects the 24 coordinates to k_T (6) dimensions.
  """
  core, spurious, noise = _e2_blocks(x, design)
  scale = design.weak_core_scale
  core_view = scale * core + math.sqrt(1.0 - scale**2) * noise[:, : core.shape[1]]
  return jnp.concatenate([core_view, spurious], axis=1) @ design.weak_projection


def e2_strong_features(x: jax.Array, design: ClassificationDesign) -> jax.Array:
  """E2 student view (`configs/w2s.py`): the whole core block and the first half of the spurious block."""
  core, spurious, _ = _e2_blocks(x, design)
  return jnp.concatenate([core, spurious[:, : design.strong_spurious_dim]], axis=1)


# ---------------------------------------------------------------------------------------------------
# Ridgeless regression and its exact excess risk
# ---------------------------------------------------------------------------------------------------


@jax.custom_batching.custom_vmap
def spd_solve(matrix: jax.Array, rhs: jax.Array) -> jax.Array:
  """`matrix^-1 rhs` for a symmetric positive-definite `matrix` (d, d), by Cholesky.

  Under `vmap` the factorisations run one at a time (`lax.map`): jaxlib's batched LAPACK kernels
  split a batch over XLA's intra-op thread pool and wait for it from inside that pool, which
  deadlocks on small (2-core) machines (seen with jax 0.10.2 when two batched Cholesky calls are in
  flight). The matrix products around the solve stay batched.
  """
  return jsl.cho_solve(jsl.cho_factor(matrix), rhs)


@spd_solve.def_vmap
def _spd_solve_vmap(axis_size, in_batched, matrix, rhs):
  matrix_batched, rhs_batched = in_batched
  if not matrix_batched:
    matrix = jnp.broadcast_to(matrix, (axis_size, *matrix.shape))
  if not rhs_batched:
    rhs = jnp.broadcast_to(rhs, (axis_size, *rhs.shape))
  return jax.lax.map(lambda pair: spd_solve(*pair), (matrix, rhs)), True


def ridgeless_fit(features: jax.Array, targets: jax.Array) -> jax.Array:
  """Min-norm least squares `argmin ||b|| s.t. b minimises ||features b - targets||`: the paper's
  teacher and student fits.

  d <= n: the normal equations by Cholesky (ordinary least squares, features of full column rank).
  d > n: the dual `b = X^T (X X^T)^-1 y`, the min-norm interpolant (features of full row rank).
  `targets` is (n,) or (n, k) (k right-hand sides share one factorisation).
  """
  if features.ndim != 2:
    raise ValueError(f"features must be (n, d), got shape {features.shape}")
  if targets.shape[:1] != features.shape[:1] or targets.ndim not in (1, 2):
    raise ValueError(
      f"targets must be (n,) or (n, k) with n={features.shape[0]}, got {targets.shape}"
    )
  n, d = features.shape
  if d <= n:
    return spd_solve(features.T @ features, features.T @ targets)
  return features.T @ spd_solve(features @ features.T, targets)


def coefficient_error(coef: jax.Array, beta: jax.Array) -> jax.Array:
  """`B - beta* e_1^T` with `B` the (d_z, p_w) matrix of `coef` (the target is z^T beta*)."""
  d_z = beta.shape[0]
  if coef.shape[-1] % d_z:
    raise ValueError(f"coefficients of size {coef.shape[-1]} are not d_z={d_z} times p_w")
  matrix = coef.reshape(d_z, -1)
  return matrix.at[:, 0].add(-beta)


def excess_risk(coef: jax.Array, beta: jax.Array, second_moment: jax.Array) -> jax.Array:
  """Exact `ER_eta = E_{D(eta)}[(phi(x)^T coef - z^T beta*)^2] = tr(E M_eta E^T)`, the paper's excess risk.

  `second_moment` is `E_eta[w w^T]` of the feature map's group part (`feature_second_moment`).
  """
  error = coefficient_error(coef, beta)
  return jnp.einsum("ij,jk,ik->", error, second_moment, error)


# ---------------------------------------------------------------------------------------------------
# Mixture moments and the exact-moment predictor (ours)
# ---------------------------------------------------------------------------------------------------


def xi_moments(eta, mu: jax.Array, sigma_xi) -> tuple[jax.Array, jax.Array]:
  """`E_eta[xi] = eta mu` and `E_eta[xi xi^T] = sigma^2 I + eta mu mu^T` of the mixture D(eta)."""
  mean = eta * mu
  second = sigma_xi**2 * jnp.eye(mu.shape[0]) + eta * jnp.outer(mu, mu)
  return mean, second


def feature_second_moment(left: jax.Array, right: jax.Array, eta, mu: jax.Array, sigma_xi):
  """`E_eta[[1; L^T xi][1; R^T xi]^T]`: M_eta (L = R = T), B_eta (S, S) or A_eta (T, S) (exact moments)."""
  mean, second = xi_moments(eta, mu, sigma_xi)
  top = jnp.concatenate([jnp.ones((1,)), mean @ right])[None, :]
  bottom = jnp.concatenate([(left.T @ mean)[:, None], left.T @ second @ right], axis=1)
  return jnp.concatenate([top, bottom], axis=0)


def teacher_moment(design: RegressionDesign, eta) -> jax.Array:
  """M_eta = E_eta[w w^T], w = [1; T^T xi] (p_T, p_T)."""
  t = design.teacher_map
  return feature_second_moment(t, t, eta, design.mu, design.sigma_xi)


def student_moment(design: RegressionDesign, eta) -> jax.Array:
  """B_eta = E_eta[psi psi^T], psi = [1; S^T xi] (p_S, p_S)."""
  s = design.student_map
  return feature_second_moment(s, s, eta, design.mu, design.sigma_xi)


def cross_moment(design: RegressionDesign, eta) -> jax.Array:
  """A_eta = E_eta[w psi^T] (p_T, p_S)."""
  return feature_second_moment(
    design.teacher_map, design.student_map, eta, design.mu, design.sigma_xi
  )


def group_excess_risks(coef: jax.Array, design: RegressionDesign, which: str) -> jax.Array:
  """Per-group excess risk [majority (eta_t = 0), minority (eta_t = 1)] (asked for by OpenReview reviewer 1).

  `which` is "teacher" or "student": the feature map `coef` belongs to.
  """
  moment = {"teacher": teacher_moment, "student": student_moment}[which]
  return jnp.stack([excess_risk(coef, design.beta, moment(design, eta)) for eta in (0.0, 1.0)])


def _teacher_noise_scale(design: RegressionDesign, num_labelled: int, teacher_dim: int):
  """c = sigma_y^2 / (n - d_T - 1), the Gaussian-design E[(X^T X)^-1] factor."""
  if num_labelled <= teacher_dim + 1:
    raise ValueError(
      f"the exact-moment predictor needs n > d_T + 1 (OLS regime), got n={num_labelled}, d_T={teacher_dim}"
    )
  return design.sigma_y**2 / (num_labelled - teacher_dim - 1)


def predicted_teacher_risk(design: RegressionDesign, eta_l, eta_t, num_labelled: int) -> jax.Array:
  """E ER_{eta_t}(f_T) ~ c d_z tr(M_t M_l^-1) (exact-moment predictor)."""
  c = _teacher_noise_scale(design, num_labelled, design.teacher_dim)
  m_l, m_t = teacher_moment(design, eta_l), teacher_moment(design, eta_t)
  return c * design.d_z * jnp.trace(spd_solve(m_l, m_t))


def predicted_student_risk(
  design: RegressionDesign,
  eta_l,
  eta_u,
  eta_t,
  num_labelled: int,
  num_unlabelled: int,
) -> jax.Array:
  """E ER_{eta_t}(f_S) (exact-moment predictor): the population part plus the finite-N misfit.

  Population: c d_z tr(M_l^-1 A_u B_u^-1 B_t B_u^-1 A_u^T) (each row of the teacher's error, of
  covariance c M_l^-1, projected through A_u B_u^-1). Misfit: E r^2 d_z tr(B_u^-1 B_t) / (N - d_S - 1)
  with E r^2 = c d_z tr(M_l^-1 (M_u - A_u B_u^-1 A_u^T)) (module docstring).
  """
  d_z, d_s = design.d_z, design.student_dim
  if num_unlabelled <= d_s + 1:
    raise ValueError(f"need N > d_S + 1, got N={num_unlabelled}, d_S={d_s}")
  c = _teacher_noise_scale(design, num_labelled, design.teacher_dim)
  m_l, m_u = teacher_moment(design, eta_l), teacher_moment(design, eta_u)
  a_u = cross_moment(design, eta_u)
  b_u, b_t = student_moment(design, eta_u), student_moment(design, eta_t)
  projection = spd_solve(b_u, a_u.T).T  # A_u B_u^-1
  population = c * d_z * jnp.trace(spd_solve(m_l, projection @ b_t @ projection.T))
  residual = c * d_z * jnp.trace(spd_solve(m_l, m_u - projection @ a_u.T))
  misfit = residual * d_z * jnp.trace(spd_solve(b_u, b_t)) / (num_unlabelled - d_s - 1)
  return population + misfit


def relayed_teacher_risk(design: RegressionDesign, eta_l, eta_t, num_labelled: int) -> jax.Array:
  """Thm 1 as relayed: sigma_y^2 gamma_z (p_T + ||(eta_t - eta_l) mu_T||^2 / sigma_xi^2)."""
  gamma = design.d_z / num_labelled
  mu_t = design.teacher_map.T @ design.mu
  spurious = (eta_t - eta_l) ** 2 * jnp.sum(mu_t**2) / design.sigma_xi**2
  return design.sigma_y**2 * gamma * (design.teacher_map.shape[1] + 1 + spurious)


def relayed_student_risk(
  design: RegressionDesign, eta_l, eta_u, eta_t, num_labelled: int
) -> jax.Array:
  """Thm 2 as relayed, without its Theta(nu_z) term:
  sigma_y^2 gamma_z (p_{T^S} + ||(eta_u - eta_l) mu_T + (eta_t - eta_u) Xi mu_S||^2 / sigma_xi^2),
  p_{T^S} = 1 + ||Xi||_F^2, Xi = T^T S, mu_T = T^T mu, mu_S = S^T mu."""
  gamma = design.d_z / num_labelled
  teacher_map, student_map = design.teacher_map, design.student_map
  xi = teacher_map.T @ student_map
  shift = (eta_u - eta_l) * (teacher_map.T @ design.mu) + (eta_t - eta_u) * (
    xi @ (student_map.T @ design.mu)
  )
  spurious = jnp.sum(shift**2) / design.sigma_xi**2
  return design.sigma_y**2 * gamma * (1.0 + jnp.sum(xi**2) + spurious)


# ---------------------------------------------------------------------------------------------------
# Losses and the confident subset (Enhanced-W2S)
# ---------------------------------------------------------------------------------------------------


def _check_targets(logits: jax.Array, targets: jax.Array) -> None:
  if logits.shape != targets.shape:
    raise ValueError(
      f"targets must be distributions shaped like logits {logits.shape}, got {targets.shape}"
    )


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """-sum_c t_c log p_c per example (targets: one-hot or soft pseudolabels)."""
  _check_targets(logits, targets)
  return -jnp.sum(targets * jax.nn.log_softmax(logits), axis=-1)


def generalized_cross_entropy(logits: jax.Array, targets: jax.Array, q) -> jax.Array:
  """L_GCE = (1 - p_y^q) / q (Zhang & Sabuncu 2018; Enhanced-W2S's retraining loss), per example.

  Soft targets give sum_c t_c (1 - p_c^q) / q. Written as -expm1(q log p) / q, which is stable as q -> 0
  (the limit is cross-entropy); q = 1 is the MAE-like end.
  """
  _check_targets(logits, targets)
  log_p = jax.nn.log_softmax(logits)
  return jnp.sum(targets * -jnp.expm1(q * log_p) / q, axis=-1)


def predictive_entropy(logits: jax.Array) -> jax.Array:
  """H(x) = -sum_c p_c log p_c of the softmax of `logits` (..., C): Enhanced-W2S's confidence score."""
  log_p = jax.nn.log_softmax(logits)
  return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def subset_size(num: int, fraction: float) -> int:
  """ceil(fraction * num) clipped to [1, num]; 1e-6 absorbs float error (0.3 * 5000 = 1500.0000000002)."""
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"subset fraction must be in (0, 1], got {fraction}")
  return min(num, max(1, math.ceil(fraction * num - 1e-6)))


def top_p_indices(entropy: jax.Array, fraction: float) -> jax.Array:
  """Indices of the ceil(p N) lowest-entropy points of `entropy` (N,), lowest first (lax.top_k on -H)."""
  if entropy.ndim != 1:
    raise ValueError(f"entropy must be (N,), got shape {entropy.shape}")
  return jax.lax.top_k(-entropy, subset_size(entropy.shape[0], fraction))[1]


def top_p_mask(entropy: jax.Array, fraction: float) -> jax.Array:
  """1.0 on the ceil(p N) lowest-entropy points of `entropy` (N,), else 0.0 (ties: lower index first)."""
  if entropy.ndim != 1:
    raise ValueError(f"entropy must be (N,), got shape {entropy.shape}")
  ranks = jnp.argsort(jnp.argsort(entropy, stable=True), stable=True)
  return (ranks < subset_size(entropy.shape[0], fraction)).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------
# Group metrics
# ---------------------------------------------------------------------------------------------------


def group_ids(labels: jax.Array, attributes: jax.Array, num_attributes: int = 2) -> jax.Array:
  """Group index `label * num_attributes + attribute` of the (y, a) groups."""
  return labels * num_attributes + attributes


def group_accuracies(predictions, labels, groups, num_groups: int) -> jax.Array:
  """Accuracy within each group (num_groups,); NaN for a group with no example."""
  if not predictions.shape == labels.shape == groups.shape:
    raise ValueError(
      f"predictions, labels, groups must share a shape, got {predictions.shape}, {labels.shape}, "
      f"{groups.shape}"
    )
  one_hot = jax.nn.one_hot(groups, num_groups)
  correct = (predictions == labels).astype(jnp.float32)
  counts = one_hot.sum(0)
  return jnp.where(counts > 0, correct @ one_hot / jnp.maximum(counts, 1.0), jnp.nan)


def average_accuracy(predictions, labels, groups, num_groups: int) -> jax.Array:
  """Mean of the per-group accuracies over non-empty groups (module docstring)."""
  return jnp.nanmean(group_accuracies(predictions, labels, groups, num_groups))


def worst_group_accuracy(predictions, labels, groups, num_groups: int) -> jax.Array:
  """Lowest accuracy over non-empty groups."""
  return jnp.nanmin(group_accuracies(predictions, labels, groups, num_groups))
