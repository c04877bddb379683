"""Two-modality classification data for "Supporting Multimodal Intermediate Fusion with Informatic
Constraint and Distribution Coherence" (ICLR 2026).

Synthetic (the paper's "fine-grained dimensional" view, Sec. 3.2: every latent dimension is either
task-relevant semantic or task-irrelevant noise). C classes with means u_c ~ class_scale N(0, I_S); a
sample's semantic vector is s = u_y + 0.8 eps. Modality 1 sees s[0 : v], modality 2 sees s[S - v : S]
(with S = 8, v = 5 they share dims 3-4: complementary and redundant information, so fusion beats either
modality). Each modality mixes its semantic part with nuisance noise through a random orthogonal matrix:
  x1 = A1 [s[0:v]; nu1],   x2 = (1 + delta) A2 [s[S-v:S]; nu2] + delta b,   ||b|| = 3,
nu ~ N(0, I). The incoherence knob delta acts on modality 2 only: a scale, a mean shift, and
heavy-tailed nuisance (each coordinate of nu2 is a Student-t(3) draw with probability
min(tail_rate delta, 1); tail_rate = 0 leaves an affine incoherence that loses no information).
All draws depend on the seed only, so every delta of a seed sees the same samples (common random
numbers), and the design (u, A, b) is shared by the splits of a seed.

`synthetic_replicates` stacks (delta, seed) replicates on axis 1: arrays (num, P, D) with
P = len(deltas) * len(seeds), delta-major, ready for a vmapped training step.

Real data: `tfds_two_modality_source` reads a prepared tfds dataset with two modality fields and a label
(So2Sat LCZ42 `so2sat/all`: Sentinel-1 SAR (32, 32, 8) and Sentinel-2 multispectral (32, 32, 10) patches
of 17 local-climate-zone classes) through `tfds.data_source`, never downloading.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SPLIT_IDS = {"train": 0, "val": 1, "test": 2}


class SyntheticDesign(NamedTuple):
  """The parameters of one seed's data-generating process."""

  class_means: np.ndarray  # (C, S)
  mixing: np.ndarray  # (2, D, D) orthogonal
  shift: np.ndarray  # (D,) the direction b of modality 2's mean shift, norm shift_norm


def _orthogonal(rng: np.random.Generator, dim: int) -> np.ndarray:
  q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
  return q * np.sign(np.diag(r))


def synthetic_design(
  seed: int,
  num_classes: int = 4,
  semantic_dim: int = 8,
  input_dim: int = 16,
  class_scale: float = 1.5,
  shift_norm: float = 3.0,
) -> SyntheticDesign:
  rng = np.random.default_rng([seed, 99])
  means = class_scale * rng.standard_normal((num_classes, semantic_dim))
  mixing = np.stack([_orthogonal(rng, input_dim) for _ in range(2)])
  direction = rng.standard_normal(input_dim)
  return SyntheticDesign(means, mixing, shift_norm * direction / np.linalg.norm(direction))


def synthetic_split(
  design: SyntheticDesign,
  seed: int,
  split: str,
  num: int,
  delta: float,
  view_dim: int = 5,
  noise_scale: float = 0.8,
  tail_df: float = 3.0,
  tail_rate: float = 0.25,
) -> dict[str, np.ndarray]:
  """{"x1", "x2": (num, D) float32, "y": (num,) int32} of one seed, split and incoherence delta."""
  num_classes, semantic_dim = design.class_means.shape
  input_dim = design.mixing.shape[-1]
  if not 0 < view_dim <= semantic_dim or view_dim > input_dim:
    raise ValueError(
      f"view_dim must be in 1..min(semantic_dim, input_dim) = {min(semantic_dim, input_dim)}, "
      f"got {view_dim}"
    )
  if delta < 0:
    raise ValueError(f"delta must be >= 0, got {delta}")
  rng = np.random.default_rng([seed, SPLIT_IDS[split]])
  y = rng.integers(num_classes, size=num)
  s = design.class_means[y] + noise_scale * rng.standard_normal((num, semantic_dim))
  nuisance = rng.standard_normal((2, num, input_dim - view_dim))
  heavy = rng.standard_t(tail_df, size=(num, input_dim - view_dim))
  swap = rng.random((num, input_dim - view_dim)) < min(tail_rate * delta, 1.0)
  nu2 = np.where(swap, heavy, nuisance[1])
  x1 = np.concatenate([s[:, :view_dim], nuisance[0]], axis=1) @ design.mixing[0].T
  x2 = np.concatenate([s[:, semantic_dim - view_dim :], nu2], axis=1) @ design.mixing[1].T
  x2 = (1.0 + delta) * x2 + delta * design.shift
  return {"x1": x1.astype(np.float32), "x2": x2.astype(np.float32), "y": y.astype(np.int32)}


def synthetic_replicates(
  seeds: Sequence[int],
  deltas: Sequence[float],
  split: str,
  num: int,
  num_classes: int = 4,
  semantic_dim: int = 8,
  input_dim: int = 16,
  view_dim: int = 5,
  class_scale: float = 1.5,
  tail_rate: float = 0.25,
) -> dict[str, np.ndarray]:
  """One split for every (delta, seed): {"x1", "x2": (num, P, D), "y": (num, P)}, P = deltas x seeds
  delta-major (replicate p has delta deltas[p // len(seeds)] and seed seeds[p % len(seeds)])."""
  designs = {
    seed: synthetic_design(seed, num_classes, semantic_dim, input_dim, class_scale)
    for seed in seeds
  }
  parts = [
    synthetic_split(designs[seed], seed, split, num, delta, view_dim, tail_rate=tail_rate)
    for delta in deltas
    for seed in seeds
  ]
  return {name: np.stack([p[name] for p in parts], axis=1) for name in parts[0]}


# ---------------------------------------------------------------------------------------------------
# Real two-modality data through tfds
# ---------------------------------------------------------------------------------------------------


class TwoModalityFields(NamedTuple):
  """Which record fields are the two modalities and the label."""

  modality_1: str
  modality_2: str
  label: str


SO2SAT = TwoModalityFields("sentinel1", "sentinel2", "label")


def tfds_two_modality_source(name: str, split: str, data_dir: str | None = None):
  """A random-access tfds source (prepared as array_record; never downloaded)."""
  import tensorflow_datasets as tfds

  return tfds.data_source(name, split=split, data_dir=data_dir, download=False)


def two_modality_record(record: dict, fields: TwoModalityFields) -> dict[str, np.ndarray]:
  """A record as {"x1", "x2": float32, "y": int32}."""
  for field in fields:
    if field not in record:
      raise KeyError(f"record has no field {field!r} (fields: {sorted(record)})")
  return {
    "x1": np.asarray(record[fields.modality_1], np.float32),
    "x2": np.asarray(record[fields.modality_2], np.float32),
    "y": np.asarray(record[fields.label], np.int32),
  }


def load_records(source, fields: TwoModalityFields, count: int) -> dict[str, np.ndarray]:
  """The first `count` records of a source as stacked arrays."""
  records = [two_modality_record(source[i], fields) for i in range(min(count, len(source)))]
  return {name: np.stack([r[name] for r in records]) for name in ("x1", "x2", "y")}
