"""Naive back-door baselines for the front-door setting: they adjust for C alone and ignore Z.

With U confounding X and Y, adjusting for the observed C does not identify τ(C); the back-door learners
below recover E[Y|X=1,C] − E[Y|X=0,C], which the main DGP makes negative while the causal effect is
positive (a Simpson-type paradox the author's DGP enforces). They share the front-door nuisance cache
(`e1_denom` and `m_y` of `core.causal.nuisance.NuisanceCache`), so the comparison uses the same
learners, folds and final stages.
"""

import jax
import jax.numpy as jnp

from core.causal.nuisance import NuisanceCache


def difference_in_means(x: jax.Array, y: jax.Array, weights: jax.Array) -> jax.Array:
  """The unadjusted contrast E[Y | X=1] − E[Y | X=0] under row `weights`."""
  treated = weights * x
  control = weights * (1 - x)
  return jnp.sum(treated * y) / jnp.sum(treated) - jnp.sum(control * y) / jnp.sum(control)


def aipw_pseudo_outcome(cache: NuisanceCache, x: jax.Array, y: jax.Array) -> jax.Array:
  """The back-door DR-learner pseudo-outcome (Kennedy's DR-learner, AIPW), X → Y given C:

    ψ_BD = m_Y(1,C) − m_Y(0,C) + X (Y − m_Y(1,C)) / e_1(C) − (1 − X)(Y − m_Y(0,C)) / e_0(C).

  Expects a stabilised cache: `e1_denom` is the floored propensity.
  """
  m1, m0 = cache.m_y[:, 1], cache.m_y[:, 0]
  e1 = cache.e1_denom
  return m1 - m0 + x * (y - m1) / e1 - (1 - x) * (y - m0) / (1 - e1)
