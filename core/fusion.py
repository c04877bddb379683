"""Losses of "Supporting Multimodal Intermediate Fusion with Informatic Constraint and Distribution
Coherence" (Li, Song, Zheng, Li; ICLR 2026): the fusion rules, the informatic constraint and the
distribution-coherence loss of the IID method.

Notation (Sec. 3 of the paper): M modalities, encoders h_m give latents z^m = h_m(x^m) in R^d;
intermediate fusion (IF) predicts g(sum_m w_m z^m) with one linear target mapping g(z) = theta^T z + b,
late fusion (LF) predicts sum_m w_m g_m(z^m).

* `intermediate_fusion`, `late_fusion`: the two fusion rules.
* `fusion_weights`: the family of fusion weights, one `kind` per IID variant (Sec. 3.1 and the
  experiments): `static` (IID-L, fixed w), `energy` (IID-Q, the weights of QMF, Zhang et al. ICML
  2023: w_m proportional to exp(-energy_m), energy_m = -logsumexp of modality m's logits,
  `energy_weights`) and `pdf` (IID-P, the weights of PDF, "Predictive Dynamic Fusion", Cao et al.
  ICML 2024, `pdf_weights`):
    mono-confidence  c_m ~ p_m(y | x^m), the true-class probability predicted by a confidence
                     network (trained with `confidence_loss`, the L1 distance to the actual TCP);
    holo-confidence  h_m = sum_{j != m} log c_j / sum_j log c_j   (`holo_confidence`);
    co-belief        cb_m = c_m + h_m;
    relative calibration (evaluation only, as in the official code) rc_m = u_m / max_j u_j with
                     u_m = mean_c |p_m(c) - 1/C| the distance of modality m's prediction from
                     uniform (`relative_calibration`);
    w = softmax_m(cb * rc) at evaluation, softmax_m(cb) in training, no gradient.
  PDF as published (official repository `Yinan-Xia/PDF`, `src/models/latefusion_pdf.py`,
  `train_pdf.py`) fuses decisions (LF); IID-P uses the same weights on the latents (IF).
* `informatic_constraint`: the variational form of "maximise I(z; y) - sum_m I(z^m; y)",
    L_ic = sum_i ( -log q(y_i | z_i) + lam KL(N_z || N)
                   - sum_m [ log q(y_i | z_i^m) - lam KL(N_{z^m} || N) ] ),
  q = softmax of the shared target mapping, N_z a diagonal Gaussian fitted to the batch's features
  (`gaussian_kl_to_standard`), N = N(0, I).
* `coherence_features`: Psi_m z^m = Phi IFFT(top-d1 mask * FFT(z^m)) (FFT sparsification along the
  feature axis, then a Gaussian RIP matrix Phi in R^{k x d}, entries N(0, 1/k): `rip_matrix`).
* `unbalanced_ot_cost`: the relaxed OT distance
    W~(mu_1, mu_2) = <T, C> + lam1 [KL(T 1 || u) + KL(T^T 1 || v)]
  at the plan T of ott-jax's unbalanced Sinkhorn (entropy eps, `tau = lam1 / (lam1 + eps)`), on the
  normalised cost C / mean(C) with Euclidean C.
* `distribution_coherence`: L_dc = sum_{m1 != m2} W~(mu_{m1}, mu_{m2}) over the coherence features.
* `exact_wasserstein`: the exact (unregularised) W_p between two equal-size empirical clouds (an
  assignment problem), the measured incoherence of evaluations.

Choices where the paper is open:
* The sign of the unimodal term. As printed, L_ic ADDS the unimodal cross-entropies (a shared-head
  unimodal auxiliary loss); the prose says the term "suppresses the unimodal representations' ability
  to explain labels", i.e. subtracts them. `unimodal_sign = +1` is the printed formula, `-1` the prose.
  With -1 each sample's unimodal cross-entropy is clipped at log C (chance level): without the clip the
  loss is unbounded below (two confidently wrong unimodal predictions can average to a right fused one).
  The sign flips the likelihood term only; the KL terms keep +lam, as printed, and stay regularisers.
* N_z is fitted per batch and per feature (mean and variance over the batch), KL in closed form.
* The sparsification keeps, per sample, the d1 largest-amplitude FFT coefficients (ties kept); the
  mask carries no gradient. `use_fft = False` is the no-FFT ablation (Phi z directly).
* W~ is the paper's relaxed objective evaluated at the entropic plan (the entropy only makes the
  problem solvable by Sinkhorn; it is not part of the value). The plan is held fixed when
  differentiating, so the gradient with respect to the cost is the plan (Danskin), and the Sinkhorn
  loop runs a fixed number of iterations, so a vmapped batch of problems costs the same for every
  member. The cost is divided by its batch mean (the paper's beta in 1e-14..1e-10 suggests an
  unnormalised cost); the mean is differentiated, so W~ is invariant to a common rescaling of both
  clouds.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ott.geometry import costs, geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn

# ---------------------------------------------------------------------------------------------------
# Fusion rules (Sec. 3.1)
# ---------------------------------------------------------------------------------------------------


def _broadcast_weights(weights: jax.Array, batch: int) -> jax.Array:
  """(M,) static or (M, B) per-sample weights as (M, B, 1)."""
  weights = jnp.asarray(weights)
  if weights.ndim == 1:
    weights = jnp.broadcast_to(weights[:, None], (weights.shape[0], batch))
  return weights[..., None]


def intermediate_fusion(latents: jax.Array, weights: jax.Array) -> jax.Array:
  """IF: z = sum_m w_m z^m; latents (M, B, d), weights (M,) or (M, B) -> (B, d)."""
  return jnp.sum(_broadcast_weights(weights, latents.shape[1]) * latents, axis=0)


def late_fusion(unimodal_logits: jax.Array, weights: jax.Array) -> jax.Array:
  """LF: sum_m w_m g_m(z^m); logits (M, B, C), weights (M,) or (M, B) -> (B, C)."""
  return jnp.sum(_broadcast_weights(weights, unimodal_logits.shape[1]) * unimodal_logits, axis=0)


WEIGHTINGS = ("static", "energy", "pdf")  # IID-L, IID-Q, IID-P


def energy_weights(unimodal_logits: jax.Array) -> jax.Array:
  """QMF-style dynamic weights (M, B): softmax over modalities of -energy_m = logsumexp_c logits_m.

  The weights are a per-sample confidence and carry no gradient (QMF treats them as given)."""
  negative_energy = jax.nn.logsumexp(unimodal_logits, axis=-1)
  return jax.lax.stop_gradient(jax.nn.softmax(negative_energy, axis=0))


CONFIDENCE_FLOOR = 1e-6  # c_m is clipped to [floor, 1 - floor] before its logarithm


def true_class_probability(unimodal_logits: jax.Array, labels: jax.Array) -> jax.Array:
  """p_m(y | x^m) (M, B): the probability each modality's prediction gives the true class."""
  probs = jax.nn.softmax(unimodal_logits, axis=-1)
  return jnp.take_along_axis(probs, labels[None, :, None], axis=-1)[..., 0]


