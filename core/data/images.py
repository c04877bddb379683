"""Quantized image datasets on their integer grid (levels 0..K-1, spacing 1).

* `digits`: scikit-learn's 8x8 digits (values 0..16, so K = 17), shipped with the package, split
  1500 train / 297 test by a fixed permutation. `requantize` maps them to any K in 2..17.
* tfds datasets (`cifar10`, `imagenet32`-style, any uint8 image set) through `tfds.data_source`, read
  from a prepared `data_dir`; nothing is downloaded (`download=False`). Tests run it under
  `tfds.testing.mock_data`.

This module only reads datasets; it writes nothing.
"""

from __future__ import annotations

import numpy as np

DIGITS_LEVELS = 17
DIGITS_TRAIN = 1500


def requantize(images: np.ndarray, from_levels: int, to_levels: int) -> np.ndarray:
  """Maps integer levels 0..from_levels-1 to the nearest of 0..to_levels-1 (both ends kept)."""
  if not 2 <= to_levels <= from_levels:
    raise ValueError(f"num_levels must be in [2, {from_levels}], got {to_levels}")
  scaled = images.astype(np.float64) * (to_levels - 1) / (from_levels - 1)
  return np.floor(scaled + 0.5).astype(np.int32)


def digits(
  num_levels: int = DIGITS_LEVELS, split_seed: int = 0
) -> dict[str, dict[str, np.ndarray]]:
  """scikit-learn digits as `{"train"|"test": {"image": (N, 8, 8) int32, "label": (N,) int32}}`."""
  from sklearn.datasets import load_digits  # the data file ships inside scikit-learn

  raw = load_digits()
  images = requantize(raw.images.astype(np.int32), DIGITS_LEVELS, num_levels)
  order = np.random.default_rng(split_seed).permutation(len(images))
  train, test = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
  labels = raw.target.astype(np.int32)
  return {
    "train": {"image": images[train], "label": labels[train]},
    "test": {"image": images[test], "label": labels[test]},
  }


def tfds_image_source(name: str, split: str, data_dir: str | None = None):
  """A random-access tfds source of `{"image": uint8 HxWxC, "label"}` records, never downloading."""
  import tensorflow_datasets as tfds

  return tfds.data_source(name, split=split, data_dir=data_dir, download=False)


def tfds_image_record(record: dict, num_levels: int = 256) -> dict[str, np.ndarray]:
  """One tfds record on the K-level integer grid (8-bit images requantized when K < 256)."""
  image = np.asarray(record["image"], dtype=np.int32)
  if num_levels != 256:
    image = requantize(image, 256, num_levels)
  return {"image": image, "label": np.asarray(record.get("label", 0), dtype=np.int32)}
