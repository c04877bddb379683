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
Eq. 13 is its small-noise limit. `neuron_moments` drives the network's own neuron
(`core.nn.spiking.membrane_scan`) with these inputs; its update is Euler-Maruyama for the SDE except
that `phi` clips the decay to [0, 1]. With conductance noise the unclipped decay
`1 - G_0 dt - sqrt(dt) sigma_C xi` exceeds 1 whenever `xi < -G_0 sqrt(dt) / sigma_C`, which at small dt
is almost half the steps: the clip then adds leak, and the neuron's mean falls well below `V_ss` (the
theory no longer describes it). `discrete_variance` is the exact variance of the unclipped update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core.nn import spiking


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


def discrete_variance(w, c, mu, sigma, g_l: float, dt: float) -> jax.Array:
  """The exact stationary variance of the neuron's own update (Eq. 6-7 without threshold) driven by
  `D_i^t = mu_i + sigma_i xi^t / sqrt(dt)` (shared `xi^t ~ N(0, 1)`), when `phi` never clips:
  `V^t - V_ss = (a - e xi)(V^{t-1} - V_ss) + (f - e V_ss) xi` with `a = 1 - G_0 dt`,
  `e = sqrt(dt) sigma_C`, `f = sqrt(dt) sum_i sigma_i W_i`, so
  `Var = (f - e V_ss)^2 / (1 - a^2 - e^2) = (b - sigma_C V_ss)^2 / (2 G_0 - sigma_C^2 - G_0^2 dt)`
  (`ito_variance` as dt -> 0; Eq. 13 as also sigma_C -> 0)."""
  g0, v_ss = total_conductance(c, mu, g_l), steady_state(w, c, mu, g_l)
  sigma_c = jnp.dot(sigma, c)
  denominator = 2 * g0 - sigma_c**2 - g0**2 * dt
  return jnp.where(
    denominator > 0, (jnp.dot(sigma, w) - sigma_c * v_ss) ** 2 / denominator, jnp.inf
  )


def neuron_moments(
  key: jax.Array,
  w: jax.Array,
  c: jax.Array,
  mu: jax.Array,
  sigma: jax.Array,
  g_l: float,
  dt: float,
  num_steps: int = 20_000,
  num_chains: int = 256,
  burn_in: int = 5_000,
  phi: str = "clip",
) -> dict[str, jax.Array]:
  """Drive the network's neuron (`core.nn.spiking.membrane_scan`, Eq. 5-8) with the noisy inputs of
  Eq. 13-14 and measure its stationary membrane: `mean` and `variance` of `V^t` pooled over
  `num_chains` chains and the steps after `burn_in`, and `clipped_fraction`, the fraction of steps
  where `phi` clipped the decay `1 - g_l dt - G^t` (above 1 or below 0), where the neuron leaves the
  SDE behind Eq. 13.

  The traces are `D_i^t = mu_i + sigma_i xi^t / sqrt(dt)` with one shared `xi^t ~ N(0, 1)` per step
  (white noise of unit intensity over a step); the threshold is out of reach (Eq. 13-14 ignore
  spiking). With `phi` the identity this is Euler-Maruyama for the SDE of the module docstring.
  """
  neuron = spiking.NeuronConfig(dt=dt, g_l=g_l, threshold=1e30, phi=phi)
  xi = jax.random.normal(key, (num_chains, num_steps, 1))
  trace = mu + sigma * xi / jnp.sqrt(dt)  # [chains, steps, inputs]
  current, conductance = dt * trace @ w[:, None], dt * trace @ c[:, None]
  _, v = spiking.membrane_scan(current, conductance, neuron)
  unclipped = 1.0 - g_l * dt - conductance[:, burn_in:]
  kept = v[:, burn_in:, 0]
  return {
    "mean": kept.mean(),
    "variance": jnp.mean((kept - kept.mean()) ** 2),
    "clipped_fraction": jnp.mean((unclipped > 1.0) | (unclipped < 0.0)),
  }