def holo_confidence(confidence: jax.Array) -> jax.Array:
  """PDF's holo-confidence h_m = sum_{j != m} log c_j / sum_j log c_j from mono-confidences (M, B):
  the share of the other modalities in the total uncertainty, so a modality is trusted more when
  the others are unsure. For two modalities h_1 = log c_2 / log(c_1 c_2)."""
  log_c = jnp.log(jnp.clip(confidence, CONFIDENCE_FLOOR, 1.0 - CONFIDENCE_FLOOR))
  total = jnp.sum(log_c, axis=0, keepdims=True)
  return (total - log_c) / total


def relative_calibration(unimodal_logits: jax.Array) -> jax.Array:
  """PDF's relative calibration rc_m = u_m / max_j u_j (M, B), u_m = mean_c |p_m(c) - 1/C|: the
  modality whose prediction is farthest from uniform keeps its co-belief, the others are scaled
  down (for two modalities: the official code's `rc_t`, `rc_i`)."""
  probs = jax.nn.softmax(unimodal_logits, axis=-1)
  uniformity = jnp.mean(jnp.abs(probs - 1.0 / probs.shape[-1]), axis=-1)
  return uniformity / jnp.maximum(jnp.max(uniformity, axis=0, keepdims=True), 1e-12)


def pdf_weights(unimodal_logits: jax.Array, confidence: jax.Array, calibrate: bool) -> jax.Array:
  """PDF's dynamic weights (M, B): softmax over modalities of the co-belief c_m + h_m, multiplied
  by the relative calibration when `calibrate` (evaluation). No gradient: the weights are given
  to the fusion, the confidence network learns from `confidence_loss` alone."""
  co_belief = confidence + holo_confidence(confidence)
  if calibrate:
    co_belief = co_belief * relative_calibration(unimodal_logits)
  return jax.lax.stop_gradient(jax.nn.softmax(co_belief, axis=0))


def confidence_loss(confidence: jax.Array, unimodal_logits: jax.Array, labels: jax.Array):
  """sum_m mean_i |c_m,i - p_m(y_i | x_i^m)|: the L1 regression of each modality's predicted
  mono-confidence onto its actual true-class probability (held fixed), as PDF trains it."""
  target = jax.lax.stop_gradient(true_class_probability(unimodal_logits, labels))
  return jnp.sum(jnp.mean(jnp.abs(confidence - target), axis=1))


