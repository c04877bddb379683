"""Random sawtooth functions: the second synthetic meta-learning family of "Efficient Autoregressive
Inference for Transformer Probabilistic Models" (ICLR 2026), the sawtooth process of Bruinsma et al.
(2023), "Autoregressive Conditional Neural Processes":

  f(x) = A * ((omega * (d x - u / omega)) mod 1),   y = f(x) + sigma_n eps,

with frequency omega ~ U[omega_min, omega_max] (period 1 / omega), direction d uniform on {-1, +1}
(rising or falling teeth), phase u ~ U[0, 1) (a uniformly random offset within one period), amplitude
A ~ U[A_min, A_max] (Bruinsma et al.: A = 1) and Gaussian observation noise. The process is not
Gaussian: its discontinuities make marginals of unobserved points multimodal, where joint
predictions (which commit to one phase) gain most over independent ones.

  `sample_tasks`                  x, y and the hidden parameters of `num_tasks` tasks.
  `sawtooth`                      f at x for given parameters.
  `known_parameter_log_density`   log p(y | f) with the true parameters known: noise only, an upper
                                  bound in expectation of any model's log-likelihood of the targets.
Pure functions of plain arguments and keys, float32.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SawtoothPrior:
  """The task distribution (defaults: Bruinsma et al.'s family on the GP experiments' inputs)."""

  frequency_min: float = 3.0
  frequency_max: float = 5.0
  amplitude_min: float = 1.0
  amplitude_max: float = 1.0
  noise_std: float = 0.05
  x_min: float = -2.0
  x_max: float = 2.0

  def __post_init__(self):
    if not 0 < self.frequency_min <= self.frequency_max:
      raise ValueError(
        f"SawtoothPrior: need 0 < frequency_min <= frequency_max, got {self.frequency_min}, "
        f"{self.frequency_max}"
      )
    if not 0 < self.amplitude_min <= self.amplitude_max:
      raise ValueError(
        f"SawtoothPrior: need 0 < amplitude_min <= amplitude_max, got {self.amplitude_min}, "
        f"{self.amplitude_max}"
      )


def sawtooth(x, frequency, direction, phase, amplitude) -> jax.Array:
  """A ((omega (d x) - u) mod 1): teeth of height A and period 1 / omega, shifted by u periods."""
  return amplitude * jnp.mod(frequency * direction * x - phase, 1.0)


def sample_task(key, num_points: int, prior: SawtoothPrior = SawtoothPrior()) -> dict:
  """One task: `x [P]`, `y [P]` (noisy) and its parameters `frequency`, `direction`, `phase`,
  `amplitude` (scalars)."""
  k_freq, k_dir, k_phase, k_amp, k_x, k_noise = jax.random.split(key, 6)
  frequency = jax.random.uniform(k_freq, (), minval=prior.frequency_min, maxval=prior.frequency_max)
  direction = jnp.where(jax.random.bernoulli(k_dir), 1.0, -1.0)
  phase = jax.random.uniform(k_phase, ())
  amplitude = jax.random.uniform(k_amp, (), minval=prior.amplitude_min, maxval=prior.amplitude_max)
  x = jax.random.uniform(k_x, (num_points,), minval=prior.x_min, maxval=prior.x_max)
  f = sawtooth(x, frequency, direction, phase, amplitude)
  y = f + prior.noise_std * jax.random.normal(k_noise, (num_points,))
  return {
    "x": x,
    "y": y,
    "frequency": frequency,
    "direction": direction,
    "phase": phase,
    "amplitude": amplitude,
  }


def sample_tasks(key, num_tasks: int, num_points: int, prior: SawtoothPrior = SawtoothPrior()):
  """`num_tasks` independent tasks, each field with a leading `[num_tasks]` axis."""
  return jax.vmap(lambda k: sample_task(k, num_points, prior))(jax.random.split(key, num_tasks))


def known_parameter_log_density(x, y, frequency, direction, phase, amplitude, prior) -> jax.Array:
  """`sum_i log N(y_i; f(x_i), sigma_n^2)` of one task's points with the true f known (a scalar)."""
  f = sawtooth(x, frequency, direction, phase, amplitude)
  z = (y - f) / prior.noise_std
  return jnp.sum(-0.5 * z**2 - math.log(prior.noise_std) - 0.5 * math.log(2 * math.pi))
