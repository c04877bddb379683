"""Image and video fidelity against a reference: MSE, PSNR and SSIM (Wang et al. 2004).

PSNR and SSIM are dm-pix's (`dm_pix.psnr`, `dm_pix.ssim`), applied per example: PSNR over all of an
example's values (one mean squared error per video, not a mean of per-frame PSNRs), SSIM as the mean
over frames of dm-pix's per-image SSIM (Gaussian window, 'valid' filtering, averaged over positions and
channels). Arrays are `(B, ..., H, W, C)`: images `(B, H, W, C)` or videos `(B, F, H, W, C)`.
"""

from __future__ import annotations

import dm_pix
import jax
import jax.numpy as jnp


def mse(x: jax.Array, reference: jax.Array) -> jax.Array:
  """Mean squared error per example (leading axis)."""
  return jnp.mean(jnp.square(x - reference).reshape(x.shape[0], -1), axis=-1)


MIN_MSE = (
  1e-20  # caps PSNR for identical outputs (e.g. a cache that never reuses) at a finite value
)


def psnr(x: jax.Array, reference: jax.Array, data_range: float) -> jax.Array:
  """Peak signal-to-noise ratio in dB per example; `data_range` = max - min of the signal."""
  as_columns = lambda a: (a / data_range).reshape(a.shape[0], -1, 1, 1)
  cap = 10.0 * jnp.log10(data_range**2 / MIN_MSE)
  return jnp.minimum(dm_pix.psnr(as_columns(x), as_columns(reference)), cap)


def ssim(
  x: jax.Array, reference: jax.Array, data_range: float, window: int = 7, sigma: float = 1.5
) -> jax.Array:
  """Mean SSIM per example over frames and channels of `(B, ..., H, W, C)` arrays."""
  b, h, w = x.shape[0], x.shape[-3], x.shape[-2]
  if min(h, w) < window:
    raise ValueError(f"frames of {h}x{w} are smaller than the SSIM window {window}")
  as_images = lambda a: a.astype(jnp.float32).reshape(-1, *a.shape[-3:])
  per_image = dm_pix.ssim(
    as_images(x), as_images(reference), max_val=data_range, filter_size=window, filter_sigma=sigma
  )
  return per_image.reshape(b, -1).mean(axis=-1)


def fidelity(x: jax.Array, reference: jax.Array, data_range: float) -> dict[str, float]:
  """Mean PSNR (dB), SSIM and MSE of `x` against `reference` over the examples."""
  return {
    "psnr": float(jnp.mean(psnr(x, reference, data_range))),
    "ssim": float(jnp.mean(ssim(x, reference, data_range))),
    "mse": float(jnp.mean(mse(x, reference))),
  }