def fusion_weights(
  kind: str,
  unimodal_logits: jax.Array,
  static_weights=None,
  confidence: jax.Array | None = None,
  calibrate: bool = True,
) -> jax.Array:
  """Fusion weights (M, B) of one IID variant: `static` (IID-L: `static_weights` (M,)), `energy`
  (IID-Q: `energy_weights`) or `pdf` (IID-P: `pdf_weights` of the predicted `confidence` (M, B))."""
  if kind == "static":
    weights = jnp.asarray(static_weights, jnp.float32)
    return jnp.broadcast_to(weights[:, None], unimodal_logits.shape[:2])
  if kind == "energy":
    return energy_weights(unimodal_logits)
  if kind == "pdf":
    if confidence is None:
      raise ValueError("pdf fusion weights need the predicted mono-confidence (M, B)")
    return pdf_weights(unimodal_logits, confidence, calibrate)
  raise ValueError(f"fusion weight kind must be one of {WEIGHTINGS}, got {kind!r}")


# ---------------------------------------------------------------------------------------------------
# Informatic constraint (Sec. 4.1)
# ---------------------------------------------------------------------------------------------------


def gaussian_kl_to_standard(z: jax.Array, min_variance: float = 1e-6) -> jax.Array:
  """KL(N(mu, diag sigma^2) || N(0, I)) of the diagonal Gaussian fitted to the rows of z (B, d):
  0.5 sum_j (sigma_j^2 + mu_j^2 - 1 - log sigma_j^2)."""
  mean = jnp.mean(z, axis=0)
  variance = jnp.maximum(jnp.var(z, axis=0), min_variance)
  return 0.5 * jnp.sum(variance + mean**2 - 1.0 - jnp.log(variance))


def informatic_constraint(
  fused_logits: jax.Array,
  unimodal_logits: jax.Array,
  fused_latent: jax.Array,
  latents: jax.Array,
  labels: jax.Array,
  kl_weight: float,
  unimodal_sign: int = 1,
) -> jax.Array:
  """Batch mean of L_ic (the per-sample sum of the paper divided by B; the KL terms are per batch).

  Args:
    fused_logits: (B, C) = g(z), the shared head on the fused latent.
    unimodal_logits: (M, B, C) = g(z^m), the SAME head on each modality's latent.
    fused_latent: (B, d); latents: (M, B, d).
    labels: (B,) integer classes.
    kl_weight: lam.
    unimodal_sign: +1 (formula as printed: unimodal cross-entropies added) or -1 (prose: subtracted,
      each clipped at log C).
  """
  fused_ce = optax.softmax_cross_entropy_with_integer_labels(fused_logits, labels).mean()
  unimodal_ce = jax.vmap(optax.softmax_cross_entropy_with_integer_labels, in_axes=(0, None))(
    unimodal_logits, labels
  )
  if unimodal_sign < 0:
    unimodal_ce = -jnp.minimum(unimodal_ce, math.log(fused_logits.shape[-1]))
  kl = gaussian_kl_to_standard(fused_latent) + jnp.sum(jax.vmap(gaussian_kl_to_standard)(latents))
  return fused_ce + jnp.sum(unimodal_ce.mean(axis=1)) + kl_weight * kl


# ---------------------------------------------------------------------------------------------------
# Distribution coherence (Sec. 4.2)
# ---------------------------------------------------------------------------------------------------


def rip_matrix(key: jax.Array, num_rows: int, dim: int) -> jax.Array:
  """Phi in R^{k x d} with i.i.d. N(0, 1/k) entries (a RIP matrix with high probability)."""
  return jax.random.normal(key, (num_rows, dim)) / math.sqrt(num_rows)


def dft_matrices(dim: int) -> tuple[np.ndarray, np.ndarray]:
  """cos and sin parts of the DFT: FFT(z) = z C - i z S for real rows z (float32, (d, d))."""
  angle = 2.0 * np.pi * np.outer(np.arange(dim), np.arange(dim)) / dim
  return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def fft_sparsify(z: jax.Array, keep: int) -> jax.Array:
  """real(IFFT(mask * FFT(z))) along the last axis, the mask keeping each row's `keep` largest-amplitude
  coefficients (conjugate pairs have equal amplitude, so ties are kept).

  The DFT is a (d, d) real matrix product, exactly `jnp.fft` for real input: XLA's CPU FFT rejects the
  transposed layouts that vmap and its gradient produce here."""
  cos, sin = dft_matrices(z.shape[-1])
  real, imag = z @ cos, z @ sin  # FFT(z) = real - i imag
  amplitude = jax.lax.stop_gradient(jnp.sqrt(real**2 + imag**2))
  threshold = jax.lax.top_k(amplitude, keep)[0][..., -1:]
  mask = (amplitude >= threshold * (1.0 - 1e-6)).astype(z.dtype)
  return ((mask * real) @ cos + (mask * imag) @ sin) / z.shape[-1]


