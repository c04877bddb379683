"""Stochastic stability of the Dynamic Gated Neuron: stationary membrane variance under input noise.

Paper: "A Brain-Inspired Gating Mechanism Unlocks Robust Computation in Spiking Neural Networks"
(Bai, Wang, Yu; ICLR 2026), stochastic-stability analysis, Eq. 13-14. The synaptic inputs are modelled as
`D_i = mu_i + sigma_i xi(t)` with one shared Gaussian white noise `xi`, so the membrane of Eq. 4 obeys the
Ito SDE

    dV = (sum_i W_i mu_i - G_0 V) dt + sum_i sigma_i (W_i - C_i V) dB,   G_0 = g_l + sum_i C_i mu_i.

Linearising around `V_ss = sum_j W_j mu_j / G_0` gives the paper's stationary variances

    <dV^2>_DGN = [sum_i sigma_i (W_i - C_i V_ss)]^2 / (2 G_0)             (Eq. 13)
    <dV^2>_LIF = (sum_i W_i sigma_i)^2 / (2 g_l)                          (Eq. 14, C = 0)

i.e. the conductance pathway lowers the variance twice: the leak grows with the mean input ("leak
scaling", `G_0 > g_l`) and the noise is partly cancelled ("noise compensation", `W_i - C_i V_ss`).
Without linearising, the multiplicative noise `-sigma_C V dB` (`sigma_C = sum_i sigma_i C_i`) adds
itself to the variance's balance, `d Var/dt = -2 G_0 Var + (b - sigma_C V_ss)^2 + sigma_C^2 Var`, so
the exact stationary variance is `(b - sigma_C V_ss)^2 / (2 G_0 - sigma_C^2)` (`ito_variance`, ours):
Eq. 13 is its small-noise limit. `simulate_variance` integrates the SDE by Euler-Maruyama.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def total_conductance(c: jax.Array, mu: jax.Array, g_l: float) -> jax.Array:
  """`G_0 = g_l + sum_i C_i mu_i`."""
  return g_l + jnp.dot(c, mu)


def steady_state(w: jax.Array, c: jax.Array, mu: jax.Array, g_l: float) -> jax.Array:
  """`V_ss = sum_j W_j mu_j / G_0`."""
  return jnp.dot(w, mu) / total_conductance(c, mu, g_l)


def dgn_variance(w, c, mu, sigma, g_l: float) -> jax.Array:
  """Eq. 13: the linearised stationary variance of the DGN membrane."""
  g0, v_ss = total_conductance(c, mu, g_l), steady_state(w, c, mu, g_l)
  return jnp.dot(sigma, w - c * v_ss) ** 2 / (2 * g0)


def lif_variance(w, sigma, g_l: float) -> jax.Array:
  """Eq. 14: the stationary variance of the LIF membrane (`C = 0`)."""
  return jnp.dot(w, sigma) ** 2 / (2 * g_l)


def ito_variance(w, c, mu, sigma, g_l: float) -> jax.Array:
  """The exact stationary variance of the multiplicative-noise SDE (module docstring); Eq. 13 as
  `sigma_C -> 0`. Infinite (no stationary variance) once `sigma_C^2 >= 2 G_0`."""
  g0, v_ss = total_conductance(c, mu, g_l), steady_state(w, c, mu, g_l)
  sigma_c = jnp.dot(sigma, c)
  denominator = 2 * g0 - sigma_c**2
  return jnp.where(
    denominator > 0, (jnp.dot(sigma, w) - sigma_c * v_ss) ** 2 / denominator, jnp.inf
  )


def simulate_variance(
  key: jax.Array,
  w: jax.Array,
  c: jax.Array,
  mu: jax.Array,
  sigma: jax.Array,
  g_l: float,
  dt: float = 1e-3,
  num_steps: int = 20_000,
  num_chains: int = 256,
  burn_in: int = 5_000,
) -> jax.Array:
  """Variance of `V` from Euler-Maruyama on `num_chains` independent chains started at `V_ss`,
  pooling every step after `burn_in` (Ito, shared noise across inputs as in Eq. 13-14)."""
  g0, v_ss = total_conductance(c, mu, g_l), steady_state(w, c, mu, g_l)
  drive, noise_w, noise_c = jnp.dot(w, mu), jnp.dot(sigma, w), jnp.dot(sigma, c)

  def step(v, db):
    v = v + (drive - g0 * v) * dt + (noise_w - noise_c * v) * db
    return v, v

  increments = jnp.sqrt(dt) * jax.random.normal(key, (num_steps, num_chains))
  _, path = jax.lax.scan(step, jnp.full((num_chains,), v_ss), increments)
  kept = path[burn_in:]
  return jnp.mean((kept - kept.mean()) ** 2)
