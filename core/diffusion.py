"""Diffusion and flow maths shared by the diffusion methods: the VE process, rectified flow, DDPM/DDIM.

Forward process `x_t = x_0 + t * eps`, `eps ~ N(0, I)`, `t in [0, inf)` (QDPM, OpenReview 5ekhMkawuT). Time
arrays broadcast over the trailing axes of the data: a scalar `t`, or `t` of shape `(B,)` for `x` of
shape `(B, ...)`. Denoisers are x-predictions `x_hat_fn(x_t, t) -> x_hat` with `t` of shape `(B,)`.

- `ve_perturb`: the forward marginal.
- `ve_posterior_mean_var`, `ve_posterior_step`: `q(x_t | x_s, x_0 = x_hat)` for `t < s`, the exact
  Gaussian transition of the first-order SDE solver (QDPM-Solver-1).
- `network_input`: the input scaling `(x_t - offset) / sqrt(sigma_data^2 + t^2)` (QDPM: `sigma_data = 1`).
- `ve_ancestral_sample`: first-order ancestral sampler over any decreasing time grid.
- `ve_midpoint_sample`: second-order (DPM-Solver++(2S)-style) ancestral sampler over a time grid
  plus one midpoint per step; the x-prediction is linearised in the SNR `1/t^2` (derivation there).

Rectified flow (Open-Sora 1.2, Wan, HunyuanVideo; BWCache, arXiv 2509.13789, builds on it):
`x_t = (1 - t) x_0 + t eps`, `t in [0, 1]` (t = 1 is noise), velocity target `v = eps - x_0`,
sampled from t = 1 to 0 with Euler.
- `rf_interpolate`, `rf_velocity_target`, `logit_normal_time`: training pairs.
- `rf_time_grid`, `euler_step`, `euler_sampler`: the sampler.
- Endpoint (data) prediction on the same path (Flow2GAN, ICLR 2026, Sec. 3.1: the network predicts the
  clean data and the sampler converts it to the velocity): `rf_velocity_from_data`, `rf_data_sampler`,
  and `rf_regression_loss`, the one flow-matching loss with a velocity or data target, uniform or
  logit-normal time, a noise scale and a pluggable error reduction.

DDPM / VP with epsilon prediction (Ho et al. 2020; the setting of DiT, Latte and Open-Sora 1.0):
`x_n = sqrt(abar_n) x_0 + sqrt(1 - abar_n) eps` for integer steps `n = 0..N-1` (N = 1000), linear betas
1e-4..2e-2, the network predicts `eps` from `(x_n, n)`; sampled with deterministic DDIM (eta = 0, Song
et al. 2021, Eq. 12) on a subset of the training steps.
- `linear_alpha_bars`, `alpha_bar_at`: the schedule.
- `ddpm_timesteps`, `ddpm_perturb`: training pairs (the target is `eps` itself).
- `ddim_time_grid`, `ddim_x0`, `ddim_step`: the sampler.

`Sampler` (a time grid and a step `(x, model_out, t, t_next) -> x`) lets one sampling loop, `sample` or
the block-caching sampler of `core/block_cache.py`, run either `euler_sampler` or `ddim_sampler`.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

XHatFn = Callable[[jax.Array, jax.Array], jax.Array]


def broadcast_time(t: jax.Array, x: jax.Array) -> jax.Array:
  """Reshapes a scalar or `(B,)` time so it broadcasts against `x` of shape `(B, ...)`."""
  t = jnp.asarray(t, dtype=jnp.result_type(x.dtype, jnp.float32))
  return jnp.reshape(t, t.shape + (1,) * (x.ndim - t.ndim))


def ve_perturb(x0: jax.Array, t: jax.Array, eps: jax.Array) -> jax.Array:
  """The VE forward marginal `x_t = x_0 + t * eps`."""
  return x0 + broadcast_time(t, x0) * eps


def ve_posterior_mean_var(
  x_s: jax.Array, x_hat: jax.Array, s: jax.Array, t: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Mean and variance of `q(x_t | x_s, x_0 = x_hat)` for `0 <= t < s` (QDPM-Solver-1).

  Mean `(t^2/s^2) x_s + (1 - t^2/s^2) x_hat`, variance `t^2 (1 - t^2/s^2)` (broadcast to `x_s`).
  """
  s, t = broadcast_time(s, x_s), broadcast_time(t, x_s)
  keep = jnp.square(t / s)
  mean = keep * x_s + (1.0 - keep) * x_hat
  var = jnp.broadcast_to(jnp.square(t) * (1.0 - keep), mean.shape)
  return mean, var


