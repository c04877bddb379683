"""Post-training data domains on scikit-learn digits: a small mixture search with a target domain.

The post-training (SFT) analogue of a data-mixture search ("Fast Data Mixture Optimization via
Gradient Descent", ICLR 2026, Sec. 4.2: SFT domains searched against a target benchmark). The 1797
digits are split once, by `seed`, into disjoint pools:

  clean      source-domain images, true labels                                     (600)
  noisy_40   source-domain images, 40% of the labels replaced by uniform draws     (300)
  noisy_80   the same at 80%                                                       (300)
  shifted    source-domain images moved by one pixel right and down (zero fill),
             intensities `0.6 x + 0.3`, true labels: a related but shifted domain   (300)
  target     target-domain images, true labels: the scarce in-domain data          (100)
and the target domain's held-out `validation` (100, the search's feedback) and `test` (97). The
target domain is "another scanner": each image blurred (the mean of the image and its 3x3 box
average), contrast reduced to `0.7 x + 0.15`, plus fixed Gaussian pixel noise (sd 0.05).

Images are float32 `[N, 8, 8]` in about [0, 1] (raw / 16), labels int32 `[N]`. A label draw of the
noisy pools may hit the true label, so the realised noise rate is `rate * 9 / 10`.

Choices (open in the paper, which searches real SFT sets): the pool sizes, the transforms, and
uniform label noise.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

SOURCE_NAMES = ("clean", "noisy_40", "noisy_80", "shifted", "target")
POOL_SIZES = {"clean": 600, "noisy_40": 300, "noisy_80": 300, "shifted": 300, "target": 100}
VALIDATION_SIZE = 100  # target-domain examples the search sees; the remaining 97 are the test set
NOISE_RATES = {"noisy_40": 0.4, "noisy_80": 0.8}


@dataclasses.dataclass(frozen=True)
class Pool:
  images: np.ndarray  # float32 [N, 8, 8]
  labels: np.ndarray  # int32 [N]

  def __len__(self) -> int:
    return len(self.labels)

  def take(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": self.images[indices], "y": self.labels[indices]}


@dataclasses.dataclass(frozen=True)
class DigitDomains:
  sources: tuple[Pool, ...]  # in the order of SOURCE_NAMES
  validation: Pool  # target domain, the search's feedback
  test: Pool  # target domain, held out

  @property
  def names(self) -> tuple[str, ...]:
    return SOURCE_NAMES

  @property
  def sizes(self) -> tuple[int, ...]:
    return tuple(len(pool) for pool in self.sources)

  @functools.cached_property
  def _stacked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.cumsum((0,) + self.sizes[:-1])
    images = np.concatenate([pool.images for pool in self.sources])
    labels = np.concatenate([pool.labels for pool in self.sources])
    return offsets, images, labels

  def gather(self, source: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
    """`{"x": [N, 8, 8], "y": [N], "source": [N]}`: pool `source[i]`'s example `index[i]`."""
    offsets, images, labels = self._stacked
    rows = offsets[source] + index
    return {"x": images[rows], "y": labels[rows], "source": np.asarray(source, np.int32)}


def shift_domain(images: np.ndarray) -> np.ndarray:
  """One pixel right and down (zero fill), intensities `0.6 x + 0.3`."""
  moved = np.zeros_like(images)
  moved[:, 1:, 1:] = images[:, :-1, :-1]
  return 0.6 * moved + 0.3


def target_domain(images: np.ndarray, seed: int) -> np.ndarray:
  """Half blurred (3x3 box), contrast `0.7 x + 0.15`, fixed Gaussian noise of sd 0.05."""
  padded = np.pad(images, ((0, 0), (1, 1), (1, 1)), mode="edge")
  box = sum(padded[:, i : i + 8, j : j + 8] for i in range(3) for j in range(3)) / 9.0
  noise = np.random.default_rng([seed, 4243]).normal(0.0, 0.05, images.shape)
  return (0.7 * (0.5 * images + 0.5 * box) + 0.15 + noise).astype(np.float32)


def noisy_labels(labels: np.ndarray, rate: float, seed: int, salt: int) -> np.ndarray:
  """Each label replaced, with probability `rate`, by a uniform draw over the 10 classes."""
  rng = np.random.default_rng([seed, salt])
  flip = rng.random(len(labels)) < rate
  return np.where(flip, rng.integers(0, 10, len(labels)), labels).astype(np.int32)


def digit_domains(seed: int = 0) -> DigitDomains:
  """The pools of the module docstring, split by `seed`."""
  from sklearn.datasets import load_digits  # the data ship inside scikit-learn

  raw = load_digits()
  images = (raw.images / 16.0).astype(np.float32)
  labels = raw.target.astype(np.int32)
  order = np.random.default_rng([seed, 1797]).permutation(len(labels))
  bounds = np.cumsum([0] + [POOL_SIZES[n] for n in SOURCE_NAMES] + [VALIDATION_SIZE])
  part = {
    name: order[bounds[i] : bounds[i + 1]] for i, name in enumerate(SOURCE_NAMES + ("validation",))
  }
  part["test"] = order[bounds[-1] :]
  pools = []
  for salt, name in enumerate(SOURCE_NAMES):
    x, y = images[part[name]], labels[part[name]]
    if name in NOISE_RATES:
      y = noisy_labels(y, NOISE_RATES[name], seed, salt)
    if name == "shifted":
      x = shift_domain(x)
    if name == "target":
      x = target_domain(x, seed + salt)
    pools.append(Pool(x.astype(np.float32), y))
  held_out = {
    name: Pool(target_domain(images[part[name]], seed + 10 + i), labels[part[name]])
    for i, name in enumerate(("validation", "test"))
  }
  return DigitDomains(tuple(pools), held_out["validation"], held_out["test"])


def stratified_indices(
  sizes: tuple[int, ...], rows_per_source: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
  """`(source [S * b], index [S * b])`: `b` uniform draws (with replacement) from every pool, the
  sources in order: uniform per-source sampling."""
  source = np.repeat(np.arange(len(sizes)), rows_per_source)
  index = np.concatenate([rng.integers(0, n, rows_per_source) for n in sizes])
  return source, index


def mixture_indices(
  sizes: tuple[int, ...], weights: np.ndarray, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
  """`(source [count], index [count])`: sources drawn from `weights`, then a uniform example."""
  source = rng.choice(len(sizes), size=count, p=np.asarray(weights) / np.sum(weights))
  index = np.floor(rng.random(count) * np.asarray(sizes)[source]).astype(np.int64)
  return source, index
