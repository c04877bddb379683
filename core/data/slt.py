"""Data of the SGD-as-porous-diffusion experiments ("Almost Bayesian: Dynamics of SGD Through Singular
Learning Theory", ICLR 2026): generated regression toys, scikit-learn's digits and two moons, and a
prepared tfds image set (MNIST) for the paper-scale fully connected nets.

* `toy_regression`: `y = x c + eps`, `x ~ N(0, I_k)`, `eps ~ N(0, 1)` (the paper's singular toys are
  models of this data). With `orthogonal_noise` the noise is projected off the columns of `x`, so
  `x^T eps = 0` and the empirical minimum set of every toy equals its population minimum set (without
  it the O(n^-1/2) shift of `c_hat` regularises the singularities of the `c = 0` toys at scales below
  n^-1/4, and their learning coefficients are not the textbook ones at finite n).
* `digits`: the 1797 8x8 digits scaled to [0, 1], flattened, all used for training.
* `moons` and `moons_grid`: scikit-learn's `make_moons` and the grid of points whose predictions
  are a net's function signature.
* `tfds_classification`: every record of a prepared tfds image set, flattened to [0, 1]; never
  downloads.

Pure functions of their arguments and seeds.
"""

from __future__ import annotations

import numpy as np


def toy_regression(
  coefficients, n: int, seed: int, orthogonal_noise: bool = True, noise_std: float = 1.0
) -> dict[str, np.ndarray]:
  """`{"x": (n, k) float32, "y": (n,) float32}` with `y = x c + noise_std eps`, `eps ~ N(0, 1)`, for
  `c = coefficients` (length k)."""
  c = np.asarray(coefficients, np.float64)
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, c.size))
  eps = noise_std * rng.standard_normal(n)
  if orthogonal_noise:
    eps -= x @ np.linalg.lstsq(x, eps, rcond=None)[0]
  return {"x": x.astype(np.float32), "y": (x @ c + eps).astype(np.float32)}


def digits() -> dict[str, np.ndarray]:
  """`{"x": (1797, 64) float32 in [0, 1], "y": (1797,) int32}` from scikit-learn (shipped, offline)."""
  from sklearn.datasets import load_digits

  raw = load_digits()
  return {"x": (raw.data / 16.0).astype(np.float32), "y": raw.target.astype(np.int32)}


def moons(n: int, noise: float, seed: int) -> dict[str, np.ndarray]:
  """`{"x": (n, 2) float32, "y": (n,) int32}` from `sklearn.datasets.make_moons`."""
  from sklearn.datasets import make_moons

  x, y = make_moons(n_samples=n, noise=noise, random_state=seed)
  return {"x": x.astype(np.float32), "y": y.astype(np.int32)}


def moons_grid(x: np.ndarray, size: int, margin: float = 0.5) -> np.ndarray:
  """`(size * size, 2)` float32 points on a regular grid over the data's bounding box plus `margin`."""
  lo, hi = x.min(0) - margin, x.max(0) + margin
  axes = [np.linspace(lo[d], hi[d], size) for d in range(2)]
  return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2).astype(np.float32)


def tfds_classification(name: str, data_dir: str, split: str = "train") -> dict[str, np.ndarray]:
  """Every record of a prepared tfds image set: `x` (N, H*W*C) float32 in [0, 1], `y` (N,) int32."""
  from core.data import images

  source = images.tfds_image_source(name, split, data_dir or None)
  records = [source[i] for i in range(len(source))]
  x = np.stack([np.asarray(r["image"], np.float32).reshape(-1) / 255.0 for r in records])
  return {"x": x, "y": np.asarray([r["label"] for r in records], np.int32)}
