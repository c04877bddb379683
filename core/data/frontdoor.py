"""Front-door simulation DGPs with known τ(C), their oracle nuisances, and nuisance perturbation.

The simulations of "Debiased Front-Door Learners for Heterogeneous Effects" (arXiv 2509.22531), as the
author's `simulate_fd_data_md` and `simulate_fd_data_weak_overlap` write them (FDCATE.py of
github.com/yonghanjung/FD-CATE), and the Sim-5 mediator confounding of fd-cate 0.1.1. Both DGPs share
one structural form (U ~ N(0, 1) unobserved):

  X ~ Bern(σ(κ_e (β0 + β_c·C + β_u U)))
  Z ~ Bern(σ(s_q (α0 + α_c·C + α_x X) + α_u U))
  Y = θ0 + θ_c·C + θ_z Z + θ_u U + N(0, 1)

- `simulate_main`: κ_e = s_q = 1, (β0, |β_c|, β_u) = (0.1, 0.7, 0.7),
  (α0, |α_c|, α_x) = (0.1, 0.7, 1.2), (|θ_c|, θ_z, θ_u) = (0.7, 1.4, −2.4), d = 10. θ_u is
  multiplied by 1.25 once if the naive contrast E[Y|X=1] − E[Y|X=0] is ≥ 0, which enforces the
  Simpson-type paradox. α_u > 0 breaks the front-door criterion (mediator confounding stress).
- `simulate_weak_overlap`: κ_e scales the treatment logit, s_q = −κ_q, (0.2, 1.2, 1.0),
  (0.1, 0.8, 1.2), (1, 1, 1).

Choices where the paper is open:
- `tau` is the CATE E[Y(1) − Y(0) | C] = θ_z E_U[σ(ℓ_Z(1, C, U)) − σ(ℓ_Z(0, C, U))], integrated
  over U by Gauss–Hermite quadrature. For α_u = 0 it is the author's θ_z·{q(1|1,C) − q(1|0,C)};
  for α_u > 0 the author's v0.1.1 reports the same expression at each unit's own U instead.
- Oracle nuisances integrate U against its posterior given the conditioning set, by quadrature.
- The nuisance-rate perturbation follows the author's code: only the numerator copies of e, q and m are
  perturbed (m_Y, m_Z and the denominator copies are not), each entry with its own draw.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.causal.nuisance import NuisanceCache

_PROB_EPS = 1e-6
_QUADRATURE_NODES = 64


class DGPParams(NamedTuple):
  """Coefficients of the structural equations in the module docstring."""

  beta0: jax.Array
  beta_c: jax.Array
  beta_u: jax.Array
  kappa_e: jax.Array
  alpha0: jax.Array
  alpha_c: jax.Array
  alpha_x: jax.Array
  alpha_u: jax.Array
  q_scale: jax.Array
  theta0: jax.Array
  theta_c: jax.Array
  theta_z: jax.Array
  theta_u: jax.Array


class FrontDoorSample(NamedTuple):
  """One simulated data set; `tau` is the true τ(C_i) of each row."""

  c: jax.Array  # (n, d) float32
  x: jax.Array  # (n,) int32 in {0, 1}
  z: jax.Array  # (n,) int32 in {0, 1}
  y: jax.Array  # (n,) float32
  tau: jax.Array  # (n,) float32
  params: DGPParams


def treatment_logit(params: DGPParams, c: jax.Array, u: jax.Array) -> jax.Array:
  """Logit of P(X=1 | C, U); `u` broadcasts against `c @ beta_c`."""
  return params.kappa_e * (params.beta0 + c @ params.beta_c + params.beta_u * u)


def mediator_logit(params: DGPParams, c: jax.Array, x: jax.Array, u: jax.Array) -> jax.Array:
  """Logit of P(Z=1 | X, C, U); `x` and `u` broadcast against `c @ alpha_c`."""
  return params.q_scale * (params.alpha0 + c @ params.alpha_c + params.alpha_x * x) + (
    params.alpha_u * u
  )


def _outcome(params: DGPParams, c, z, u, noise) -> jax.Array:
  return params.theta0 + c @ params.theta_c + params.theta_z * z + params.theta_u * u + noise


def _unit_vectors(key: jax.Array, d: int) -> jax.Array:
  """Three random unit directions (w_X, w_Z, w_Y) in R^d."""
  w = jax.random.normal(key, (3, d))
  return w / jnp.linalg.norm(w, axis=1, keepdims=True)


def _draw(key: jax.Array, params: DGPParams, n: int, d: int):
  """Draws (C, U, X, Z, noise) from the structural equations."""
  key_c, key_u, key_x, key_z, key_noise = jax.random.split(key, 5)
  c = jax.random.normal(key_c, (n, d))
  u = jax.random.normal(key_u, (n,))
  x = jax.random.bernoulli(key_x, jax.nn.sigmoid(treatment_logit(params, c, u))).astype(jnp.int32)
  z_prob = jax.nn.sigmoid(mediator_logit(params, c, x, u))
  z = jax.random.bernoulli(key_z, z_prob).astype(jnp.int32)
  return c, u, x, z, jax.random.normal(key_noise, (n,))


class _Coefficients(NamedTuple):
  """Scalar coefficients of a DGP; the `*_c` slopes multiply random unit directions."""

  beta0: float
  beta_c: float
  beta_u: float
  kappa_e: float
  alpha0: float
  alpha_c: float
  alpha_x: float
  alpha_u: float
  q_scale: float
  theta_c: float
  theta_z: float
  theta_u: float


@functools.partial(jax.jit, static_argnames=("n", "d"))
def _simulate(key: jax.Array, coefs: _Coefficients, simpson, n: int, d: int) -> FrontDoorSample:
  """Both DGPs: draws w, then (C, U, X, Z, Y); `simpson` enables the θ_u rescale."""
  key_w, key_draw = jax.random.split(key)
  w = _unit_vectors(key_w, d)
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  params = DGPParams(
    f32(coefs.beta0), coefs.beta_c * w[0], f32(coefs.beta_u), f32(coefs.kappa_e),
    f32(coefs.alpha0), coefs.alpha_c * w[1], f32(coefs.alpha_x), f32(coefs.alpha_u),
    f32(coefs.q_scale), f32(0.0), coefs.theta_c * w[2], f32(coefs.theta_z), f32(coefs.theta_u),
  )  # fmt: skip
  c, u, x, z, noise = _draw(key_draw, params, n, d)
  y = _outcome(params, c, z, u, noise)
  naive_contrast = jnp.sum(y * x) / jnp.sum(x) - jnp.sum(y * (1 - x)) / jnp.sum(1 - x)
  rescale = jnp.logical_and(simpson, naive_contrast >= 0)
  params = params._replace(theta_u=jnp.where(rescale, 1.25, 1.0) * params.theta_u)
  y = _outcome(params, c, z, u, noise)
  return FrontDoorSample(c, x, z, y, true_effect(params, c), params)


def simulate_main(key: jax.Array, n: int, d: int = 10, alpha_u: float = 0.0) -> FrontDoorSample:
  """The author's main DGP (`simulate_fd_data_md`), with the Simpson-paradox θ_u rescale."""
  coefs = _Coefficients(0.1, 0.7, 0.7, 1.0, 0.1, 0.7, 1.2, alpha_u, 1.0, 0.7, 1.4, -2.4)
  return _simulate(key, coefs, True, n, d)


