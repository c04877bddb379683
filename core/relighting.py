r"""LightCtrl's training-free relighting maths: "LightCtrl: Training-free Controllable Video Relighting"
(Peng, Chen, Zhang, Cun; ICLR 2026), official code GVCLab/LightCtrl (`src/vdm_pipe.py`, `src/ic_light.py`,
`src/animatediff_eul.py`, `utils/tools.py`).

Claim: a per-frame image relighter (IC-Light) steered by a light map, fused into the denoising loop of a
video diffusion prior, relights a video along a user-given light trajectory; Light Map Injection (LMI)
makes the light follow the path and Geometry-Aware Relighting (GAR) removes the source shading.

Schedules and samplers (diffusers' `EulerAncestralDiscreteScheduler` in its sigma parameterisation):
- `scaled_linear_alpha_bars`: SD-1.5's betas, `beta = linspace(sqrt(b0), sqrt(b1), N)^2`;
  `linear_alpha_bars`: `beta = linspace(b0, b1, N)` (the official code's video scheduler).
- `euler_schedule`: `round(steps / strength)` "linspace" timesteps, of which the last `steps` run
  (SDEdit: video-to-video at strength 0.5, IC-Light img2img at 0.9), their sigmas
  `sqrt((1 - abar) / abar)` and a final 0. The state is `z = x0 + sigma eps`; the network sees
  `z / sqrt(sigma^2 + 1)` (the VP sample) and the step `t`.
- `euler_ancestral_step`: `d = (z - x0) / sigma`, `z' = z + d (sigma_down - sigma) + sigma_up eps`,
  `sigma_up = sqrt(sigma'^2 (sigma^2 - sigma'^2) / sigma^2)`, `sigma_down = sqrt(sigma'^2 - sigma_up^2)`;
  LightCtrl calls it with the predicted x0 **replaced** by the fused latent (`eul_step`).

Light Map Injection (Sec. 3.2; `inject_light_map_noise` in `src/vdm_pipe.py`):
- `lmi_masks`: per frame `M_k = [exp(-d^2 / (2 sigma^2)) > threshold]`, sigma = R / f in latent pixels.
- `inject_light_map`: `z_m = M (omega eps + (1 - omega) z_m) + (1 - M) z_m` with fresh eps per frame.

Progressive light fusion and the detail residual (Sec. 3.3, the loop of `src/vdm_pipe.py`):
- `fusion_weights`: `lambda_i = 1 - i / (N - 1)`; fusion runs while `lambda_i > 0.15`.
- `fuse`: `(1 - lambda) I + lambda I'`.

Geometry-Aware Relighting (Sec. 3.4; `Relighter.__call__` in `src/ic_light.py`, `utils/tools.py`):
- `butterworth_low_pass`, `gaussian_low_pass`, `ideal_low_pass`: the official filters in closed form
  (vectorised instead of the triple loop), `d^2 = ((d_s/d_t)(2a/A - 1))^2 + (2h/H - 1)^2 + (2w/W - 1)^2`
  over the three filtered axes, all zeros when a cutoff is 0.
- `frequency_mix`: `IFFT(FFT(z_low) H + FFT(z_high) (1 - H)).real` with fftshift over `axes`.
- `geometry_aware_latent`: the low band from the normal-map latent, the high band from the RGB latent,
  Butterworth of order 4 at cutoff lambda.

`lightctrl_sample` is the whole training-free loop as one function (a `lax.scan` over the denoising
steps, the fusion branch under `lax.cond`), and `relight_frames` the per-frame relighter sampler it
calls (a `lax.scan` over the relighter's steps, all frames batched); both take the networks as
callables so that tests and methods can plug in anything with the same signature.

Choices where the paper is open:
- The filter axes: the official code filters the last three axes of `(F, C, H, W)` latents, i.e.
  (C, H, W) of each frame, not time, though the paper speaks of a 3D FFT with a temporal cutoff.
  `GAR_AXES` offers "chw" (code), "hw" (per channel), "fhw" (over time, the paper's wording).
- LMI mixes unit-variance noise into the sigma-parameterised latent `x0 + sigma eps` as the code does
  (so the injected region has a smaller amplitude than its surroundings); `inject_light_map` takes
  the noise as an argument, so a caller can scale it by sigma to inject at the latent's own level
  (`pipeline.lmi_noise_scale` in `configs/lightctrl.py`).
- The official ideal filter tests `d^2 <= 2 d_s`; here `d^2 <= d_s^2`, the radius the Butterworth and
  Gaussian filters share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Axes of a `(B, F, h, w, C)` latent video that the GAR filter spans; of three, the first carries the
# d_s/d_t ratio (the "temporal" axis of the official filter, which there is the channel axis).
GAR_AXES = {"chw": (-1, -3, -2), "hw": (-3, -2), "fhw": (-4, -3, -2)}
FILTERS = ("butterworth", "gaussian", "ideal")


# ---------------------------------------------------------------------------------------------------
# Schedule and Euler-ancestral step (sigma parameterisation)
# ---------------------------------------------------------------------------------------------------


def scaled_linear_alpha_bars(
  num_train_steps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012
) -> np.ndarray:
  """`abar_n` for SD-1.5's "scaled_linear" betas `linspace(sqrt(b0), sqrt(b1), N)^2`, shape `(N,)`,
  float32 numpy (a constant also under `jax.jit`, where schedules are built)."""
  betas = np.linspace(beta_start**0.5, beta_end**0.5, num_train_steps, dtype=np.float64) ** 2
  return np.cumprod(1.0 - betas).astype(np.float32)


def linear_alpha_bars(
  num_train_steps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012
) -> np.ndarray:
  """`abar_n` for "linear" betas `linspace(b0, b1, N)` (AnimateDiff's inference configs, and the
  video scheduler of LightCtrl's `relight.py`), shape `(N,)`, float32 numpy."""
  betas = np.linspace(beta_start, beta_end, num_train_steps, dtype=np.float64)
  return np.cumprod(1.0 - betas).astype(np.float32)


BETA_SCHEDULES = {"scaled_linear": scaled_linear_alpha_bars, "linear": linear_alpha_bars}


class EulerSchedule(NamedTuple):
  """The steps that run: network times `timesteps (K,)` and `sigmas (K + 1,)` ending at 0."""

  timesteps: jax.Array
  sigmas: jax.Array


def euler_schedule(alpha_bars: np.ndarray, steps: int, strength: float = 1.0) -> EulerSchedule:
  """diffusers' Euler-ancestral "linspace" grid over `round(steps / strength)` inference steps, of
  which the last `round(n * strength)` run (diffusers' `get_timesteps`), as LightCtrl sets it up."""
  if not 0 < strength <= 1:
    raise ValueError(f"strength must be in (0, 1], got {strength}")
  total = int(round(steps / strength))
  train = np.asarray(alpha_bars, np.float64)
  times = np.linspace(0, len(train) - 1, total)[::-1]
  all_sigmas = np.sqrt((1 - train) / train)
  sigmas = np.interp(times, np.arange(len(train)), all_sigmas)
  start = total - min(int(total * strength), total)
  return EulerSchedule(
    timesteps=jnp.asarray(times[start:], jnp.float32),
    sigmas=jnp.asarray(np.append(sigmas[start:], 0.0), jnp.float32),
  )


def network_input(z: jax.Array, sigma: jax.Array) -> jax.Array:
  """`z / sqrt(sigma^2 + 1)`: the VP sample the eps-network was trained on (`scale_model_input`)."""
  return z * jax.lax.rsqrt(jnp.square(sigma) + 1.0)


def euler_ancestral_step(
  z: jax.Array, x0: jax.Array, sigma: jax.Array, sigma_next: jax.Array, noise: jax.Array
) -> jax.Array:
  """One Euler-ancestral step from `sigma` to `sigma_next` towards `x0` (predicted or replaced)."""
  sigma_up = jnp.sqrt(jnp.square(sigma_next) * (jnp.square(sigma) - jnp.square(sigma_next)))
  sigma_up = sigma_up / sigma
  sigma_down = jnp.sqrt(jnp.maximum(jnp.square(sigma_next) - jnp.square(sigma_up), 0.0))
  derivative = (z - x0) / sigma
  return z + derivative * (sigma_down - sigma) + sigma_up * noise


def noise_to(x0: jax.Array, sigma: jax.Array, noise: jax.Array) -> jax.Array:
  """The scheduler's `add_noise`: `x0 + sigma eps`."""
  return x0 + sigma * noise


def guided(eps_fn: Callable, scale: float) -> Callable:
  """Classifier-free guidance: `eps_u + s (eps_c - eps_u)` from `eps_fn(x, t, conditional: bool)`."""

  def eps(x, t):
    uncond, cond = eps_fn(x, t, False), eps_fn(x, t, True)
    return uncond + scale * (cond - uncond)

  return eps


# ---------------------------------------------------------------------------------------------------
# Light Map Injection
# ---------------------------------------------------------------------------------------------------


def lmi_masks(centres: jax.Array, size: int, sigma: float, threshold: float = 0.2) -> jax.Array:
  """Binary masks `(..., size, size)` where a Gaussian of `sigma` around `centres (..., 2)` exceeds
  `threshold` (centres in latent pixels, `(x, y)`)."""
  yy, xx = jnp.mgrid[:size, :size]
  d2 = jnp.square(xx - centres[..., 0, None, None]) + jnp.square(yy - centres[..., 1, None, None])
  return (jnp.exp(-d2 / (2 * sigma**2)) > threshold).astype(jnp.float32)


def inject_light_map(
  z: jax.Array, masks: jax.Array, noise: jax.Array, omega: float = 0.8
) -> jax.Array:
  """`M (omega eps + (1 - omega) z) + (1 - M) z` for latents `(..., h, w, C)` and masks `(..., h, w)`."""
  m = masks[..., None]
  return m * (omega * noise + (1.0 - omega) * z) + (1.0 - m) * z


# ---------------------------------------------------------------------------------------------------
# Progressive fusion
# ---------------------------------------------------------------------------------------------------


def fusion_weights(num_steps: int) -> jax.Array:
  """`lambda_i = 1 - i / (N - 1)`, `i = 0..N-1` (1 for a single step)."""
  return 1.0 - jnp.arange(num_steps, dtype=jnp.float32) / max(num_steps - 1, 1)


def fuse(consistent: jax.Array, relit: jax.Array, lam: jax.Array) -> jax.Array:
  """Light-A-Video's progressive light fusion `(1 - lambda) I + lambda I'`."""
  return (1.0 - lam) * consistent + lam * relit


# ---------------------------------------------------------------------------------------------------
# Frequency filters and Geometry-Aware Relighting
# ---------------------------------------------------------------------------------------------------


def filter_distance(sizes: tuple[int, ...], d_s, d_t) -> jax.Array:
  """`d^2` of the official filters on a centred (fftshifted) grid of `sizes` (2 or 3 axes): each axis
  `2i/n - 1`; with 3 axes the first, the official "temporal" one, is scaled by `d_s / d_t`."""
  coords = [jnp.arange(n, dtype=jnp.float32) * 2 / n - 1 for n in sizes]
  if len(sizes) == 3:
    ratio = jnp.where(d_t > 0, d_s / jnp.where(d_t > 0, d_t, 1.0), 0.0)
    coords[0] = ratio * coords[0]
  grids = jnp.meshgrid(*coords, indexing="ij")
  return sum(jnp.square(g) for g in grids)


def _cutoffs(d_s, d_t):
  d_s = jnp.asarray(d_s, jnp.float32)
  d_t = d_s if d_t is None else jnp.asarray(d_t, jnp.float32)
  return d_s, d_t, jnp.where(d_s > 0, d_s, 1.0)


def _zero_if_closed(mask: jax.Array, d_s, d_t) -> jax.Array:
  return jnp.where((d_s > 0) & (d_t > 0), mask, 0.0)


def butterworth_low_pass(sizes, d_s, d_t=None, order: int = 4) -> jax.Array:
  """`1 / (1 + (d^2 / d_s^2)^n)`: 1 at the centre, -> 0 far from it; zeros when a cutoff is 0."""
  d_s, d_t, safe = _cutoffs(d_s, d_t)
  d2 = filter_distance(sizes, d_s, d_t)
  return _zero_if_closed(1.0 / (1.0 + (d2 / jnp.square(safe)) ** order), d_s, d_t)


def gaussian_low_pass(sizes, d_s, d_t=None) -> jax.Array:
  """`exp(-d^2 / (2 d_s^2))`; zeros when a cutoff is 0."""
  d_s, d_t, safe = _cutoffs(d_s, d_t)
  mask = jnp.exp(-filter_distance(sizes, d_s, d_t) / (2 * jnp.square(safe)))
  return _zero_if_closed(mask, d_s, d_t)


def ideal_low_pass(sizes, d_s, d_t=None) -> jax.Array:
  """`[d^2 <= d_s^2]`; zeros when a cutoff is 0."""
  d_s, d_t, _ = _cutoffs(d_s, d_t)
  mask = (filter_distance(sizes, d_s, d_t) <= jnp.square(d_s)).astype(jnp.float32)
  return _zero_if_closed(mask, d_s, d_t)


def low_pass(kind: str, sizes, d_s, order: int = 4) -> jax.Array:
  """One of `FILTERS` on a grid of `sizes` with equal spatial and "temporal" cutoffs `d_s`."""
  if kind == "butterworth":
    return butterworth_low_pass(sizes, d_s, order=order)
  if kind == "gaussian":
    return gaussian_low_pass(sizes, d_s)
  if kind == "ideal":
    return ideal_low_pass(sizes, d_s)
  raise ValueError(f"filter must be one of {FILTERS}, got {kind!r}")


def filter_axes(axes: str, ndim: int) -> tuple[int, ...]:
  """The (non-negative) array axes that `GAR_AXES[axes]` names, in the filter's order."""
  if axes not in GAR_AXES:
    raise ValueError(f"axes must be one of {tuple(GAR_AXES)}, got {axes!r}")
  return tuple(a % ndim for a in GAR_AXES[axes])


def frequency_mix(z_low: jax.Array, z_high: jax.Array, mask: jax.Array, axes: tuple[int, ...]):
  """`IFFT(FFT(z_low) H + FFT(z_high) (1 - H)).real` over `axes`, `H` centred (fftshifted) and shaped
  to broadcast against the shifted spectrum; `z_low` and `z_high` share their shape."""
  spectrum = lambda z: jnp.fft.fftshift(jnp.fft.fftn(z, axes=axes), axes=axes)
  mixed = spectrum(z_low) * mask + spectrum(z_high) * (1.0 - mask)
  return jnp.fft.ifftn(jnp.fft.ifftshift(mixed, axes=axes), axes=axes).real.astype(z_high.dtype)


def filter_for(z: jax.Array, axes: str, cutoff, kind: str = "butterworth", order: int = 4):
  """The low-pass filter over `axes` of `z`, laid out to broadcast against `z`."""
  picked = filter_axes(axes, z.ndim)
  mask = low_pass(kind, tuple(z.shape[a] for a in picked), cutoff, order)
  mask = jnp.transpose(mask, np.argsort(picked))
  return mask.reshape([z.shape[a] if a in picked else 1 for a in range(z.ndim)])


def geometry_aware_latent(
  z_normal: jax.Array,
  z_rgb: jax.Array,
  cutoff,
  axes: str = "chw",
  kind: str = "butterworth",
  order: int = 4,
) -> jax.Array:
  """GAR: low frequencies from the normal-map latent, high ones from the RGB latent, cutoff lambda."""
  picked = filter_axes(axes, z_rgb.ndim)
  mask = filter_for(z_rgb, axes, cutoff, kind, order)
  return frequency_mix(z_normal, z_rgb, mask, picked)


# ---------------------------------------------------------------------------------------------------
# The per-frame relighter sampler and the LightCtrl loop
# ---------------------------------------------------------------------------------------------------


class RelighterFns(NamedTuple):
  """What the per-frame relighter needs. Arrays are `(N, h, w, C)` latents of single frames.

  eps: `(z_in, t (N,), condition, prompt (N,), conditional: bool) -> eps`; `condition` is the
    concatenated latent (and, for the fbc variant, the light-map latent).
  """

  eps: Callable
  guidance: float
  schedule: EulerSchedule


def relight_frames(fns: RelighterFns, init: jax.Array, condition, prompt, rng) -> jax.Array:
  """IC-Light img2img: `init` (the light-map latent) noised to the first sigma, then Euler-ancestral
  with classifier-free guidance on the prompt, the condition fed to both branches. Returns latents."""
  schedule = fns.schedule
  eps_fn = guided(lambda x, t, c: fns.eps(x, t, condition, prompt, c), fns.guidance)
  keys = jax.random.split(rng, schedule.timesteps.shape[0] + 1)
  z = noise_to(init, schedule.sigmas[0], jax.random.normal(keys[0], init.shape))

  def step(z, inputs):
    t, sigma, sigma_next, key = inputs
    eps = eps_fn(network_input(z, sigma), jnp.full(z.shape[:1], t))
    x0 = z - sigma * eps
    return euler_ancestral_step(z, x0, sigma, sigma_next, jax.random.normal(key, z.shape)), None

  z, _ = jax.lax.scan(
    step, z, (schedule.timesteps, schedule.sigmas[:-1], schedule.sigmas[1:], keys[1:])
  )
  return z


class PipelineFns(NamedTuple):
  """The networks of the LightCtrl loop for videos `(B, F, H, W, 3)` / latents `(B, F, h, w, C)`.

  encode / decode: pixels <-> latents; video_eps: `(z_in, t (B,)) -> eps` with guidance applied;
  relight: `(pixels I, lam, rng) -> relit pixels I'` (GAR and the per-frame relighter inside).
  """

  encode: Callable
  decode: Callable
  video_eps: Callable
  relight: Callable


def lightctrl_sample(
  fns: PipelineFns,
  schedule: EulerSchedule,
  z_init: jax.Array,
  source: jax.Array,
  rng: jax.Array,
  fuse_above: float = 0.15,
  detail: bool = True,
) -> jax.Array:
  """The denoising loop of Sec. 3.3 from `z_init` (the noised, light-injected source latent).

  At step i with `lambda_i > fuse_above`: `x0 = z - sigma eps`, `I = D(x0)`, at i = 0 the detail
  residual `source - I`, then `I += lambda_i residual`, `I' = relight(I)`, `z_bar = E(fuse(I, I'))` and
  the Euler-ancestral step towards `z_bar`; otherwise the ordinary step. Returns the final latents.
  `fuse_above >= 1` never fuses: plain SDEdit with the video prior.
  """
  lambdas = fusion_weights(schedule.timesteps.shape[0])
  keys = jax.random.split(rng, schedule.timesteps.shape[0])

  def fused(x0, residual, i, lam, key):
    consistent = fns.decode(x0)
    if detail:
      residual = jnp.where(i == 0, source - consistent, residual)
      consistent = consistent + lam * residual
    relit = fns.relight(consistent, lam, key)
    return fns.encode(fuse(consistent, relit, lam)), residual

  def step(carry, inputs):
    z, residual = carry
    i, t, sigma, sigma_next, lam, key = inputs
    eps = fns.video_eps(network_input(z, sigma), jnp.full(z.shape[:1], t))
    x0 = z - sigma * eps
    relight_key, noise_key = jax.random.split(key)
    x0, residual = jax.lax.cond(
      lam > fuse_above,
      lambda: fused(x0, residual, i, lam, relight_key),
      lambda: (x0, residual),
    )
    noise = jax.random.normal(noise_key, z.shape)
    return (euler_ancestral_step(z, x0, sigma, sigma_next, noise), residual), None

  steps = jnp.arange(schedule.timesteps.shape[0])
  inputs = (steps, schedule.timesteps, schedule.sigmas[:-1], schedule.sigmas[1:], lambdas, keys)
  (z, _), _ = jax.lax.scan(step, (z_init, jnp.zeros_like(source)), inputs)
  return z
