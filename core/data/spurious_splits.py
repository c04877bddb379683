"""Per-seed train/test splits with a spurious attribute, for weak-to-strong (W2S) classification.

Paper: "Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026,
arXiv 2509.24005). Its two sources of group imbalance are the minority fraction eta_l of the labelled
set (the weak teacher's) and eta_u of the unlabelled set (the strong student's); the (y, a) group with
a != y is the minority. The generators and the tfds reader these sets draw from are in
`core/data/spurious.py`.

Every builder returns a `GroupData`: per split ("labelled", "unlabelled", "heldout", "test") arrays
with a leading example axis and a second axis over `num_seeds` independent replicates, seed `r` drawn
from `np.random.default_rng([seed, r])`. The splits' sizes and minority fractions come as
`sizes = {"labelled": (num, eta_l), "unlabelled": (num, eta_u), "heldout": (num, eta_u)}`.

* `e2_splits`: the Gaussian blocks of `spurious.classification_design`; a group-balanced test set.
* `striped_digits_splits`: 8x8 digits of `task_digits` labelled by parity, the attribute painted as a
  stripe (`spurious.inject_stripe`); every test image once with each stripe. The backbone's
  pre-training set is the `pretrain_digits`, without stripes.
* `tfds_splits`: pools read by `spurious.tfds_group_pool` and flattened by `pixel_pool`; the test set is
  subsampled to balance the groups. The backbone pre-trains on the pools' `pretrain_label`.

Pure functions of their arrays, sizes and seeds; nothing here reads or writes files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from core.data import images, spurious

NUM_GROUPS = 4  # (y, a) with y, a in {0, 1}; group id = 2 y + a
FIELDS = ("x", "label", "attribute")

Sizes = Mapping[str, tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class GroupData:
  """Per split {"x" (num, R, D) float32, "label" (num, R), "attribute" (num, R)}, and for the image
  tasks the backbone's pre-training set {"x" (num, D), "label" (num,)} with its test split."""

  splits: Mapping[str, Mapping[str, np.ndarray]]
  pretrain: Mapping[str, np.ndarray] | None = None
  pretrain_test: Mapping[str, np.ndarray] | None = None
  e2_design: spurious.ClassificationDesign | None = None


