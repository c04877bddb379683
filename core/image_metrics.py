"""Image and video fidelity metrics against a reference: MSE, PSNR and SSIM (Wang et al. 2004)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mse(x: jax.Array, reference: jax.Array) -> jax.Array:
  """Mean squared error per example (leading axis)."""
  return jnp.mean(jnp.square(x - reference).reshape(x.shape[0], -1), axis=-1)


def psnr(x: jax.Array, reference: jax.Array, data_range: float) -> jax.Array:
  """Peak signal-to-noise ratio in dB per example; `data_range` = max - min of the signal."""
  return 10.0 * jnp.log10(data_range**2 / jnp.maximum(mse(x, reference), 1e-20))


def _gaussian_window(size: int, sigma: float) -> jax.Array:
  g = jnp.exp(-0.5 * ((jnp.arange(size) - (size - 1) / 2) / sigma) ** 2)
  return g / g.sum()


def _filter(images: jax.Array, window: jax.Array) -> jax.Array:
  """Separable 'valid' filtering of `(N, H, W)` images."""
  rows = jax.vmap(lambda im: jax.vmap(lambda r: jnp.convolve(r, window, mode="valid"))(im))(images)
  cols = jax.vmap(lambda im: jax.vmap(lambda r: jnp.convolve(r, window, mode="valid"))(im.T).T)(
    rows
  )
  return cols


def ssim(
  x: jax.Array, reference: jax.Array, data_range: float, window: int = 7, sigma: float = 1.5
) -> jax.Array:
  """Mean SSIM per example over frames and channels of `(B, ..., H, W, C)` arrays (Gaussian window)."""
  b, h, w = x.shape[0], x.shape[-3], x.shape[-2]
  if min(h, w) < window:
    raise ValueError(f"frames of {h}x{w} are smaller than the SSIM window {window}")
  to_planes = lambda a: jnp.moveaxis(a, -1, -3).reshape(-1, h, w)
  a, r = to_planes(x.astype(jnp.float32)), to_planes(reference.astype(jnp.float32))
  g = _gaussian_window(window, sigma)
  mu_a, mu_r = _filter(a, g), _filter(r, g)
  var_a = _filter(a * a, g) - mu_a**2
  var_r = _filter(r * r, g) - mu_r**2
  cov = _filter(a * r, g) - mu_a * mu_r
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  index = ((2 * mu_a * mu_r + c1) * (2 * cov + c2)) / (
    (mu_a**2 + mu_r**2 + c1) * (var_a + var_r + c2)
  )
  return index.reshape(b, -1).mean(axis=-1)


def fidelity(x: jax.Array, reference: jax.Array, data_range: float) -> dict[str, float]:
  """Mean PSNR (dB), SSIM and MSE of `x` against `reference` over the examples."""
  return {
    "psnr": float(jnp.mean(psnr(x, reference, data_range))),
    "ssim": float(jnp.mean(ssim(x, reference, data_range))),
    "mse": float(jnp.mean(mse(x, reference))),
  }