def ve_posterior_step(
  rng: jax.Array, x_s: jax.Array, x_hat: jax.Array, s: jax.Array, t: jax.Array
) -> jax.Array:
  """Draws `x_t ~ q(x_t | x_s, x_0 = x_hat)`; noise-free when `t = 0`."""
  mean, var = ve_posterior_mean_var(x_s, x_hat, s, t)
  return mean + jnp.sqrt(var) * jax.random.normal(rng, mean.shape, mean.dtype)


def network_input(
  x_t: jax.Array, t: jax.Array, sigma_data: float = 1.0, offset: float = 0.0
) -> jax.Array:
  """Unit-variance network input `(x_t - offset) / sqrt(sigma_data^2 + t^2)`."""
  t = broadcast_time(t, x_t)
  return (x_t - offset) * jax.lax.rsqrt(sigma_data**2 + jnp.square(t))


def _per_example_time(t: jax.Array, x: jax.Array) -> jax.Array:
  return jnp.broadcast_to(t, x.shape[:1])


def ve_ancestral_sample(
  rng: jax.Array, x_hat_fn: XHatFn, x_init: jax.Array, ts: jax.Array
) -> jax.Array:
  """First-order ancestral VE sampler (QDPM-Solver-1 for a u-uniform grid).

  Args:
    rng: PRNG key.
    x_hat_fn: x-prediction `(x_t, t) -> x_hat`, `t` of shape `(B,)`.
    x_init: state at time `ts[0]`, shape `(B, ...)`.
    ts: `(N,)` strictly decreasing positive times.

  Returns:
    `x_hat_fn(x, ts[-1])` after the `N - 1` Gaussian transitions `ts[i] -> ts[i+1]` with
    `x_hat = x_hat_fn(x, ts[i])`: the last step to `t = 0` returns the prediction without noise.
    `N` network evaluations.
  """

  def step(x, inputs):
    s, t, key = inputs
    x_hat = x_hat_fn(x, _per_example_time(s, x))
    return ve_posterior_step(key, x, x_hat, s, t), None

  keys = jax.random.split(rng, ts.shape[0] - 1)
  x, _ = jax.lax.scan(step, x_init, (ts[:-1], ts[1:], keys))
  return x_hat_fn(x, _per_example_time(ts[-1], x))


def ve_midpoint_x_hat(
  x_hat_fn: XHatFn, x_s: jax.Array, s: jax.Array, m: jax.Array, t: jax.Array
) -> jax.Array:
  """Second-order x-prediction for the step `s -> t` from one extra evaluation at `m in (t, s)`.

  The reverse VE SDE solved exactly from `s` to `t` is `x_t = (t^2/s^2) x_s + (1 - t^2/s^2) x_bar +
  noise`, where `x_bar` is the average of `x_hat` over the SNR `nu = 1/tau^2` uniformly on
  `[nu_s, nu_t]` (integrate `d(x/tau^2) = -2 x_hat dtau / tau^3`); the noise does not involve
  `x_hat`. With `x_hat` linear in `nu` through `(nu_s, x_hat_s)` and `(nu_m, x_hat_m)` the average
  is `x_hat_s + (x_hat_m - x_hat_s) / (2 r)`, `r = (nu_m - nu_s) / (nu_t - nu_s)` (our
  reading of QDPM-Solver-2, which the paper describes only as "second order via Runge-Kutta
  ideas"). As in DPM-Solver++(2S), the midpoint state is the deterministic probability-flow (DDIM)
  step `x_m = x_hat_s + (m/s)(x_s - x_hat_s)`, which keeps `x_m` at noise level `m`. Needs `t > 0`.
  """
  x_hat_s = x_hat_fn(x_s, _per_example_time(s, x_s))
  x_m = x_hat_s + broadcast_time(m / s, x_s) * (x_s - x_hat_s)
  x_hat_m = x_hat_fn(x_m, _per_example_time(m, x_s))
  nu_s, nu_m, nu_t = 1.0 / jnp.square(s), 1.0 / jnp.square(m), 1.0 / jnp.square(t)
  r = (nu_m - nu_s) / (nu_t - nu_s)
  return x_hat_s + broadcast_time(0.5 / r, x_s) * (x_hat_m - x_hat_s)


