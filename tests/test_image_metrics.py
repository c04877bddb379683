"""PSNR and SSIM (dm-pix underneath) agree with the definitions the studies were measured with."""

import chex
import jax
import numpy as np
import pytest
from scipy.ndimage import correlate1d

from core import image_metrics


def _gaussian(window, sigma):
  g = np.exp(-0.5 * ((np.arange(window) - (window - 1) / 2) / sigma) ** 2)
  return g / g.sum()


def _ssim_reference(x, r, data_range, window=7, sigma=1.5):
  """SSIM of Wang et al. 2004 with a Gaussian window and 'valid' filtering, in float64 numpy:
  per example, the mean over frames, channels and positions."""
  g = _gaussian(window, sigma)
  crop = (window - 1) // 2

  def blur(a):
    a = correlate1d(correlate1d(a, g, axis=-3, mode="constant"), g, axis=-2, mode="constant")
    return a[..., crop : a.shape[-3] - crop, crop : a.shape[-2] - crop, :]

  x, r = np.asarray(x, np.float64), np.asarray(r, np.float64)
  mu_x, mu_r = blur(x), blur(r)
  var_x, var_r, cov = blur(x * x) - mu_x**2, blur(r * r) - mu_r**2, blur(x * r) - mu_x * mu_r
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  index = ((2 * mu_x * mu_r + c1) * (2 * cov + c2)) / (
    (mu_x**2 + mu_r**2 + c1) * (var_x + var_r + c2)
  )
  return index.reshape(len(x), -1).mean(-1)


@pytest.mark.parametrize("shape", [(3, 16, 16, 1), (2, 4, 13, 17, 3)])
def test_ssim_and_psnr_match_the_definitions(shape):
  x = jax.random.uniform(jax.random.key(0), shape, minval=-1.0, maxval=1.0)
  r = x + 0.2 * jax.random.normal(jax.random.key(1), shape)
  ssim = image_metrics.ssim(x, r, data_range=2.0)
  chex.assert_shape(ssim, (shape[0],))
  np.testing.assert_allclose(ssim, _ssim_reference(x, r, 2.0), rtol=1e-4, atol=1e-5)
  mse = np.mean((np.asarray(x, np.float64) - np.asarray(r)) ** 2, axis=tuple(range(1, len(shape))))
  np.testing.assert_allclose(image_metrics.psnr(x, r, 2.0), 10 * np.log10(4.0 / mse), rtol=1e-5)


def test_identical_outputs_have_a_finite_psnr_and_unit_ssim():
  x = jax.random.normal(jax.random.key(2), (2, 8, 8, 3))
  assert np.all(np.isfinite(image_metrics.psnr(x, x, 2.0)))
  np.testing.assert_allclose(image_metrics.ssim(x, x, 2.0), 1.0, atol=1e-5)
  assert image_metrics.fidelity(x, x, 2.0)["mse"] == 0.0


def test_frames_smaller_than_the_window_are_refused():
  x = np.zeros((1, 5, 5, 1), np.float32)
  with pytest.raises(ValueError, match="smaller than the SSIM window 7"):
    image_metrics.ssim(x, x, 1.0)
