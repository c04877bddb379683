"""Metrics of relit videos against ground-truth renders (LightCtrl, ICLR 2026, at small scale).

The paper measures aesthetic quality, FVD, luminance PSNR, PSNR inside the light mask and a user study
(light controllability, light-text alignment, smoothness). With rendered scenes the ground truth
exists, so each becomes a measurement against it. Videos are `(B, F, H, W, 3)` in [0, 1]; every
function returns one value per clip `(B,)`.

- `psnr`, `ssim`: dm-pix's, via `core.image_metrics`, against the target render.
- `light_following`: correlation between the path of the luminance centroid of the light the output
  adds (`lum(out) - ambient lum(albedo)`, clipped at 0) and the light path: the Pearson correlation of
  the two centred `(F, 2)` trajectories taken as one vector (so a path constant along one axis still
  counts its other axis).
- `psnr_light`: PSNR against the target render over the pixels where the light map exceeds 0.2 (the
  PSNR_light of the paper compares the lit region with the light map; the render is the better
  reference here).
- `source_leakage`: Pearson correlation, over pixels and frames, between what the output has beyond
  the target (`lum(out) - lum(target)`) and the source light's shading `lum(albedo) s_src`; 0 when the
  output has no residual.
- `flicker`: mean `|Delta_t out - Delta_t target|` over consecutive frames (temporal change the
  target does not have).
- `prompt_error`: the chromaticity (colour / sum) of the light the output adds inside the light mask
  against the requested light colour's, L1 distance / 2 (in [0, 1]); the light-text alignment analogue.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core import image_metrics

LUMA = jnp.array([0.299, 0.587, 0.114])
EPS = 1e-8


def luminance(video: jax.Array) -> jax.Array:
  return video @ LUMA


def psnr(out, target) -> jax.Array:
  return image_metrics.psnr(out, target, 1.0)


def ssim(out, target) -> jax.Array:
  return image_metrics.ssim(out, target, 1.0)


def added_light(out, albedo, ambient: float) -> jax.Array:
  """`max(lum(out) - ambient lum(albedo), 0)` `(B, F, H, W)`: the light beyond the ambient term."""
  return jnp.maximum(luminance(out) - ambient * luminance(albedo), 0.0)


def light_centroids(out, albedo, ambient: float) -> jax.Array:
  """`(B, F, 2)` luminance-weighted centroids `(x, y)` of `added_light`."""
  weight = added_light(out, albedo, ambient)
  h, w = weight.shape[-2:]
  yy, xx = jnp.mgrid[:h, :w]
  total = jnp.sum(weight, axis=(-2, -1)) + EPS
  cx = jnp.sum(weight * xx, axis=(-2, -1)) / total
  cy = jnp.sum(weight * yy, axis=(-2, -1)) / total
  return jnp.stack([cx, cy], axis=-1)


def _correlation(a: jax.Array, b: jax.Array) -> jax.Array:
  """Pearson correlation over all but the leading axis; 0 where either side is constant."""
  a = a.reshape(a.shape[0], -1)
  b = b.reshape(b.shape[0], -1)
  a = a - a.mean(axis=-1, keepdims=True)
  b = b - b.mean(axis=-1, keepdims=True)
  denominator = jnp.sqrt(jnp.sum(a * a, axis=-1) * jnp.sum(b * b, axis=-1))
  return jnp.where(denominator > EPS, jnp.sum(a * b, axis=-1) / (denominator + EPS), 0.0)


def light_following(out, albedo, light_path, ambient: float) -> jax.Array:
  centroids = light_centroids(out, albedo, ambient)
  centred = lambda p: p - p.mean(axis=1, keepdims=True)
  return _correlation(centred(centroids), centred(light_path))


def psnr_light(out, target, light_map, threshold: float = 0.2) -> jax.Array:
  mask = (light_map > threshold).astype(out.dtype)[..., None]
  squared = jnp.sum(jnp.square(out - target) * mask, axis=(1, 2, 3, 4))
  count = jnp.sum(mask, axis=(1, 2, 3, 4)) * out.shape[-1]
  return 10.0 * jnp.log10(1.0 / jnp.maximum(squared / jnp.maximum(count, 1.0), 1e-10))


def source_leakage(out, target, albedo, source_shading) -> jax.Array:
  residual = luminance(out) - luminance(target)
  return _correlation(residual, luminance(albedo) * source_shading)


def flicker(out, target) -> jax.Array:
  change = lambda v: v[:, 1:] - v[:, :-1]
  return jnp.mean(jnp.abs(change(out) - change(target)), axis=(1, 2, 3, 4))


def prompt_error(out, albedo, light_map, colours, ambient: float, threshold: float = 0.2):
  """`colours (B, 3)`: the requested light colour per clip."""
  mask = (light_map > threshold).astype(out.dtype)[..., None]
  added = jnp.maximum(out - ambient * albedo, 0.0)
  light = jnp.sum(added * mask, axis=(1, 2, 3)) / (jnp.sum(albedo * mask, axis=(1, 2, 3)) + EPS)
  chroma = lambda c: c / (jnp.sum(c, axis=-1, keepdims=True) + EPS)
  return 0.5 * jnp.sum(jnp.abs(chroma(light) - chroma(colours)), axis=-1)


def all_metrics(out, clips, colours, ambient: float) -> dict[str, jax.Array]:
  """Every metric above per clip; `clips` holds `target`, `albedo`, `light_map`, `light_path`,
  `source_shading` as rendered by `core.data.lambertian`."""
  return {
    "psnr": psnr(out, clips["target"]),
    "ssim": ssim(out, clips["target"]),
    "light_following": light_following(out, clips["albedo"], clips["light_path"], ambient),
    "psnr_light": psnr_light(out, clips["target"], clips["light_map"]),
    "source_leakage": source_leakage(
      out, clips["target"], clips["albedo"], clips["source_shading"]
    ),
    "flicker": flicker(out, clips["target"]),
    "prompt_error": prompt_error(out, clips["albedo"], clips["light_map"], colours, ambient),
  }
