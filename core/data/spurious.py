"""Group-imbalanced data D(eta) for weak-to-strong training under spurious correlations.

Paper: "Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026,
arXiv 2509.24005). Group g = 1 is the minority, with fraction eta.

* Regression (the paper's theoretical setting; E1 of `configs/w2s.py`): core z ~ N(0, I_{d_z}),
  label y = z^T beta* + eps, group feature xi | g ~ N(g mu_xi, sigma_xi^2 I_p), z independent of xi
  (`regression_design`, `sample_regression`; JAX, jit- and vmap-able). g ~ Bernoulli(eta), the
  paper's D(eta).
* Binary classification with a spurious attribute (E2): y, a in {0, 1}; the majority has a = y, the
  minority a = 1 - y; x = [(2y-1) mu_c + N(0, I), (2a-1) mu_s + N(0, I), N(0, I)]
  (`classification_design`, `sample_classification`, `balanced_classification`; NumPy). The number
  of minority points is exactly round(eta * num), so eta is the realised fraction.
* Images with a spurious attribute: `inject_stripe` paints a bright row (top for a = 1, bottom for
  a = 0) into 8x8 digits; `tfds_group_pool` reads a tfds dataset with a label and a natural
  attribute (CelebA `attributes/Blond_Hair` vs `attributes/Male`, a Waterbirds-style builder's
  `label` vs `place`), never downloading; `group_split_indices` draws disjoint splits with a given
  minority fraction from such a pool.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# ---------------------------------------------------------------------------------------------------
# Regression model (the paper's theoretical setting)
# ---------------------------------------------------------------------------------------------------


class RegressionDesign(NamedTuple):
  """Fixed parameters of the regression model; a pytree, so designs stack and vmap.

  Attributes:
    beta: (d_z,) core coefficients beta*.
    mu: (p,) mean of xi in the minority group, mu_xi; separability s = ||mu||^2 / sigma_xi^2.
    teacher_map: (p, p_T - 1) T, the teacher's view of xi.
    student_map: (p, p_S - 1) S, the student's view of xi.
    sigma_y: () label noise standard deviation.
    sigma_xi: () within-group standard deviation of xi.
  """

  beta: jax.Array
  mu: jax.Array
  teacher_map: jax.Array
  student_map: jax.Array
  sigma_y: jax.Array
  sigma_xi: jax.Array

  @property
  def d_z(self) -> int:
    return self.beta.shape[-1]

  @property
  def teacher_dim(self) -> int:
    """d_T = p_T d_z."""
    return (self.teacher_map.shape[-1] + 1) * self.d_z

  @property
  def student_dim(self) -> int:
    """d_S = p_S d_z."""
    return (self.student_map.shape[-1] + 1) * self.d_z


def regression_design(
  key: jax.Array,
  d_z: int,
  group_dim: int,
  teacher_group_dim: int,
  student_group_dim: int,
  similarity: float,
  separation: float,
  sigma_y: float = 1.0,
  sigma_xi: float = 1.0,
) -> RegressionDesign:
  """The E1 design of `configs/w2s.py` for any sizes.

  A random orthonormal Q (p x p); T = Q[:, :p_T-1]; S_j = cos(theta) Q[:, j] + sin(theta) Q[:, p_T-1+j]
  for j < p_S - 1, so that ||Xi||_F^2 = ||T^T S||_F^2 = (p_S - 1) cos^2(theta) = `similarity`;
  mu = sqrt(s) sigma_xi Q[:, 0] with s = `separation`; beta* a random unit vector.
  """
  p_t, p_s = teacher_group_dim, student_group_dim
  if not 1 <= p_s <= p_t:
    raise ValueError(f"need 1 <= student_group_dim <= teacher_group_dim, got {p_s}, {p_t}")
  if group_dim < (p_t - 1) + (p_s - 1):
    raise ValueError(f"group_dim={group_dim} is below (p_T - 1) + (p_S - 1) = {p_t + p_s - 2}")
  if not 0.0 <= similarity <= max(p_s - 1, 0):
    raise ValueError(f"similarity ||Xi||_F^2 must be in [0, p_S - 1 = {p_s - 1}], got {similarity}")
  if separation < 0:
    raise ValueError(f"separation must be >= 0, got {separation}")
  q_key, beta_key = jax.random.split(key)
  q, _ = jnp.linalg.qr(jax.random.normal(q_key, (group_dim, group_dim)))
  cos = math.sqrt(similarity / (p_s - 1)) if p_s > 1 else 1.0
  sin = math.sqrt(max(0.0, 1.0 - cos**2))
  student_map = cos * q[:, : p_s - 1] + sin * q[:, p_t - 1 : p_t - 1 + p_s - 1]
  beta = jax.random.normal(beta_key, (d_z,))
  return RegressionDesign(
    beta=beta / jnp.linalg.norm(beta),
    mu=math.sqrt(separation) * sigma_xi * q[:, 0],
    teacher_map=q[:, : p_t - 1],
    student_map=student_map,
    sigma_y=jnp.asarray(sigma_y, jnp.float32),
    sigma_xi=jnp.asarray(sigma_xi, jnp.float32),
  )


def sample_regression(key: jax.Array, design: RegressionDesign, num: int, eta) -> dict:
  """`num` draws of D(eta): {"z" (num, d_z), "xi" (num, p), "group" (num,) in {0, 1}, "y" (num,)}.

  The uniforms behind g are shared across eta for one key, so sweeps over eta are coupled
  (common random numbers); the draws are independent across keys.
  """
  g_key, z_key, xi_key, y_key = jax.random.split(key, 4)
  group = (jax.random.uniform(g_key, (num,)) < eta).astype(jnp.float32)
  z = jax.random.normal(z_key, (num, design.d_z))
  noise = jax.random.normal(xi_key, (num, design.mu.shape[-1]))
  xi = group[:, None] * design.mu + design.sigma_xi * noise
  y = z @ design.beta + design.sigma_y * jax.random.normal(y_key, (num,))
  return {"z": z, "xi": xi, "group": group, "y": y}


# ---------------------------------------------------------------------------------------------------
# Binary classification with a spurious attribute (E2 of `configs/w2s.py`)
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class ClassificationDesign:
  """E2's Gaussian blocks and the fixed weak/strong feature maps (`core.w2s.e2_*_features`).

  Attributes:
    mu_core: (d_c,) core mean; x's first block is (2y - 1) mu_core + N(0, I).
    mu_spurious: (d_s,) spurious mean; x's second block is (2a - 1) mu_spurious + N(0, I).
    noise_dim: size of the pure-noise third block (must be >= d_c: it dilutes the weak core view).
    weak_projection: (d_c + d_s, k_T) orthonormal columns: the teacher's random projection.
    weak_core_scale: amplitude kept of the core signal in the teacher's view (E2: 0.3).
    strong_spurious_dim: how many spurious coordinates the student sees (E2: half).

  Hashed by identity (`eq=False`), so a design can be a static argument of `jax.jit`.
  """

  mu_core: np.ndarray
  mu_spurious: np.ndarray
  noise_dim: int
  weak_projection: np.ndarray
  weak_core_scale: float
  strong_spurious_dim: int

  @property
  def input_dim(self) -> int:
    return len(self.mu_core) + len(self.mu_spurious) + self.noise_dim


def classification_design(
  rng: np.random.Generator,
  core_dim: int = 16,
  spurious_dim: int = 8,
  noise_dim: int = 16,
  core_norm: float = 2.0,
  spurious_norm: float = 2.0,
  weak_dim: int = 6,
  weak_core_scale: float = 0.3,
  strong_spurious_dim: int = 4,
) -> ClassificationDesign:
  """E2's design: means along the all-ones directions with the given norms, a random weak projection."""
  if noise_dim < core_dim:
    raise ValueError(f"noise_dim={noise_dim} must be >= core_dim={core_dim}")
  if not 0 <= strong_spurious_dim <= spurious_dim:
    raise ValueError(
      f"strong_spurious_dim must be in [0, {spurious_dim}], got {strong_spurious_dim}"
    )
  if not 1 <= weak_dim <= core_dim + spurious_dim:
    raise ValueError(f"weak_dim must be in [1, {core_dim + spurious_dim}], got {weak_dim}")
  if not 0.0 <= weak_core_scale <= 1.0:
    raise ValueError(f"weak_core_scale must be in [0, 1], got {weak_core_scale}")
  projection, _ = np.linalg.qr(rng.standard_normal((core_dim + spurious_dim, weak_dim)))
  return ClassificationDesign(
    mu_core=np.full(core_dim, core_norm / math.sqrt(core_dim), np.float32),
    mu_spurious=np.full(spurious_dim, spurious_norm / math.sqrt(spurious_dim), np.float32),
    noise_dim=noise_dim,
    weak_projection=projection.astype(np.float32),
    weak_core_scale=weak_core_scale,
    strong_spurious_dim=strong_spurious_dim,
  )