def simulate_weak_overlap(
  key: jax.Array, n: int, d: int = 10, kappa_e: float = 4.0, kappa_q: float = 1.0
) -> FrontDoorSample:
  """The author's weak-overlap DGP (`simulate_fd_data_weak_overlap`); larger κ means less overlap."""
  coefs = _Coefficients(0.2, 1.2, 1.0, kappa_e, 0.1, 0.8, 1.2, 0.0, -kappa_q, 1.0, 1.0, 1.0)
  return _simulate(key, coefs, False, n, d)


def _standard_normal_quadrature(num_nodes: int = _QUADRATURE_NODES):
  """Gauss–Hermite nodes and weights for E[f(U)], U ~ N(0, 1)."""
  nodes, weights = np.polynomial.hermite_e.hermegauss(num_nodes)
  return jnp.asarray(nodes, jnp.float32), jnp.asarray(weights / weights.sum(), jnp.float32)


def true_effect(params: DGPParams, c: jax.Array) -> jax.Array:
  """τ(C) = E[Y | do(X=1), C] − E[Y | do(X=0), C], integrating U out."""
  nodes, weights = _standard_normal_quadrature()
  q1 = jax.nn.sigmoid(mediator_logit(params, c[:, None, :], 1.0, nodes))
  q0 = jax.nn.sigmoid(mediator_logit(params, c[:, None, :], 0.0, nodes))
  return params.theta_z * ((q1 - q0) @ weights)