def coherence_features(
  z: jax.Array, projection: jax.Array, keep: int, use_fft: bool = True
) -> jax.Array:
  """z~ = Psi z = Phi F^-1 (sparsified F z): rows of z (B, d) -> (B, k)."""
  if use_fft:
    z = fft_sparsify(z, keep)
  return z @ projection.T


def generalized_kl(p: jax.Array, q: jax.Array) -> jax.Array:
  """KL between non-negative measures: sum p log(p / q) - p + q."""
  return jnp.sum(jax.scipy.special.xlogy(p, p) - jax.scipy.special.xlogy(p, q) - p + q)


def relaxed_ot_objective(plan: jax.Array, cost: jax.Array, marginal_weight: float) -> jax.Array:
  """<T, C> + lam1 [KL(T 1 || u) + KL(T^T 1 || v)] with uniform u, v (the paper's relaxed OT)."""
  n, m = plan.shape
  marginals = generalized_kl(plan.sum(1), jnp.full(n, 1.0 / n)) + generalized_kl(
    plan.sum(0), jnp.full(m, 1.0 / m)
  )
  return jnp.sum(plan * cost) + marginal_weight * marginals


def unbalanced_ot_cost(
  x: jax.Array,
  y: jax.Array,
  epsilon: float,
  marginal_weight: float,
  num_iterations: int,
) -> jax.Array:
  """W~ between the uniform empirical measures on the rows of x (n, k) and y (m, k).

  Euclidean cost divided by its mean; the plan T is ott's unbalanced Sinkhorn solution (entropy
  epsilon, marginal penalty lam1 = `marginal_weight`, `num_iterations` iterations, a multiple of 10
  for the fixed-length scan), held fixed when differentiating (Danskin: the gradient with respect to
  the cost is T, the envelope gradient of the entropic problem)."""
  cost = costs.Euclidean().all_pairs(x, y)
  cost = cost / jnp.mean(cost)
  solution = sinkhorn_solve(jax.lax.stop_gradient(cost), epsilon, marginal_weight, num_iterations)
  return relaxed_ot_objective(jax.lax.stop_gradient(solution.matrix), cost, marginal_weight)


def sinkhorn_solve(
  cost: jax.Array, epsilon: float, marginal_weight: float, num_iterations: int
) -> sinkhorn.SinkhornOutput:
  """ott-jax's unbalanced Sinkhorn on a cost matrix with uniform marginals (1/n, 1/m): the plan
  minimises <T, C> + eps sum(T log T - T) + lam1 [KL(T 1 || u) + KL(T^T 1 || v)]
  (ott's tau = lam1 / (lam1 + eps))."""
  tau = marginal_weight / (marginal_weight + epsilon)
  problem = linear_problem.LinearProblem(
    geometry.Geometry(cost_matrix=cost, epsilon=epsilon), tau_a=tau, tau_b=tau
  )
  inner = math.gcd(num_iterations, 10)
  solver = sinkhorn.Sinkhorn(
    min_iterations=num_iterations, max_iterations=num_iterations, inner_iterations=inner
  )
  return solver(problem)


def distribution_coherence(
  latents: jax.Array,
  projection: jax.Array,
  keep: int,
  epsilon: float,
  marginal_weight: float,
  num_iterations: int,
  use_fft: bool = True,
) -> jax.Array:
  """L_dc = sum over ordered pairs m1 != m2 of W~(Psi z^{m1}, Psi z^{m2}); latents (M, B, d).

  W~ is symmetric (symmetric cost, equal marginal weights), so each unordered pair is solved once and
  counted twice."""
  features = [coherence_features(z, projection, keep, use_fft) for z in latents]
  total = 0.0
  for i, a in enumerate(features):
    for b in features[i + 1 :]:
      total = total + 2.0 * unbalanced_ot_cost(a, b, epsilon, marginal_weight, num_iterations)
  return total


# ---------------------------------------------------------------------------------------------------
# Evaluation: the measured incoherence
# ---------------------------------------------------------------------------------------------------


def exact_wasserstein(x: np.ndarray, y: np.ndarray, p: int = 2) -> float:
  """Exact W_p between the uniform empirical measures on the rows of x and y (equal sizes): with
  uniform weights an optimal plan is a permutation, found by `linear_sum_assignment`."""
  from scipy.optimize import linear_sum_assignment

  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape:
    raise ValueError(f"need equal-size clouds, got {x.shape} and {y.shape}")
  cost = np.linalg.norm(x[:, None, :] - y[None, :, :], axis=-1) ** p
  rows, cols = linear_sum_assignment(cost)
  return float(np.mean(cost[rows, cols]) ** (1.0 / p))