def ve_midpoint_sample(
  rng: jax.Array, x_hat_fn: XHatFn, x_init: jax.Array, ts: jax.Array, mid_ts: jax.Array
) -> jax.Array:
  """Second-order ancestral VE sampler (our reading of QDPM-Solver-2, u-midpoints).

  Like `ve_ancestral_sample`, but transition `ts[i] -> ts[i+1]` uses `ve_midpoint_x_hat` with the
  midpoint `mid_ts[i]` (shape `(N - 1,)`, strictly between the two) in the same Gaussian transition.
  `2 (N - 1) + 1` network evaluations.
  """

  def step(x, inputs):
    s, m, t, key = inputs
    x_hat = ve_midpoint_x_hat(x_hat_fn, x, s, m, t)
    return ve_posterior_step(key, x, x_hat, s, t), None

  keys = jax.random.split(rng, ts.shape[0] - 1)
  x, _ = jax.lax.scan(step, x_init, (ts[:-1], mid_ts, ts[1:], keys))
  return x_hat_fn(x, _per_example_time(ts[-1], x))


# ---------------------------------------------------------------------------------------------------
# Rectified flow
# ---------------------------------------------------------------------------------------------------


def rf_interpolate(x0: jax.Array, eps: jax.Array, t: jax.Array) -> jax.Array:
  """`x_t = (1 - t) x_0 + t eps` with `t` scalar or `(B,)`."""
  t = broadcast_time(t, x0)
  return (1.0 - t) * x0 + t * eps


def rf_velocity_target(x0: jax.Array, eps: jax.Array) -> jax.Array:
  """`v = d x_t / dt = eps - x_0`."""
  return eps - x0


def logit_normal_time(
  rng: jax.Array, shape: tuple[int, ...], mean: float = 0.0, std: float = 1.0
) -> jax.Array:
  """`t = sigmoid(mean + std * n)`, `n ~ N(0, 1)`: the rectified-flow training time of SD3/Open-Sora."""
  return jax.nn.sigmoid(mean + std * jax.random.normal(rng, shape))


def rf_time_grid(num_steps: int, shift: float = 1.0) -> jax.Array:
  """`num_steps + 1` times from 1 to 0; `shift > 1` spends more steps at high noise (SD3's shift)."""
  t = jnp.linspace(1.0, 0.0, num_steps + 1)
  return shift * t / (1.0 + (shift - 1.0) * t)


def euler_step(x: jax.Array, velocity: jax.Array, t: jax.Array, t_next: jax.Array) -> jax.Array:
  """One Euler step of `dx/dt = v` from `t` to `t_next` (< t)."""
  return x + (t_next - t) * velocity


# ---------------------------------------------------------------------------------------------------
# DDPM (VP, epsilon prediction) and DDIM
# ---------------------------------------------------------------------------------------------------

DDIM_SPACINGS = ("linspace", "leading", "trailing")


def linear_alpha_bars(
  num_train_steps: int = 1000, beta_start: float = 1e-4, beta_end: float = 2e-2
) -> jax.Array:
  """`abar_n = prod_{i <= n} (1 - beta_i)` for betas linear in `n` (Ho et al. 2020, Sec. 4), shape `(N,)`.

  The defaults are the schedule DiT, Latte and Open-Sora 1.0 train with; the product is taken in float64
  as their reference code does, then stored as float32.
  """
  betas = np.linspace(beta_start, beta_end, num_train_steps, dtype=np.float64)
  return jnp.asarray(np.cumprod(1.0 - betas), jnp.float32)