def _posterior_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
  """Σ_u values·weights / Σ_u weights over the last (quadrature) axis."""
  return jnp.sum(values * weights, -1) / jnp.sum(weights, -1)


@jax.jit
def oracle_nuisances(params: DGPParams, c: jax.Array) -> NuisanceCache:
  """The true e, q, m, m_Y and m_Z at each row of `c`."""
  nodes, prior = _standard_normal_quadrature()
  arms = jnp.arange(2.0)[None, :, None]
  px1 = jax.nn.sigmoid(treatment_logit(params, c[:, None, :], nodes))  # (n, G)
  e1 = px1 @ prior
  joint_x = prior * jnp.stack([1 - px1, px1], axis=1)  # (n, x, G) ∝ p(U, X=x | C)
  pz1 = jax.nn.sigmoid(mediator_logit(params, c[:, None, None, :], arms, nodes))  # (n, x, G)
  q1 = _posterior_mean(pz1, joint_x)
  joint_zx = joint_x[:, None] * jnp.stack([1 - pz1, pz1], axis=1)  # (n, z, x, G)
  linear = params.theta0 + c @ params.theta_c
  m = (
    linear[:, None, None]
    + params.theta_z * jnp.arange(2.0)[None, :, None]
    + params.theta_u * _posterior_mean(nodes, joint_zx)
  )
  m_y = linear[:, None] + params.theta_z * q1 + params.theta_u * _posterior_mean(nodes, joint_x)
  m_z = e1 * q1[:, 1] + (1 - e1) * q1[:, 0]
  return NuisanceCache(e1, q1, m, m_y, m_z, e1, q1)


@functools.partial(jax.jit, static_argnames=("n",))
def perturb_nuisances(
  cache: NuisanceCache, key: jax.Array, delta: jax.Array | float, n: int
) -> NuisanceCache:
  """The author's nuisance-rate stress: p ← clip(p + δε), μ ← μ + δε, ε ~ N(n^{-1/4}, var n^{-1/4}).

  Only the numerator copies `e1`, `q1` and `m` change (author's `shrink_prob`/`shrink_regression`
  in `nuisance_cache_on`); probabilities are clipped to [1e-6, 1 − 1e-6]. Shapes are free. The
  author draws q(1|X_i, C_i) at the observed arm independently of the table q(1|x, C_i); here it is
  read from the one perturbed (n, 2) table, so it shares that arm's draw (same marginal law).
  """
  rate = float(n) ** -0.25
  key_e, key_q, key_m = jax.random.split(key, 3)

  def shift(key, value):
    return value + delta * (rate + np.sqrt(rate) * jax.random.normal(key, value.shape))

  clip = lambda p: jnp.clip(p, _PROB_EPS, 1 - _PROB_EPS)
  return cache._replace(
    e1=clip(shift(key_e, cache.e1)), q1=clip(shift(key_q, cache.q1)), m=shift(key_m, cache.m)
  )