def stack_seeds(per_seed: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Per-seed dicts of (num, ...) arrays -> one dict of (num, R, ...) arrays."""
  return {name: np.stack([d[name] for d in per_seed], axis=1) for name in per_seed[0]}


def e2_splits(
  design: spurious.ClassificationDesign, seed: int, num_seeds: int, sizes: Sizes, num_test: int
) -> GroupData:
  """Per seed: the `sizes` splits, then a group-balanced test set of `num_test` points."""
  per_split = {name: [] for name in (*sizes, "test")}
  for replicate in range(num_seeds):
    rng = np.random.default_rng([seed, replicate])
    for name, (num, eta) in sizes.items():
      per_split[name].append(spurious.sample_classification(rng, design, num, eta))
    per_split["test"].append(spurious.balanced_classification(rng, design, num_test))
  return GroupData({k: stack_seeds(v) for k, v in per_split.items()}, e2_design=design)


def striped_digit_inputs(digit_images, attribute, intensity: float) -> np.ndarray:
  """(num, 8, 8) digits with the attribute's stripe, scaled to [0, 1] and flattened to (num, 64)."""
  striped = spurious.inject_stripe(digit_images, attribute, intensity)
  return (striped / images.DIGITS_LEVELS).reshape(len(striped), -1).astype(np.float32)


def striped_digits_splits(
  train: Mapping[str, np.ndarray],
  test: Mapping[str, np.ndarray],
  seed: int,
  num_seeds: int,
  sizes: Sizes,
  task_digits: Sequence[int],
  pretrain_digits: Sequence[int],
  intensity: float,
) -> GroupData:
  """The digits of `task_digits` (label = odd digit) with a stripe: a = label for the majority,
  1 - label for a fraction eta of each split. `train` and `test` are `images.digits()` splits
  ({"image" (N, 8, 8) on 0..16, "label"}); `pretrain_digits` (sorted) give the backbone's classes."""
  task = lambda labels: np.isin(labels, task_digits)
  parity = lambda labels: (labels % 2).astype(np.int32)
  pool_images = train["image"][task(train["label"])]
  pool_labels = parity(train["label"][task(train["label"])])
  per_split = {name: [] for name in sizes}
  for replicate in range(num_seeds):
    rng = np.random.default_rng([seed, replicate])
    indices = spurious.group_split_indices(
      rng, np.zeros(len(pool_labels), bool), {n: (num, 0.0) for n, (num, _) in sizes.items()}
    )
    for name, (num, eta) in sizes.items():
      label = pool_labels[indices[name]]
      minority = spurious.minority_mask(rng, num, eta)
      attribute = np.where(minority, 1 - label, label).astype(np.int32)
      x = striped_digit_inputs(pool_images[indices[name]], attribute, intensity)
      per_split[name].append({"x": x, "label": label, "attribute": attribute})
  test_images = test["image"][task(test["label"])]
  test_labels = parity(test["label"][task(test["label"])])
  stacked = {k: stack_seeds(v) for k, v in per_split.items()}
  stacked["test"] = _balanced_stripes(test_images, test_labels, intensity, num_seeds)
  return GroupData(
    stacked, _digit_classes(train, pretrain_digits), _digit_classes(test, pretrain_digits)
  )


def _digit_classes(split: Mapping[str, np.ndarray], digits: Sequence[int]) -> dict[str, np.ndarray]:
  """The images of `digits` (no stripe), labelled by their index in `digits`."""
  keep = np.isin(split["label"], digits)
  return {
    "x": (split["image"][keep] / images.DIGITS_LEVELS).reshape(-1, 64).astype(np.float32),
    "label": np.searchsorted(digits, split["label"][keep]).astype(np.int32),
  }


def _balanced_stripes(test_images, labels, intensity, num_seeds) -> dict[str, np.ndarray]:
  """Every test image once with each attribute: the (y, a) groups are balanced within each y."""
  attribute = np.concatenate([np.zeros(len(labels), np.int32), np.ones(len(labels), np.int32)])
  both = np.concatenate([test_images, test_images])
  split = {
    "x": striped_digit_inputs(both, attribute, intensity),
    "label": np.concatenate([labels, labels]).astype(np.int32),
    "attribute": attribute,
  }
  return {k: np.repeat(v[:, None], num_seeds, axis=1) for k, v in split.items()}


def pixel_pool(pool: Mapping[str, np.ndarray], flip_attribute: bool) -> dict[str, np.ndarray]:
  """A `spurious.tfds_group_pool` with its uint8 images as flat float32 "x" in [0, 1]; with
  `flip_attribute` the attribute is 1 - attribute (so that the majority has a = y)."""
  out = {k: v for k, v in pool.items() if k != "image"}
  if flip_attribute:
    out["attribute"] = 1 - out["attribute"]
  out["x"] = (pool["image"].reshape(len(pool["label"]), -1) / 255.0).astype(np.float32)
  return out


def tfds_splits(
  train: Mapping[str, np.ndarray],
  test: Mapping[str, np.ndarray],
  seed: int,
  num_seeds: int,
  sizes: Sizes,
  num_test: int,
) -> GroupData:
  """Disjoint `sizes` splits of the `train` pool per seed (minority: attribute != label), a
  group-balanced subsample of `test`; the backbone's task is the pools' `pretrain_label`."""
  per_split = {name: [] for name in sizes}
  for replicate in range(num_seeds):
    rng = np.random.default_rng([seed, replicate])
    indices = spurious.group_split_indices(rng, train["label"] != train["attribute"], sizes)
    for name in per_split:
      per_split[name].append({k: train[k][indices[name]] for k in FIELDS})
  stacked = {k: stack_seeds(v) for k, v in per_split.items()}
  stacked["test"] = balanced_subsample(test, num_test, seed, num_seeds)
  pretrain = {"x": train["x"], "label": train["pretrain_label"]}
  return GroupData(stacked, pretrain, {"x": test["x"], "label": test["pretrain_label"]})


def balanced_subsample(
  pool: Mapping[str, np.ndarray], num: int, seed: int, num_seeds: int
) -> dict[str, np.ndarray]:
  """Up to num / 4 points of each (y, a) group of `pool`, the same for every seed."""
  rng = np.random.default_rng([seed, 12345])
  group = np.asarray(pool["label"]) * 2 + np.asarray(pool["attribute"])
  keep = np.concatenate(
    [rng.permutation(np.flatnonzero(group == g))[: num // NUM_GROUPS] for g in range(NUM_GROUPS)]
  )
  return {k: np.repeat(pool[k][keep][:, None], num_seeds, axis=1) for k in FIELDS}