def minority_mask(rng: np.random.Generator, num: int, eta: float) -> np.ndarray:
  """A shuffled bool mask with exactly round(eta * num) True (the minority)."""
  if not 0.0 <= eta <= 1.0:
    raise ValueError(f"minority fraction eta must be in [0, 1], got {eta}")
  mask = np.zeros(num, bool)
  mask[: int(round(eta * num))] = True
  return rng.permutation(mask)


def _classification_inputs(rng, design: ClassificationDesign, label, attribute) -> np.ndarray:
  num = len(label)
  core = (2 * label - 1)[:, None] * design.mu_core + rng.standard_normal((num, len(design.mu_core)))
  spurious = (2 * attribute - 1)[:, None] * design.mu_spurious
  spurious = spurious + rng.standard_normal((num, len(design.mu_spurious)))
  noise = rng.standard_normal((num, design.noise_dim))
  return np.concatenate([core, spurious, noise], axis=1).astype(np.float32)


def sample_classification(
  rng: np.random.Generator, design: ClassificationDesign, num: int, eta: float
) -> dict[str, np.ndarray]:
  """`num` draws with minority fraction eta: {"x", "label", "attribute"} (labels balanced in law)."""
  label = rng.integers(0, 2, num).astype(np.int32)
  attribute = np.where(minority_mask(rng, num, eta), 1 - label, label).astype(np.int32)
  return {
    "x": _classification_inputs(rng, design, label, attribute),
    "label": label,
    "attribute": attribute,
  }