def alpha_bar_at(alpha_bars: jax.Array, n: jax.Array) -> jax.Array:
  """`abar_n` at integer-valued steps `n` (any shape); 1 for `n < 0`, the clean data DDIM ends at."""
  n = jnp.asarray(n)
  index = jnp.clip(n, 0, alpha_bars.shape[0] - 1).astype(jnp.int32)
  return jnp.where(n >= 0, alpha_bars[index], 1.0)


def ddpm_timesteps(rng: jax.Array, shape: tuple[int, ...], num_train_steps: int) -> jax.Array:
  """Training steps `n ~ U{0, ..., N-1}` as float32 (the network's time input is `n`, as in DiT)."""
  return jax.random.randint(rng, shape, 0, num_train_steps).astype(jnp.float32)


def ddpm_perturb(x0: jax.Array, eps: jax.Array, alpha_bar: jax.Array) -> jax.Array:
  """`x_n = sqrt(abar_n) x_0 + sqrt(1 - abar_n) eps` (Ho et al. 2020, Eq. 4); the eps-prediction
  target is `eps`. `alpha_bar` is a scalar or `(B,)`."""
  alpha_bar = broadcast_time(alpha_bar, x0)
  return jnp.sqrt(alpha_bar) * x0 + jnp.sqrt(1.0 - alpha_bar) * eps


def ddim_x0(x_t: jax.Array, eps_hat: jax.Array, alpha_bar: jax.Array) -> jax.Array:
  """The clean-data estimate `(x_t - sqrt(1 - abar) eps_hat) / sqrt(abar)` (Song et al. 2021, Eq. 12)."""
  alpha_bar = broadcast_time(alpha_bar, x_t)
  return (x_t - jnp.sqrt(1.0 - alpha_bar) * eps_hat) * jax.lax.rsqrt(alpha_bar)


def ddim_step(
  x: jax.Array,
  eps_hat: jax.Array,
  alpha_bar: jax.Array,
  alpha_bar_next: jax.Array,
  clip_x0: float | None = None,
) -> jax.Array:
  """Deterministic DDIM (eta = 0, Song et al. 2021, Eq. 12) from `abar` to `abar_next` (>= abar):
  `x' = sqrt(abar') x0_hat + sqrt(1 - abar') eps_hat`. Computed in float32 at least, returned in
  `x.dtype` so that it can be a scan carry.

  `clip_x0 = c` clips x0_hat to [-c, c] and re-derives eps_hat from it (guided-diffusion's
  `clip_denoised`, for pixel data in a known range): near abar = 0 the division by sqrt(abar)
  amplifies the model's eps error (x 157 at the first of 1000 linear-beta steps), and without the
  clip that error is carried to the end. Leave it None for latents of unbounded range.
  """
  out_dtype, dtype = x.dtype, jnp.result_type(x.dtype, jnp.float32)
  x, eps_hat = x.astype(dtype), eps_hat.astype(dtype)
  x0_hat = ddim_x0(x, eps_hat, alpha_bar)
  if clip_x0 is not None:
    x0_hat = jnp.clip(x0_hat, -clip_x0, clip_x0)
    abar = broadcast_time(alpha_bar, x)
    eps_hat = (x - jnp.sqrt(abar) * x0_hat) * jax.lax.rsqrt(1.0 - abar)
  alpha_bar_next = broadcast_time(alpha_bar_next, x)
  x_next = jnp.sqrt(alpha_bar_next) * x0_hat + jnp.sqrt(1.0 - alpha_bar_next) * eps_hat
  return x_next.astype(out_dtype)


