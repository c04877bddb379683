"""W2S: "Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026,
arXiv 2509.24005).

Claim: with a weak teacher fine-tuned on labelled data of minority fraction eta_l and a strong student
trained on its pseudolabels over unlabelled data of minority fraction eta_u, W2S always helps when
eta_u = eta_l, its gain shrinks as (eta_u - eta_l)^2 grows and can turn negative; retraining the student
on its own low-entropy subset with generalised cross-entropy (Enhanced-W2S) recovers much of the loss
without group labels.

`config.task` picks the pipeline; every stage is a phase of the shared loop, each vmapped over
`config.num_seeds` independent replicates (seeds are an array axis, never a Python loop). E1 and E2 are
this repository's CPU experiments (`configs/w2s.py`).

  regression (E1, `regression.py`): the paper's theoretical setting, core z ~ N(0, I), y = z^T beta* +
    noise, a group feature xi whose mean moves with the minority group; the teacher sees phi_T =
    z (x) [1; T^T xi], the student phi_S = z (x) [1; S^T xi] (`core/w2s.py`). One run covers the grid
    separation s x similarity ||Xi||_F^2 x eta_l x eta_u (x eta_t, which only changes evaluation):
      1. teacher       ridgeless fit of y on phi_T, n labelled draws of D(eta_l) (num_steps = 0);
      2. pseudolabels, student
                       f_T on N unlabelled draws of D(eta_u), and the ridgeless fit of those soft
                       labels on phi_S (num_steps = 0 each);
      3. scores        ER_T, ER_S and the gain G = ER_T - ER_S as exact population risks, against the
                       exact-moment predictor and the paper's Thm 1 / Thm 2 as relayed, for eta_t in
                       {eta_l, 0.5, 0 (majority), 1 (minority)}.
  classification (E2), digits (image variant), tfds (`:gpu`, CelebA / Waterbirds-style), in
  `classification.py`; the paper's remedy, Enhanced-W2S:
      0. pretrain      (digits, tfds) the strong backbone, later frozen: `digits`, a CNN trained here
                       with SimCLR on the training digits without labels or stripes
                       (`backbones.py`); `digits_transfer` and tfds, an MLP trained on a different
                       task (the other digit classes 0-4; other CelebA attributes).
      1. teacher       the weak model on n labelled examples of minority fraction eta_l, cross-entropy
                       (E2: softmax regression on the weak projection; digits: an MLP with 8 hidden
                       units on 2x2-pooled pixels; tfds: a small MLP on pixels).
      2. pseudolabels  num_steps = 0; teacher predictions on the N unlabelled (fraction eta_u) and on a
                       held-out unlabelled split, hard (argmax) or soft (`config.pseudolabels`).
      3. student       vanilla W2S: a linear head on frozen strong features, cross-entropy on
                       pseudolabels.
      4-6. enhanced    Enhanced-W2S: the student's predictive entropy ranks the unlabelled points (4);
                       for every (p, q) of the grid a head is retrained with GCE(q) on the ceil(pN)
                       lowest-entropy points and their teacher pseudolabels (5), from a fresh head or
                       continued from the student (`config.enhanced.init`); all grid points train
                       together as one more vmapped axis. (p, q) is chosen per seed by agreement with
                       the teacher's pseudolabels on the held-out split (6): no group label and no true
                       label.
      7. ceiling       diagnostic: the student's head fit to the true labels of the unlabelled split,
                       its (y, a) groups weighted equally (`ceiling`) and plainly (`ceiling_erm`);
                       the best head the strong features offer, against which the teacher is read.

Files: `phases.py` (which pipeline runs), `regression.py`, `classification.py`, `backbones.py` (the
digits CNN and SimCLR), `study.py` (study arms, report, figures); the splits are built in
`core/data/spurious_splits.py`.

Choices where the paper is open (each a config field):
* Excess risks are exact expectations over x (`core.w2s.excess_risk`), not a 20k-point test set.
* The exact-moment predictor (the `*_pred` metrics, figures) is our own derivation
  (`core.w2s.predicted_*`, derived in `core/w2s.py`), not the paper's asymptotic formula.
* D(eta) for regression draws g ~ Bernoulli(eta); the classification sets hold exactly round(eta num)
  minority points; E2 and digit test sets are group-balanced; tfds test sets are balanced by subsampling.
* Average accuracy is the mean of the four (y, a) group accuracies (= plain accuracy when balanced).
* Digits: label = parity of the digit among 5-9, spurious attribute = a bright top (a = 1) or bottom
  (a = 0) row; the majority has a = y. The backbone never sees stripes. The `digits` backbone sees the
  1500 training digits 0-9 without labels (the images of the teacher's labelled split among them, as
  a pre-trained model may have seen its fine-tuning images), never a test digit; its frozen features
  are z-scored with the unlabelled split's statistics (`pretrain.standardize_features`).
* `enhanced_oracle_*` (best grid point by test accuracy) is reported as a diagnostic of the selection
  rule only; it uses test labels and is never the reported Enhanced-W2S number.
* Full-batch Adam for the heads (300 steps by default); the regression phases are closed form.
* The (p, q) grid and its selection rule (step 6) are ours. We also tried agreement restricted to the
  student's most confident held-out points: its scores tie across the grid, so it was dropped. Both
  rules are label-free and neither finds the heads that fix the teacher's systematic errors (see
  `enhanced_grid_*` and `enhanced_oracle_*`).
* `runtime.runtime_barrier` and `core.w2s.spd_solve` work around two CPU problems of the shared loop on
  jax 0.10.2: constant-folding of closed-over data, and a deadlock of batched LAPACK calls on 2 cores.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from core.data import images
from core.data.spurious_splits import NUM_GROUPS
from core.nn import precision
from methods.base import (
  Method,
  require,
  require_choice,
  require_positive_int,
  require_prepared_tfds,
)
from methods.w2s.classification import digits_data, e2_data, group_data, tfds_data
from methods.w2s.phases import phases
from methods.w2s.regression import _key
from methods.w2s.study import report, study_arms

__all__ = [
  "METHOD",
  "phases",
  "validate",
  "study_arms",
  "report",
  "group_data",
  "e2_data",
  "digits_data",
  "tfds_data",
  "_key",
]

TASKS = ("regression", "classification", "digits", "tfds")
PSEUDOLABELS = ("hard", "soft")
ENHANCED_INITS = ("fresh", "continued")
PRETRAIN_OBJECTIVES = ("supervised", "contrastive")
PRETRAIN_NETWORKS = ("mlp", "cnn")


def _require_fraction(config, field: str, value, low_open: bool = False) -> None:
  ok = (0.0 < value <= 1.0) if low_open else (0.0 <= value <= 1.0)
  require(ok, field, f"must be in {'(0, 1]' if low_open else '[0, 1]'}, got {value!r}")


def _validate_regression(config) -> None:
  r = config.regression
  for field in (
    "d_z",
    "group_dim",
    "teacher_group_dim",
    "student_group_dim",
    "num_labelled",
    "num_unlabelled",
  ):
    require_positive_int(config, f"regression.{field}")
  require(
    r.student_group_dim <= r.teacher_group_dim,
    "regression.student_group_dim",
    f"p_S={r.student_group_dim} must not exceed p_T={r.teacher_group_dim}",
  )
  require(
    r.group_dim >= r.teacher_group_dim + r.student_group_dim - 2,
    "regression.group_dim",
    f"must be >= p_T + p_S - 2 = {r.teacher_group_dim + r.student_group_dim - 2}, got {r.group_dim}",
  )
  for s in r.separations:
    require(s >= 0, "regression.separations", f"must be >= 0, got {s}")
  for xi2 in r.similarities:
    require(
      0 <= xi2 <= r.student_group_dim - 1,
      "regression.similarities",
      f"||Xi||_F^2 must be in [0, p_S - 1 = {r.student_group_dim - 1}], got {xi2}",
    )
  for field in ("eta_labelled", "eta_unlabelled"):
    require(len(r[field]) > 0, f"regression.{field}", "must not be empty")
    for eta in r[field]:
      _require_fraction(config, f"regression.{field}", eta)
  d_t, d_s = r.teacher_group_dim * r.d_z, r.student_group_dim * r.d_z
  require(
    r.num_labelled > d_t + 1,
    "regression.num_labelled",
    f"the exact-moment predictor needs n > d_T + 1 = {d_t + 1} (OLS regime), got {r.num_labelled}",
  )
  require(
    r.num_unlabelled > d_s + 1,
    "regression.num_unlabelled",
    f"needs N > d_S + 1 = {d_s + 1}, got {r.num_unlabelled}",
  )
  require(
    r.sigma_y > 0 and r.sigma_xi > 0, "regression.sigma_y", "sigma_y and sigma_xi must be > 0"
  )


def _validate_classification(config) -> None:
  for field in ("num_labelled", "num_unlabelled", "num_heldout", "num_test"):
    require_positive_int(config, f"groups.{field}")
  require(config.groups.num_test % NUM_GROUPS == 0, "groups.num_test", "must be divisible by 4")
  for field in ("eta_labelled", "eta_unlabelled"):
    _require_fraction(config, f"groups.{field}", config.groups[field])
  require_choice(config, "pseudolabels", PSEUDOLABELS)
  require_choice(config, "enhanced.init", ENHANCED_INITS)
  for section in ("teacher", "student", "enhanced"):
    require_positive_int(config, f"{section}.steps")
    require(config[section].learning_rate > 0, f"{section}.learning_rate", "must be > 0")
  for field in ("p_grid", "q_grid"):
    require(len(config.enhanced[field]) > 0, f"enhanced.{field}", "must not be empty")
    for value in config.enhanced[field]:
      _require_fraction(config, f"enhanced.{field}", value, low_open=True)
  batch = config.head_batch_size
  require(
    isinstance(batch, int) and batch >= 0, "head_batch_size", f"must be an int >= 0, got {batch!r}"
  )
  if config.task in ("digits", "tfds"):
    _validate_pretrain(config)
  if config.task == "digits":
    _validate_digits(config)
  if config.task == "tfds":
    require_prepared_tfds(config, "tfds.data_dir", config.tfds.name)


def _validate_pretrain(config) -> None:
  p = config.pretrain
  require_positive_int(config, "pretrain.steps")
  require_positive_int(config, "pretrain.batch_size")
  require_choice(config, "pretrain.objective", PRETRAIN_OBJECTIVES)
  require_choice(config, "pretrain.network", PRETRAIN_NETWORKS)
  for field, value in (("objective", "contrastive"), ("network", "cnn")):
    require(
      p[field] != value or config.task == "digits",
      f"pretrain.{field}",
      f"{value!r} is built for 8x8 digits (task 'digits'), got task {config.task!r}",
    )
  if p.network == "cnn":
    require(
      len(p.channels) > 0 and all(isinstance(c, int) and c > 0 for c in p.channels),
      "pretrain.channels",
      f"must be positive ints, got {tuple(p.channels)!r}",
    )
  if p.objective == "contrastive":
    require_positive_int(config, "pretrain.projection_dim")
    require(p.temperature > 0, "pretrain.temperature", f"must be > 0, got {p.temperature}")
    a = p.augment
    require(0 <= a.shift <= 3, "pretrain.augment.shift", f"must be in [0, 3], got {a.shift}")
    require(0 < a.keep <= 1, "pretrain.augment.keep", f"must be in (0, 1], got {a.keep}")
    low, high = a.contrast
    require(0 < low <= high, "pretrain.augment.contrast", f"need 0 < low <= high, got {a.contrast}")
    require(a.noise >= 0, "pretrain.augment.noise", f"must be >= 0, got {a.noise}")


def _validate_digits(config) -> None:
  d, g = config.digits, config.groups
  labels = images.digits()["train"]["label"]
  pool = int(np.isin(labels, d.task_digits).sum())
  needed = g.num_labelled + g.num_unlabelled + g.num_heldout
  require(
    needed <= pool,
    "groups.num_unlabelled",
    f"labelled + unlabelled + held-out = {needed} exceed the {pool} training digits of {list(d.task_digits)}",
  )
  require(
    config.pretrain.objective != "supervised" or not set(d.task_digits) & set(d.pretrain_digits),
    "digits.pretrain_digits",
    "must not overlap digits.task_digits when pre-training is supervised (the backbone's task "
    "must differ)",
  )
  require(
    list(d.pretrain_digits) == sorted(d.pretrain_digits), "digits.pretrain_digits", "must be sorted"
  )
  require(
    d.teacher_pool in (1, 2, 4, 8), "digits.teacher_pool", f"must divide 8, got {d.teacher_pool}"
  )


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "task", TASKS)
  require_choice(config, "model.dtype", precision.DTYPE_NAMES)
  require_positive_int(config, "num_seeds")
  if config.task == "regression":
    _validate_regression(config)
  else:
    _validate_classification(config)


METHOD = Method(name="w2s", phases=phases, validate=validate, study_arms=study_arms, report=report)