def balanced_classification(
  rng: np.random.Generator, design: ClassificationDesign, num: int
) -> dict[str, np.ndarray]:
  """A test set with num / 4 points in each (y, a) group (as E2's test set)."""
  if num % 4:
    raise ValueError(f"a group-balanced set needs num divisible by 4, got {num}")
  label = np.repeat(np.array([0, 0, 1, 1], np.int32), num // 4)
  attribute = np.repeat(np.array([0, 1, 0, 1], np.int32), num // 4)
  return {
    "x": _classification_inputs(rng, design, label, attribute),
    "label": label,
    "attribute": attribute,
  }


# ---------------------------------------------------------------------------------------------------
# Images with a spurious attribute
# ---------------------------------------------------------------------------------------------------


def inject_stripe(images: np.ndarray, attribute: np.ndarray, intensity: float) -> np.ndarray:
  """Paints row 0 (a = 1) or the last row (a = 0) of (num, H, W) images with `intensity`."""
  if images.ndim != 3 or attribute.shape != images.shape[:1]:
    raise ValueError(
      f"need images (num, H, W) and attribute (num,), got {images.shape}, {attribute.shape}"
    )
  out = np.array(images, np.float32, copy=True)
  rows = np.where(attribute == 1, 0, images.shape[1] - 1)
  out[np.arange(len(out)), rows, :] = intensity
  return out


def group_split_indices(
  rng: np.random.Generator, minority: np.ndarray, sizes: Mapping[str, tuple[int, float]]
) -> dict[str, np.ndarray]:
  """Disjoint index sets of a pool, split `name` with `num` points of which round(eta num) minority.

  `minority` (pool,) bool marks the pool's minority; `sizes` maps split name -> (num, eta), drawn in
  order without replacement. Raises naming the split when the pool runs out of a group.
  """
  pools = {True: list(rng.permutation(np.flatnonzero(minority))), False: []}
  pools[False] = list(rng.permutation(np.flatnonzero(~minority)))
  out = {}
  for name, (num, eta) in sizes.items():
    num_minority = int(round(eta * num))
    for is_minority, count in ((True, num_minority), (False, num - num_minority)):
      if len(pools[is_minority]) < count:
        kind = "minority" if is_minority else "majority"
        raise ValueError(
          f"split {name!r}: needs {count} {kind} examples, the pool has {len(pools[is_minority])} left"
        )
    chosen = pools[True][:num_minority] + pools[False][: num - num_minority]
    pools[True], pools[False] = pools[True][num_minority:], pools[False][num - num_minority :]
    out[name] = rng.permutation(np.asarray(chosen, np.int64))
  return out


def _nested(record: Mapping, key: str):
  """`record["a"]["b"]` for `key = "a/b"`, naming the missing key."""
  node = record
  for part in key.split("/"):
    if part not in node:
      raise KeyError(f"record has no field {key!r} (no {part!r} in {sorted(node)})")
    node = node[part]
  return node


def _resize(image: np.ndarray, size: int) -> np.ndarray:
  """Centre square crop, then a bilinear resize (antialiased) to (size, size, C), uint8."""
  h, w = image.shape[:2]
  side = min(h, w)
  top, left = (h - side) // 2, (w - side) // 2
  crop = jnp.asarray(image[top : top + side, left : left + side], jnp.float32)
  resized = jax.image.resize(crop, (size, size, image.shape[2]), "linear", antialias=True)
  return np.asarray(jnp.clip(jnp.round(resized), 0, 255), np.uint8)


def tfds_group_pool(
  name: str,
  split: str,
  label_key: str,
  attribute_key: str,
  pretrain_keys: Sequence[str],
  image_size: int,
  max_examples: int,
  data_dir: str | None = None,
) -> dict[str, np.ndarray]:
  """The first `max_examples` records of a tfds split as arrays, never downloading.

  Returns {"image" (num, S, S, C) uint8, "label", "attribute", "pretrain_label"} (int32); keys may be
  nested with "/" (CelebA: "attributes/Blond_Hair"); boolean fields become 0/1. `pretrain_label`
  packs the `pretrain_keys` bits into one class index (the backbone's different task).
  """
  import tensorflow_datasets as tfds

  source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  count = min(max_examples, len(source))
  images, labels, attributes, pretrain = [], [], [], []
  for i in range(count):
    record = source[i]
    image = np.asarray(record["image"])
    images.append(_resize(image if image.ndim == 3 else image[..., None], image_size))
    labels.append(int(np.asarray(_nested(record, label_key))))
    attributes.append(int(np.asarray(_nested(record, attribute_key))))
    bits = [int(np.asarray(_nested(record, k))) for k in pretrain_keys]
    pretrain.append(sum(b << j for j, b in enumerate(bits)))
  for field, values in (("label_key", labels), ("attribute_key", attributes)):
    if set(values) - {0, 1}:
      raise ValueError(f"data.{field}: values must be binary, got {sorted(set(values))[:5]}")
  return {
    "image": np.stack(images),
    "label": np.asarray(labels, np.int32),
    "attribute": np.asarray(attributes, np.int32),
    "pretrain_label": np.asarray(pretrain, np.int32),
  }