def ddim_time_grid(
  num_steps: int, num_train_steps: int = 1000, spacing: str = "linspace"
) -> jax.Array:
  """`num_steps` decreasing training steps to evaluate the network at, then -1 (the clean data).

  spacing (all uniform over the `N` training steps):
    "linspace"  `round(i (N - 1) / (K - 1))`: first step N - 1, last 0 -- guided-diffusion's respacing
                of a plain step count, which Latte's and DiT's sampling scripts use (the default here);
    "leading"   `i * (N // K)`: 0, N/K, ... (the DDIM paper; diffusers' default), never reaches N - 1;
    "trailing"  `round(N - i N / K) - 1`: N - 1, ..., N/K - 1 (Lin et al. 2024): starts at pure noise.
  """
  if spacing not in DDIM_SPACINGS:
    raise ValueError(f"spacing must be one of {DDIM_SPACINGS}, got {spacing!r}")
  if not 0 < num_steps <= num_train_steps:
    raise ValueError(f"need 0 < num_steps <= {num_train_steps}, got {num_steps}")
  if spacing == "linspace":
    steps = np.round(np.linspace(num_train_steps - 1, 0, num_steps))
  elif spacing == "leading":
    steps = (np.arange(num_steps) * (num_train_steps // num_steps))[::-1]
  else:
    steps = np.round(num_train_steps - np.arange(num_steps) * num_train_steps / num_steps) - 1
  return jnp.asarray(np.append(steps, -1.0), jnp.float32)


# ---------------------------------------------------------------------------------------------------
# One sampling loop for either solver
# ---------------------------------------------------------------------------------------------------

StepFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


class Sampler(NamedTuple):
  """A deterministic sampler: the model is called at `times[j]` (its time input, as `(B,)`) and
  `step(x, model_out, times[j], times[j + 1])` is the state at `times[j + 1]`; `len(times) - 1` steps."""

  times: jax.Array
  step: StepFn


def euler_sampler(ts: jax.Array) -> Sampler:
  """Euler on the rectified-flow ODE over `ts` (1 -> 0); the model predicts the velocity.

  It is also deterministic DDIM for rectified flow: with `x = (1 - t) x0_hat + t eps_hat` and
  `v_hat = eps_hat - x0_hat`, the DDIM update `x' = (1 - t') x0_hat + t' eps_hat` is `x + (t' - t) v_hat`.
  """
  return Sampler(times=ts, step=euler_step)


def ddim_sampler(ts: jax.Array, alpha_bars: jax.Array, clip_x0: float | None = None) -> Sampler:
  """Deterministic DDIM over training steps `ts` (`ddim_time_grid`); the model predicts `eps`.
  `clip_x0` as in `ddim_step`."""

  def step(x, eps_hat, n, n_next):
    abar, abar_next = alpha_bar_at(alpha_bars, n), alpha_bar_at(alpha_bars, n_next)
    return ddim_step(x, eps_hat, abar, abar_next, clip_x0)

  return Sampler(times=ts, step=step)


def sample(model_fn: Callable, x_init: jax.Array, sampler: Sampler) -> jax.Array:
  """Runs `sampler` from `x_init` with `model_fn(x, t)`, `t` of shape `(B,)`, in one `lax.scan`."""

  def step(x, times):
    t, t_next = times
    return sampler.step(x, model_fn(x, jnp.full(x.shape[:1], t)), t, t_next), None

  x, _ = jax.lax.scan(step, x_init, (sampler.times[:-1], sampler.times[1:]))
  return x


# ---------------------------------------------------------------------------------------------------
# Training losses (model_fn(x_t, t) -> prediction)
# ---------------------------------------------------------------------------------------------------


def rectified_flow_loss(model_fn: Callable, x0: jax.Array, rng: jax.Array) -> jax.Array:
  """Rectified-flow velocity regression with `t ~ logit-normal(0, 1)` (Esser et al. 2024, Eq. 2 with
  their logit-normal time sampling): mean of `|model_fn(x_t, t) - (eps - x0)|^2`."""
  t_rng, eps_rng = jax.random.split(rng)
  t = logit_normal_time(t_rng, x0.shape[:1])
  eps = jax.random.normal(eps_rng, x0.shape)
  velocity = model_fn(rf_interpolate(x0, eps, t), t)
  return jnp.mean(jnp.square(velocity - rf_velocity_target(x0, eps)))


def ddpm_eps_loss(
  model_fn: Callable, x0: jax.Array, rng: jax.Array, alpha_bars: jax.Array
) -> jax.Array:
  """DDPM eps regression with `n ~ U{0..N-1}`, `N = len(alpha_bars)` (Ho et al. 2020, Eq. 14):
  mean of `|model_fn(x_n, n) - eps|^2`."""
  n_rng, eps_rng = jax.random.split(rng)
  n = ddpm_timesteps(n_rng, x0.shape[:1], alpha_bars.shape[0])
  eps = jax.random.normal(eps_rng, x0.shape)
  x_n = ddpm_perturb(x0, eps, alpha_bar_at(alpha_bars, n))
  return jnp.mean(jnp.square(model_fn(x_n, n) - eps))


# ---------------------------------------------------------------------------------------------------
# Endpoint (data) prediction on the rectified-flow path
# ---------------------------------------------------------------------------------------------------

RF_PREDICTIONS = ("velocity", "data")
RF_TIME_SAMPLINGS = ("logit_normal", "uniform")


def rf_velocity_from_data(x_t: jax.Array, x0_hat: jax.Array, t: jax.Array) -> jax.Array:
  """The velocity a data prediction implies on the linear path: `v = (x_t - x0_hat) / t`.

  From `x_t = (1 - t) x_0 + t eps`: `eps = (x_t - (1 - t) x_0) / t`, so `eps - x_0 = (x_t - x_0) / t`.
  In Flow2GAN's time `s = 1 - t` (0 = noise) this is its `(x1_hat - x) / (1 - s)` with the sign of a
  time running the other way. Needs `t > 0`: samplers never evaluate the model at `t = 0`.
  """
  return (x_t - x0_hat) / broadcast_time(t, x_t)


def rf_data_sampler(ts: jax.Array) -> Sampler:
  """Euler on the rectified-flow ODE over `ts` (1 -> 0) for a model that predicts the clean data
  (Flow2GAN's endpoint sampler): each step converts the prediction with `rf_velocity_from_data`.
  With the exact data as the prediction every step lands on the path of that data, so any grid ends
  at the data itself."""

  def step(x, x0_hat, t, t_next):
    return euler_step(x, rf_velocity_from_data(x, x0_hat, t), t, t_next)

  return Sampler(times=ts, step=step)


def rf_regression_loss(
  model_fn: Callable,
  x0: jax.Array,
  rng: jax.Array,
  *,
  prediction: str = "velocity",
  time_sampling: str = "logit_normal",
  noise_scale: float = 1.0,
  error_fn: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
  """Flow matching on `x_t = (1 - t) x_0 + t eps`, `eps = noise_scale * N(0, I)`.

  `prediction="velocity"` regresses `eps - x_0` (`rectified_flow_loss` with `noise_scale=1` and
  logit-normal time); `"data"` regresses `x_0` itself (endpoint estimation, Flow2GAN Sec. 3.1).
  `error_fn(prediction - target) -> scalar` reduces the error (default: its mean square); Flow2GAN's
  energy-scaled spectral loss is one such reduction.
  """
  if prediction not in RF_PREDICTIONS:
    raise ValueError(f"prediction must be one of {RF_PREDICTIONS}, got {prediction!r}")
  if time_sampling not in RF_TIME_SAMPLINGS:
    raise ValueError(f"time_sampling must be one of {RF_TIME_SAMPLINGS}, got {time_sampling!r}")
  t_rng, eps_rng = jax.random.split(rng)
  if time_sampling == "uniform":
    t = jax.random.uniform(t_rng, x0.shape[:1])
  else:
    t = logit_normal_time(t_rng, x0.shape[:1])
  eps = noise_scale * jax.random.normal(eps_rng, x0.shape)
  target = x0 if prediction == "data" else rf_velocity_target(x0, eps)
  error = model_fn(rf_interpolate(x0, eps, t), t) - target
  return jnp.mean(jnp.square(error)) if error_fn is None else error_fn(error)
