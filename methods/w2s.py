"""W2S: "Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026).

Claim: with a weak teacher fine-tuned on labelled data of minority fraction eta_l and a strong student
trained on its pseudolabels over unlabelled data of minority fraction eta_u, W2S always helps when
eta_u = eta_l, its gain shrinks as (eta_u - eta_l)^2 grows and can turn negative; retraining the student
on its own low-entropy subset with generalised cross-entropy (Enhanced-W2S) recovers much of the loss
without group labels. Spec: `w2s_spurious.md`; maths in `core/w2s.py`, data in `core/data/spurious.py`.

`config.task` picks the pipeline; every stage is a phase of the shared loop, each vmapped over
`config.num_seeds` independent replicates (seeds are an array axis, never a Python loop):

  regression (E1, spec Sec. 2, 2.1, 5): one run covers the whole grid separation s x similarity
    ||Xi||_F^2 x eta_l x eta_u (x eta_t, which only changes evaluation).
      teacher       num_steps = 0; `init` is the ridgeless fit of y on phi_T (n labelled from D(eta_l)).
      pseudolabels  num_steps = 0; `init` is f_T on N unlabelled draws of D(eta_u) (soft labels).
      student       num_steps = 0; `init` is the ridgeless fit of the pseudolabels on phi_S;
                    `evaluate` gives ER_T, ER_S, G = ER_T - ER_S (exact population risks), the Sec. 2.1
                    predictor and the relayed Thm 1/2, for eta_t in {eta_l, 0.5, 0 (majority),
                    1 (minority)}.
  classification (E2), digits (image variant), tfds (`:gpu`, CelebA / Waterbirds-style):
      pretrain      (digits, tfds) the strong backbone, an MLP trained here on a different task (the
                    other digit classes 0-4; other CelebA attributes), later frozen.
      teacher       the weak model on n labelled examples of minority fraction eta_l, cross-entropy
                    (E2: softmax regression on the weak projection; digits: an MLP with 8 hidden units
                    on 2x2-pooled pixels; tfds: a small MLP on pixels).
      pseudolabels  num_steps = 0; teacher predictions on the N unlabelled (fraction eta_u) and on a
                    held-out unlabelled split, hard (argmax) or soft (`config.pseudolabels`).
      student       vanilla W2S: a linear head on frozen strong features, cross-entropy on pseudolabels.
      enhanced      Enhanced-W2S (Sec. 3 steps 4-5): the student's predictive entropy ranks the
                    unlabelled points; for every (p, q) of the grid a head is retrained with GCE(q)
                    on the ceil(pN) lowest-entropy points and their teacher pseudolabels, from a fresh
                    head or continued from the student (`config.enhanced.init`); all grid points train
                    together as one more vmapped axis. (p, q) is chosen per seed by agreement with the
                    teacher's pseudolabels on the held-out split: no group label and no true label.

Choices where the spec is open (each a config field):
* Excess risks are exact expectations over x (`core.w2s.excess_risk`), not a 20k-point test set.
* D(eta) for regression draws g ~ Bernoulli(eta); the classification sets hold exactly round(eta num)
  minority points; E2 and digit test sets are group-balanced; tfds test sets are balanced by subsampling.
* Average accuracy is the mean of the four (y, a) group accuracies (= plain accuracy when balanced).
* Digits: label = parity of the digit among 5-9, spurious attribute = a bright top (a = 1) or bottom
  (a = 0) row; the majority has a = y. The backbone never sees stripes.
* `enhanced_oracle_*` (best grid point by test accuracy) is reported as a diagnostic of the selection
  rule only; it uses test labels and is never the reported Enhanced-W2S number.
* Full-batch Adam for the heads (spec: 300 steps); the regression phases are closed form.
* (p, q) selection follows the spec (teacher agreement on a pseudolabelled held-out split). We also
  tried agreement restricted to the student's most confident held-out points: its scores tie across
  the grid, so it was dropped. Both rules are label-free and neither finds the heads that fix the
  teacher's systematic errors (see `enhanced_grid_*` and `enhanced_oracle_*`).
* `_runtime` and `core.w2s.spd_solve` work around two CPU problems of the shared loop on jax 0.10.2:
  constant-folding of closed-over data, and a deadlock of batched LAPACK calls on 2 cores.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import w2s
from core.data import images
from core.data import spurious as spurious_data
from core.nn.mlp import MLP
from methods.base import Method, Phase, Report, require, require_choice, require_positive_int

TASKS = ("regression", "classification", "digits", "tfds")
PSEUDOLABELS = ("hard", "soft")
ENHANCED_INITS = ("fresh", "continued")
NUM_CLASSES = 2
NUM_GROUPS = 4  # (y, a) with y, a in {0, 1}; group id = 2 y + a
# the evaluation mixtures eta_t: eta_l itself, balanced, the majority (0) and the minority (1) alone
ETA_T_LABELS = ("eta_l", "0.5", "0", "1")


def _frozen(config: ml_collections.ConfigDict) -> str:
  """A hashable copy of the config for caches."""
  return config.to_json(sort_keys=True)


def _thawed(frozen: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(json.loads(frozen))


def _runtime(tree, rng):
  """`tree` unchanged but tied to the phase's runtime `rng`. Data closed over `init` are HLO
  constants; without this, XLA constant-folds whole fits at compile time in its slow evaluator
  (minutes for E2's pseudolabels)."""
  return jax.lax.optimization_barrier((tree, rng))[0]


def _limit_blas_threads() -> None:
  """One BLAS thread: LAPACK calls from XLA's CPU threads run 10-30x slower when OpenBLAS spawns its
  own threads on a loaded 2-core machine (measured: 320x320 Cholesky 68 ms vs 2 ms)."""
  import threadpoolctl

  threadpoolctl.threadpool_limits(1, user_api="blas")


# ---------------------------------------------------------------------------------------------------
# E1: ridgeless regression, theory vs simulation
# ---------------------------------------------------------------------------------------------------


def regression_designs(config: ml_collections.ConfigDict) -> spurious_data.RegressionDesign:
  """The designs of the grid, stacked with leading axes (separation, similarity); one Q and beta*."""
  r = config.regression
  key = jax.random.fold_in(jax.random.key(config.seed), 7)
  sizes = (r.d_z, r.group_dim, r.teacher_group_dim, r.student_group_dim)
  design = jax.jit(spurious_data.regression_design, static_argnums=(1, 2, 3, 4, 5, 6, 7, 8))
  designs = [
    [design(key, *sizes, xi2, s, r.sigma_y, r.sigma_xi) for xi2 in r.similarities]
    for s in r.separations
  ]
  return _stack([_stack(row) for row in designs])


def _stack(designs):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *designs)


def _replicate_keys(config, stream: int) -> jax.Array:
  """One key per seed for the labelled (stream 0) or unlabelled (stream 1) draws; shared across the
  grid (common random numbers), independent across seeds."""
  return jax.random.split(jax.random.fold_in(jax.random.key(config.seed), stream), config.num_seeds)


def _design_at(designs, s: int | jax.Array, x: int | jax.Array = 0):
  return jax.tree.map(lambda leaf: leaf[s, x], designs)


def regression_teacher_init(config, designs, rng, inputs):
  """coef[s, l, r] of the ridgeless teacher on n draws of D(eta_l) (spec Sec. 2 step 1)."""
  del inputs
  r = config.regression
  designs, keys = _runtime((designs, _replicate_keys(config, 0)), rng)
  etas = jnp.asarray(r.eta_labelled, jnp.float32)

  def fit(design, eta, key):
    data = spurious_data.sample_regression(key, design, r.num_labelled, eta)
    return w2s.ridgeless_fit(
      w2s.teacher_features(data["z"], data["xi"], design.teacher_map), data["y"]
    )

  def per_separation(s):
    design = _design_at(designs, s)
    return jax.vmap(lambda eta: jax.vmap(lambda k: fit(design, eta, k))(keys))(etas)

  return {"coef": jax.lax.map(per_separation, jnp.arange(len(r.separations)))}


def _unlabelled(config, design, eta, key):
  return spurious_data.sample_regression(key, design, config.regression.num_unlabelled, eta)


def regression_pseudolabel_init(config, designs, rng, inputs):
  """targets[s, u, r, :, l] = f_T^{(s, l, r)}(x) on N unlabelled draws of D(eta_u) (step 2)."""
  r = config.regression
  designs, coef, keys = _runtime(
    (designs, inputs["teacher"]["coef"], _replicate_keys(config, 1)), rng
  )
  etas = jnp.asarray(r.eta_unlabelled, jnp.float32)

  def per_separation(s):
    design = _design_at(designs, s)

    def one(eta, key, teacher_coef):
      data = _unlabelled(config, design, eta, key)
      return w2s.teacher_features(data["z"], data["xi"], design.teacher_map) @ teacher_coef.T

    per_eta = lambda eta: jax.vmap(one, in_axes=(None, 0, 1))(eta, keys, coef[s])
    return jax.lax.map(per_eta, etas)

  return {"targets": jax.lax.map(per_separation, jnp.arange(len(r.separations)))}


def regression_student_init(config, designs, rng, inputs):
  """coef[s, u, x, r, :, l] of the ridgeless student fit to the pseudolabels on phi_S (step 2)."""
  r = config.regression
  targets = inputs["pseudolabels"]["targets"]  # (S, U, R, N, L)
  designs, targets, keys = _runtime((designs, targets, _replicate_keys(config, 1)), rng)
  etas = jnp.asarray(r.eta_unlabelled, jnp.float32)
  num_s, num_u, num_x = len(r.separations), len(r.eta_unlabelled), len(r.similarities)

  def one(design, eta, key, target):
    data = _unlabelled(config, design, eta, key)
    return w2s.ridgeless_fit(
      w2s.student_features(data["z"], data["xi"], design.student_map), target
    )

  def per_cell(index):
    s, u, x = index // (num_u * num_x), (index // num_x) % num_u, index % num_x
    design = _design_at(designs, s, x)
    return jax.vmap(one, in_axes=(None, None, 0, 0))(design, etas[u], keys, targets[s, u])

  coef = jax.lax.map(per_cell, jnp.arange(num_s * num_u * num_x))
  return {"coef": coef.reshape(num_s, num_u, num_x, *coef.shape[1:])}


def _eta_tests(eta_l):
  return jnp.stack([eta_l, 0.5, 0.0, 1.0])


def regression_teacher_risks(config, designs, teacher_coef):
  """Simulated ER_T[s, l, r, t], the Sec. 2.1 prediction and the relayed Thm 1 [s, l, t]."""
  r = config.regression
  etas_l = jnp.asarray(r.eta_labelled, jnp.float32)

  def per_separation(s, coef):
    design = _design_at(designs, s)

    def sim(eta_l, coef_l):
      moments = jax.vmap(lambda t: w2s.teacher_moment(design, t))(_eta_tests(eta_l))
      return jax.vmap(lambda c: jax.vmap(lambda m: w2s.excess_risk(c, design.beta, m))(moments))(
        coef_l
      )

    def theory(fn, eta_l):
      return jax.vmap(lambda t: fn(design, eta_l, t, r.num_labelled))(_eta_tests(eta_l))

    return (
      jax.vmap(sim)(etas_l, coef),
      jax.vmap(lambda e: theory(w2s.predicted_teacher_risk, e))(etas_l),
      jax.vmap(lambda e: theory(w2s.relayed_teacher_risk, e))(etas_l),
    )

  return jax.vmap(per_separation)(jnp.arange(len(r.separations)), teacher_coef)


def regression_student_risks(config, designs, student_coef):
  """Simulated ER_S[s, u, x, r, l, t]; the Sec. 2.1 and relayed predictions [s, u, x, l, t]."""
  r = config.regression
  etas_l = jnp.asarray(r.eta_labelled, jnp.float32)
  etas_u = jnp.asarray(r.eta_unlabelled, jnp.float32)
  n, big_n = r.num_labelled, r.num_unlabelled

  def cell(s, x, eta_u, coef):  # coef (R, d_S, L)
    design = _design_at(designs, s, x)

    def sim(eta_l, coef_l):  # coef_l (R, d_S)
      moments = jax.vmap(lambda t: w2s.student_moment(design, t))(_eta_tests(eta_l))
      er = lambda c: jax.vmap(lambda m: w2s.excess_risk(c, design.beta, m))(moments)
      return jax.vmap(er)(coef_l)

    simulated = jax.vmap(sim, in_axes=(0, 2), out_axes=1)(etas_l, coef)  # (R, L, T)
    pred = lambda e_l: jax.vmap(
      lambda t: w2s.predicted_student_risk(design, e_l, eta_u, t, n, big_n)
    )(_eta_tests(e_l))
    relayed = lambda e_l: jax.vmap(lambda t: w2s.relayed_student_risk(design, e_l, eta_u, t, n))(
      _eta_tests(e_l)
    )
    return simulated, jax.vmap(pred)(etas_l), jax.vmap(relayed)(etas_l)

  over_x = jax.vmap(cell, in_axes=(None, 0, None, 0))
  over_u = jax.vmap(over_x, in_axes=(None, None, 0, 0))
  over_s = jax.vmap(over_u, in_axes=(0, None, None, 0))
  return over_s(
    jnp.arange(len(r.separations)), jnp.arange(len(r.similarities)), etas_u, student_coef
  )


@functools.lru_cache(maxsize=8)
def _risk_fn(frozen: str, which: str):
  """Jitted `(designs, coef) -> (simulated, Sec. 2.1, relayed)` risks, built once per config."""
  fn = {"teacher": regression_teacher_risks, "student": regression_student_risks}[which]
  return jax.jit(functools.partial(fn, _thawed(frozen)))


def _key(**parts) -> str:
  """`e1/s_8/xi2_0/eta_l_0.1/...`: names TensorBoard accepts (no '=' or ',')."""
  return "e1/" + "/".join(f"{name}_{_fmt(value)}" for name, value in parts.items())


def _fmt(value) -> str:
  return value if isinstance(value, str) else f"{float(value):g}"


def regression_teacher_evaluate(config, designs, state) -> dict[str, float]:
  """`e1/s=../eta_l=../eta_t=../teacher_er{,_std,_pred,_relayed}` for the whole grid."""
  r = config.regression
  sim, pred, relayed = jax.device_get(_risk_fn(_frozen(config), "teacher")(designs, state["coef"]))
  out = {}
  for i, s in enumerate(r.separations):
    for j, eta_l in enumerate(r.eta_labelled):
      for k, label in enumerate(ETA_T_LABELS):
        prefix = _key(s=s, eta_l=eta_l, eta_t=label)
        out[f"{prefix}/teacher_er"] = float(sim[i, j, :, k].mean())
        out[f"{prefix}/teacher_er_std"] = float(sim[i, j, :, k].std())
        out[f"{prefix}/teacher_er_pred"] = float(pred[i, j, k])
        out[f"{prefix}/teacher_er_relayed"] = float(relayed[i, j, k])
  out["e1/risk_unit"] = r.sigma_y**2 * r.d_z / (r.num_labelled - _teacher_dim(config) - 1)
  return out


def _teacher_dim(config) -> int:
  return config.regression.teacher_group_dim * config.regression.d_z


def regression_student_evaluate(config, designs, state, inputs) -> dict[str, float]:
  """Student risks and the W2S gain G = ER_T - ER_S, simulated (mean, std over seeds), by the Sec. 2.1
  predictor and by the relayed Thm 1 - Thm 2, for every grid cell and eta_t."""
  r = config.regression
  frozen = _frozen(config)
  t_sim, t_pred, t_rel = _risk_fn(frozen, "teacher")(designs, inputs["teacher"]["coef"])
  s_sim, s_pred, s_rel = _risk_fn(frozen, "student")(designs, state["coef"])
  t_sim, t_pred, t_rel, s_sim, s_pred, s_rel = jax.device_get(
    (t_sim, t_pred, t_rel, s_sim, s_pred, s_rel)
  )
  out = {}
  for i, s in enumerate(r.separations):
    for u, eta_u in enumerate(r.eta_unlabelled):
      for x, xi2 in enumerate(r.similarities):
        for j, eta_l in enumerate(r.eta_labelled):
          for k, label in enumerate(ETA_T_LABELS):
            prefix = _key(s=s, xi2=xi2, eta_l=eta_l, eta_u=eta_u, eta_t=label)
            gain = t_sim[i, j, :, k] - s_sim[i, u, x, :, j, k]
            out[f"{prefix}/student_er"] = float(s_sim[i, u, x, :, j, k].mean())
            out[f"{prefix}/student_er_pred"] = float(s_pred[i, u, x, j, k])
            out[f"{prefix}/gain"] = float(gain.mean())
            out[f"{prefix}/gain_std"] = float(gain.std())
            out[f"{prefix}/gain_pred"] = float(t_pred[i, j, k] - s_pred[i, u, x, j, k])
            out[f"{prefix}/gain_relayed"] = float(t_rel[i, j, k] - s_rel[i, u, x, j, k])
  return out


def regression_phases(config) -> list[Phase]:
  _limit_blas_threads()
  designs = regression_designs(config)
  return [
    Phase(
      name="teacher",
      num_steps=0,
      init=functools.partial(regression_teacher_init, config, designs),
      evaluate=lambda state, rng, inputs: regression_teacher_evaluate(config, designs, state),
    ),
    Phase(
      name="pseudolabels",
      num_steps=0,
      init=functools.partial(regression_pseudolabel_init, config, designs),
    ),
    Phase(
      name="student",
      num_steps=0,
      init=functools.partial(regression_student_init, config, designs),
      evaluate=lambda state, rng, inputs: regression_student_evaluate(
        config, designs, state, inputs
      ),
    ),
  ]


# ---------------------------------------------------------------------------------------------------
# Classification data: E2, digits with a stripe, tfds pools. Arrays are (num, seeds, ...).
# ---------------------------------------------------------------------------------------------------

SPLITS = ("labelled", "unlabelled", "heldout", "test")
PSEUDO = ("unlabelled", "heldout")  # the splits the teacher pseudolabels


@dataclasses.dataclass(frozen=True)
class GroupData:
  """Per split {"x" (num, R, D) float32, "label" (num, R), "attribute" (num, R)}, and for the image
  tasks the backbone's pre-training set {"x" (num, D), "label" (num,)} with its test split."""

  splits: Mapping[str, Mapping[str, np.ndarray]]
  pretrain: Mapping[str, np.ndarray] | None = None
  pretrain_test: Mapping[str, np.ndarray] | None = None
  e2_design: spurious_data.ClassificationDesign | None = None


def _stack_seeds(per_seed: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {name: np.stack([d[name] for d in per_seed], axis=1) for name in per_seed[0]}


def _sizes(config) -> dict[str, tuple[int, float]]:
  g = config.groups
  return {
    "labelled": (g.num_labelled, g.eta_labelled),
    "unlabelled": (g.num_unlabelled, g.eta_unlabelled),
    "heldout": (g.num_heldout, g.eta_unlabelled),
  }


def e2_data(config) -> GroupData:
  """E2 (spec Sec. 5): per seed, labelled (eta_l), unlabelled and held-out (eta_u), balanced test."""
  c = config.classification
  design = spurious_data.classification_design(
    np.random.default_rng([config.seed, 99]),
    c.core_dim,
    c.spurious_dim,
    c.noise_dim,
    c.core_norm,
    c.spurious_norm,
    c.weak_dim,
    c.weak_core_scale,
    c.strong_spurious_dim,
  )
  per_split = {name: [] for name in SPLITS}
  for seed in range(config.num_seeds):
    rng = np.random.default_rng([config.seed, seed])
    for name, (num, eta) in _sizes(config).items():
      per_split[name].append(spurious_data.sample_classification(rng, design, num, eta))
    per_split["test"].append(
      spurious_data.balanced_classification(rng, design, config.groups.num_test)
    )
  return GroupData({k: _stack_seeds(v) for k, v in per_split.items()}, e2_design=design)


def _digit_inputs(images_, attribute, intensity) -> np.ndarray:
  striped = spurious_data.inject_stripe(images_, attribute, intensity)
  return (striped / images.DIGITS_LEVELS).reshape(len(striped), -1).astype(np.float32)


def digits_data(config) -> GroupData:
  """Digits 5-9 with a stripe (label = odd digit); the backbone pre-trains on digits 0-4."""
  d = config.digits
  splits = images.digits(images.DIGITS_LEVELS, config.seed)
  train, test = splits["train"], splits["test"]
  task = lambda labels: np.isin(labels, d.task_digits)
  parity = lambda labels: (labels % 2).astype(np.int32)
  pool_images, pool_labels = (
    train["image"][task(train["label"])],
    parity(train["label"][task(train["label"])]),
  )
  per_split = {name: [] for name in SPLITS[:3]}
  for seed in range(config.num_seeds):
    rng = np.random.default_rng([config.seed, seed])
    indices = spurious_data.group_split_indices(
      rng,
      np.zeros(len(pool_labels), bool),
      {n: (num, 0.0) for n, (num, _) in _sizes(config).items()},
    )
    for name, (num, eta) in _sizes(config).items():
      label = pool_labels[indices[name]]
      minority = spurious_data.minority_mask(rng, num, eta)
      attribute = np.where(minority, 1 - label, label).astype(np.int32)
      x = _digit_inputs(pool_images[indices[name]], attribute, d.stripe_intensity)
      per_split[name].append({"x": x, "label": label, "attribute": attribute})
  test_images, test_labels = (
    test["image"][task(test["label"])],
    parity(test["label"][task(test["label"])]),
  )
  test_split = _balanced_stripes(test_images, test_labels, d.stripe_intensity, config.num_seeds)
  pretrain_classes = lambda labels: np.isin(labels, d.pretrain_digits)
  pretrain = {
    "x": (train["image"][pretrain_classes(train["label"])] / images.DIGITS_LEVELS).reshape(-1, 64),
    "label": np.searchsorted(d.pretrain_digits, train["label"][pretrain_classes(train["label"])]),
  }
  pretrain_test = {
    "x": (test["image"][pretrain_classes(test["label"])] / images.DIGITS_LEVELS).reshape(-1, 64),
    "label": np.searchsorted(d.pretrain_digits, test["label"][pretrain_classes(test["label"])]),
  }
  stacked = {k: _stack_seeds(v) for k, v in per_split.items()}
  stacked["test"] = test_split
  return GroupData(stacked, _as_float(pretrain), _as_float(pretrain_test))


def _as_float(split):
  return {"x": split["x"].astype(np.float32), "label": split["label"].astype(np.int32)}


def _balanced_stripes(test_images, labels, intensity, num_seeds) -> dict[str, np.ndarray]:
  """Every test image once with each attribute: the (y, a) groups are balanced within each y."""
  attribute = np.concatenate([np.zeros(len(labels), np.int32), np.ones(len(labels), np.int32)])
  both = np.concatenate([test_images, test_images])
  split = {
    "x": _digit_inputs(both, attribute, intensity),
    "label": np.concatenate([labels, labels]).astype(np.int32),
    "attribute": attribute,
  }
  return {k: np.repeat(v[:, None], num_seeds, axis=1) for k, v in split.items()}


def _tfds_pool(config, split: str, max_examples: int):
  t = config.tfds
  pool = spurious_data.tfds_group_pool(
    t.name,
    split,
    t.label_key,
    t.attribute_key,
    tuple(t.pretrain_keys),
    t.image_size,
    max_examples,
    t.data_dir or None,
  )
  if t.flip_attribute:
    pool["attribute"] = 1 - pool["attribute"]
  pool["x"] = (pool.pop("image").reshape(len(pool["label"]), -1) / 255.0).astype(np.float32)
  return pool


def tfds_data(config) -> GroupData:
  """A tfds dataset with a natural spurious attribute; the minority has attribute != label."""
  t = config.tfds
  train = _tfds_pool(config, t.train_split, t.max_train_examples)
  test = _tfds_pool(config, t.test_split, t.max_test_examples)
  per_split = {name: [] for name in SPLITS[:3]}
  for seed in range(config.num_seeds):
    rng = np.random.default_rng([config.seed, seed])
    indices = spurious_data.group_split_indices(
      rng, train["label"] != train["attribute"], _sizes(config)
    )
    for name in per_split:
      per_split[name].append({k: train[k][indices[name]] for k in ("x", "label", "attribute")})
  stacked = {k: _stack_seeds(v) for k, v in per_split.items()}
  stacked["test"] = _balanced_subsample(test, config.groups.num_test, config.seed, config.num_seeds)
  pretrain = {"x": train["x"], "label": train["pretrain_label"]}
  return GroupData(stacked, pretrain, {"x": test["x"], "label": test["pretrain_label"]})


def _balanced_subsample(pool, num: int, seed: int, num_seeds: int) -> dict[str, np.ndarray]:
  """Up to num / 4 test points of each (y, a) group."""
  rng = np.random.default_rng([seed, 12345])
  group = w2s_group_ids(pool["label"], pool["attribute"])
  keep = np.concatenate(
    [rng.permutation(np.flatnonzero(group == g))[: num // NUM_GROUPS] for g in range(NUM_GROUPS)]
  )
  return {
    k: np.repeat(pool[k][keep][:, None], num_seeds, axis=1) for k in ("x", "label", "attribute")
  }


def w2s_group_ids(label, attribute):
  return np.asarray(label) * 2 + np.asarray(attribute)


@functools.lru_cache(maxsize=4)
def _group_data(frozen: str) -> GroupData:
  config = _thawed(frozen)
  return {"classification": e2_data, "digits": digits_data, "tfds": tfds_data}[config.task](config)


def group_data(config) -> GroupData:
  return _group_data(_frozen(config))


# ---------------------------------------------------------------------------------------------------
# Models: weak and strong views, heads vmapped over seeds (and over the (p, q) grid)
# ---------------------------------------------------------------------------------------------------


def teacher_model(config) -> MLP:
  return MLP(hidden=tuple(config.teacher.hidden), num_outputs=NUM_CLASSES)


def head_model() -> MLP:
  return MLP(hidden=(), num_outputs=NUM_CLASSES)


def backbone_model(config, num_classes: int) -> MLP:
  return MLP(hidden=tuple(config.pretrain.hidden), num_outputs=num_classes)


def _flat_apply(fn, x: jax.Array) -> jax.Array:
  """`fn` on (num, R, D) inputs flattened to (num R, D), reshaped back."""
  out = fn(x.reshape(-1, x.shape[-1]))
  return out.reshape(*x.shape[:2], out.shape[-1])


def weak_view(config, data: GroupData, x) -> jax.Array:
  """What the teacher sees: E2's weak projection (`core.w2s.e2_weak_features`); for digits the image
  average-pooled by `digits.teacher_pool` (a low-resolution view: the stripe survives, strokes blur);
  for tfds the pixels."""
  if config.task == "classification":
    return _e2_view(data.e2_design, "weak", jnp.asarray(x))
  if config.task == "digits" and config.digits.teacher_pool > 1:
    return _pooled(config.digits.teacher_pool, jnp.asarray(x))
  return jnp.asarray(x)


@functools.partial(jax.jit, static_argnums=0)
def _pooled(pool: int, x: jax.Array) -> jax.Array:
  """(num, R, 64) digits -> (num, R, (8 / pool)^2) block means."""
  side = 8 // pool
  blocks = x.reshape(*x.shape[:2], side, pool, side, pool)
  return blocks.mean(axis=(3, 5)).reshape(*x.shape[:2], side * side)


def strong_view(config, data: GroupData, x, inputs) -> jax.Array:
  """What the student sees: E2's strong features, else the frozen pre-trained backbone's features."""
  if config.task == "classification":
    return _e2_view(data.e2_design, "strong", jnp.asarray(x))
  net = backbone_model(config, _num_pretrain_classes(data))
  return _backbone_view(net, inputs["pretrain"], jnp.asarray(x))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _e2_view(design, kind: str, x: jax.Array) -> jax.Array:
  fn = {"weak": w2s.e2_weak_features, "strong": w2s.e2_strong_features}[kind]
  return _flat_apply(lambda v: fn(v, design), x)


@functools.partial(jax.jit, static_argnums=0)
def _backbone_view(net: MLP, params, x: jax.Array) -> jax.Array:
  return _flat_apply(lambda v: net.apply(params, v, method=MLP.features), x)


def _num_pretrain_classes(data: GroupData) -> int:
  return int(max(data.pretrain["label"].max(), data.pretrain_test["label"].max())) + 1


def apply_per_seed(model: MLP, params, x: jax.Array) -> jax.Array:
  """Logits (num, R, C) of per-seed parameters (leading axis R) on inputs (num, R, D).

  A linear head is one einsum (2x faster than vmapping `apply` for the (p, q) grid on CPU)."""
  if not model.hidden:
    readout = params["params"]["readout"]
    return jnp.einsum("nrd,rdc->nrc", x, readout["kernel"]) + readout["bias"]
  return jax.vmap(model.apply, in_axes=(0, 1), out_axes=1)(params, x)


logits_per_seed = jax.jit(
  lambda model, params, x: apply_per_seed(model, params, x), static_argnums=0
)


def init_per_seed(model: MLP, rng, num_seeds: int, dim: int):
  keys = jax.random.split(rng, num_seeds)
  return jax.vmap(lambda k: model.init(k, jnp.zeros((1, dim))))(keys)


# ---------------------------------------------------------------------------------------------------
# Training steps (pure; full batch unless config.head_batch_size > 0)
# ---------------------------------------------------------------------------------------------------


class FullBatch:
  """The whole set as every step's batch (spec: full-batch Adam); rows split across processes."""

  def __init__(self, arrays: Mapping[str, np.ndarray]):
    self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
    self.global_batch_size = len(next(iter(self.arrays.values())))

  def batch(self, step: int, process_index: int = 0, process_count: int = 1):
    del step
    if self.global_batch_size % process_count:
      raise ValueError(f"{self.global_batch_size} rows do not split over {process_count} processes")
    local = self.global_batch_size // process_count
    return {
      k: v[process_index * local : (process_index + 1) * local] for k, v in self.arrays.items()
    }


def head_source(config, arrays):
  from core.data import batching

  num = len(next(iter(arrays.values())))
  if config.head_batch_size and config.head_batch_size < num:
    return batching.from_arrays(arrays, config.head_batch_size, config.seed)
  return FullBatch(arrays)


def head_step(model: MLP, optimizer, state, batch, rng):
  """One Adam step on the per-seed mean cross-entropy (summed over seeds: independent updates)."""
  del rng

  def loss_fn(params):
    logits = apply_per_seed(model, params, batch["x"])
    per_seed = jnp.mean(w2s.cross_entropy(logits, batch["target"]), axis=0)
    return per_seed.sum(), per_seed

  (_, per_seed), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  return {"params": params, "opt_state": opt_state}, {"loss": per_seed.mean()}


def enhanced_step(model: MLP, optimizer, grid, state, batch, rng):
  """One Adam step for every (p, q) head: GCE(q) on the p-subset (mask), per-seed masked mean."""
  del rng
  q, p_index = jnp.asarray(grid["q"]), jnp.asarray(grid["p_index"])

  def per_grid_point(params, q_g, p_g):
    logits = apply_per_seed(model, params, batch["x"])
    losses = w2s.generalized_cross_entropy(logits, batch["target"], q_g)  # (num, R)
    mask = batch["mask"][:, :, p_g]
    return jnp.sum(mask * losses, axis=0) / jnp.maximum(jnp.sum(mask, axis=0), 1.0)

  def loss_fn(params):
    per_point = jax.vmap(per_grid_point)(params, q, p_index)  # (G, R)
    return per_point.sum(), per_point

  (_, per_point), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  return {"params": params, "opt_state": opt_state}, {"loss": per_point.mean()}


def pretrain_step(model: MLP, optimizer, state, batch, rng):
  del rng

  def loss_fn(params):
    logits = model.apply(params, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, {
    "loss": loss
  }


def _train_state(params, optimizer):
  return {"params": params, "opt_state": optimizer.init(params)}


# ---------------------------------------------------------------------------------------------------
# Evaluation: group metrics per seed
# ---------------------------------------------------------------------------------------------------


def group_metrics(logits, split) -> dict[str, np.ndarray]:
  """Per seed: average (mean over groups) and worst-group accuracy, and the 4 group accuracies."""
  per_group = np.asarray(
    _group_accuracies(logits, jnp.asarray(split["label"]), jnp.asarray(split["attribute"]))
  )
  return {
    "average": np.nanmean(per_group, axis=1),
    "worst": np.nanmin(per_group, axis=1),
    "groups": per_group,
  }


@jax.jit
def _group_accuracies(logits, label, attribute) -> jax.Array:
  """(R, 4) accuracies of the (y, a) groups, per seed (axis 1 of the inputs)."""
  predictions, groups = jnp.argmax(logits, axis=-1), w2s.group_ids(label, attribute)
  per_seed = lambda p, y, g: w2s.group_accuracies(p, y, g, NUM_GROUPS)
  return jax.vmap(per_seed, in_axes=(1, 1, 1))(predictions, label, groups)


def _report(name: str, metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
  out = {
    f"{name}_accuracy": float(metrics["average"].mean()),
    f"{name}_accuracy_std": float(metrics["average"].std()),
    f"worst_group_{name}_accuracy": float(metrics["worst"].mean()),
    f"worst_group_{name}_accuracy_std": float(metrics["worst"].std()),
  }
  for g in range(NUM_GROUPS):
    out[f"{name}_group_accuracy/y{g // 2}_a{g % 2}"] = float(np.nanmean(metrics["groups"][:, g]))
  return out


def teacher_test_metrics(config, data, inputs):
  x = weak_view(config, data, data.splits["test"]["x"])
  return group_metrics(
    logits_per_seed(teacher_model(config), inputs["teacher"], x), data.splits["test"]
  )


def student_test_metrics(config, data, params, inputs):
  x = strong_view(config, data, data.splits["test"]["x"], inputs)
  return group_metrics(logits_per_seed(head_model(), params, x), data.splits["test"])


# ---------------------------------------------------------------------------------------------------
# Classification phases
# ---------------------------------------------------------------------------------------------------


def _adam(learning_rate: float):
  return optax.adam(learning_rate)


def pretrain_phase(config, data: GroupData) -> Phase:
  """The strong backbone, trained here on a different task (digits 0-4 / other attributes)."""
  num_classes = _num_pretrain_classes(data)
  net, optimizer = backbone_model(config, num_classes), _adam(config.pretrain.learning_rate)
  dim = data.pretrain["x"].shape[1]

  def evaluate(state, rng, inputs):
    logits = net.apply(state["params"], jnp.asarray(data.pretrain_test["x"]))
    return {
      "pretrain_accuracy": float(jnp.mean(jnp.argmax(logits, -1) == data.pretrain_test["label"]))
    }

  from core.data import batching

  return Phase(
    name="pretrain",
    num_steps=config.pretrain.steps,
    init=lambda rng, inputs: _train_state(net.init(rng, jnp.zeros((1, dim))), optimizer),
    step=functools.partial(pretrain_step, net, optimizer),
    data=lambda inputs: batching.from_arrays(
      data.pretrain, config.pretrain.batch_size, config.seed
    ),
    evaluate=evaluate,
    outputs=lambda state, inputs: state["params"],
  )


def teacher_phase(config, data: GroupData) -> Phase:
  """Weak teacher: cross-entropy on the n labelled examples (spec Sec. 3 step 1)."""
  net, optimizer = teacher_model(config), _adam(config.teacher.learning_rate)
  labelled = data.splits["labelled"]
  x = np.asarray(weak_view(config, data, labelled["x"]))
  target = np.asarray(jax.nn.one_hot(labelled["label"], NUM_CLASSES))

  def evaluate(state, rng, inputs):
    return _report("teacher", teacher_test_metrics(config, data, {"teacher": state["params"]}))

  return Phase(
    name="teacher",
    num_steps=config.teacher.steps,
    init=lambda rng, inputs: _train_state(
      init_per_seed(net, rng, config.num_seeds, x.shape[-1]), optimizer
    ),
    step=functools.partial(head_step, net, optimizer),
    data=lambda inputs: head_source(config, {"x": x, "target": target}),
    evaluate=evaluate,
    outputs=lambda state, inputs: state["params"],
  )


def pseudolabel_targets(config, logits: jax.Array) -> jax.Array:
  """Hard (one-hot argmax) or soft (softmax) pseudolabels (spec Sec. 3 step 2)."""
  if config.pseudolabels == "hard":
    return jax.nn.one_hot(jnp.argmax(logits, -1), NUM_CLASSES)
  return jax.nn.softmax(logits)


def pseudolabel_phase(config, data: GroupData) -> Phase:
  """Teacher pseudolabels on the unlabelled and held-out splits (num_steps = 0)."""
  net = teacher_model(config)

  def init(rng, inputs):
    params, splits = _runtime((inputs["teacher"], {n: data.splits[n]["x"] for n in PSEUDO}), rng)
    return {
      name: pseudolabel_targets(
        config, apply_per_seed(net, params, weak_view(config, data, splits[name]))
      )
      for name in PSEUDO
    }

  def evaluate(state, rng, inputs):
    split = data.splits["unlabelled"]
    correct = np.asarray(jnp.argmax(state["unlabelled"], -1)) == split["label"]
    minority = split["label"] != split["attribute"]
    return {
      "pseudolabel_accuracy": float(correct.mean()),
      "pseudolabel_accuracy_minority": float(correct[minority].mean())
      if minority.any()
      else math.nan,
      "pseudolabel_accuracy_majority": float(correct[~minority].mean()),
      "unlabelled_minority_fraction": float(minority.mean()),
    }

  return Phase(name="pseudolabels", num_steps=0, init=init, evaluate=evaluate)


def student_phase(config, data: GroupData) -> Phase:
  """Vanilla W2S: a head on frozen strong features fit to the pseudolabels (spec Sec. 3 step 3)."""
  net, optimizer = head_model(), _adam(config.student.learning_rate)

  def arrays(inputs):
    x = strong_view(config, data, data.splits["unlabelled"]["x"], inputs)
    return {"x": np.asarray(x), "target": np.asarray(inputs["pseudolabels"]["unlabelled"])}

  def evaluate(state, rng, inputs):
    student = student_test_metrics(config, data, state["params"], inputs)
    teacher = teacher_test_metrics(config, data, inputs)
    out = _report("w2s", student)
    out["w2s_gain"] = float((student["average"] - teacher["average"]).mean())
    out["w2s_gain_std"] = float((student["average"] - teacher["average"]).std())
    out["worst_group_w2s_gain"] = float((student["worst"] - teacher["worst"]).mean())
    return out

  return Phase(
    name="student",
    num_steps=config.student.steps,
    init=lambda rng, inputs: _train_state(
      init_per_seed(net, rng, config.num_seeds, _strong_dim(config, data, inputs)), optimizer
    ),
    step=functools.partial(head_step, net, optimizer),
    data=lambda inputs: head_source(config, arrays(inputs)),
    evaluate=evaluate,
    outputs=lambda state, inputs: state["params"],
  )


def _strong_dim(config, data, inputs) -> int:
  return strong_view(config, data, data.splits["test"]["x"][:1], inputs).shape[-1]


def enhanced_grid(config) -> dict[str, np.ndarray]:
  """The (p, q) grid, flattened: p_index[g] into config.enhanced.p_grid, q[g]."""
  p_grid, q_grid = config.enhanced.p_grid, config.enhanced.q_grid
  p_index, q = np.meshgrid(np.arange(len(p_grid)), np.asarray(q_grid, np.float32), indexing="ij")
  return {
    "p_index": p_index.reshape(-1),
    "q": q.reshape(-1),
    "p": np.asarray(p_grid)[p_index.reshape(-1)],
  }


def confident_masks(config, data, inputs) -> np.ndarray:
  """(N, R, P): 1 on the ceil(pN) lowest-entropy unlabelled points of the W2S student, per seed and p."""
  x = strong_view(config, data, data.splits["unlabelled"]["x"], inputs)
  return np.asarray(_entropy_masks(inputs["student"], x, tuple(config.enhanced.p_grid)))


@functools.partial(jax.jit, static_argnums=2)
def _entropy_masks(params, x, p_grid: tuple[float, ...]) -> jax.Array:
  entropy = w2s.predictive_entropy(apply_per_seed(head_model(), params, x))  # (N, R)
  per_seed = lambda h, p: w2s.top_p_mask(h, p)
  return jnp.stack(
    [jax.vmap(functools.partial(per_seed, p=p), in_axes=1, out_axes=1)(entropy) for p in p_grid],
    axis=-1,
  )


def enhanced_phase(config, data: GroupData) -> Phase:
  """Enhanced-W2S over the (p, q) grid, one vmapped axis (spec Sec. 3 steps 4-6)."""
  net, optimizer, grid = head_model(), _adam(config.enhanced.learning_rate), enhanced_grid(config)
  num_grid = len(grid["q"])

  def init(rng, inputs):
    if config.enhanced.init == "continued":
      params = jax.tree.map(
        lambda leaf: jnp.broadcast_to(leaf, (num_grid, *leaf.shape)), inputs["student"]
      )
    else:
      dim = _strong_dim(config, data, inputs)
      keys = jax.random.split(rng, num_grid)
      params = jax.vmap(lambda k: init_per_seed(net, k, config.num_seeds, dim))(keys)
    return _train_state(params, optimizer)

  def arrays(inputs):
    x = strong_view(config, data, data.splits["unlabelled"]["x"], inputs)
    return {
      "x": np.asarray(x),
      "target": np.asarray(inputs["pseudolabels"]["unlabelled"]),
      "mask": confident_masks(config, data, inputs),
    }

  return Phase(
    name="enhanced",
    num_steps=config.enhanced.steps,
    init=init,
    step=functools.partial(enhanced_step, net, optimizer, grid),
    data=lambda inputs: head_source(config, arrays(inputs)),
    evaluate=lambda state, rng, inputs: enhanced_evaluate(config, data, grid, state, inputs),
  )


def enhanced_evaluate(config, data, grid, state, inputs) -> dict[str, float]:
  """Test metrics of the (p, q) chosen per seed by `heldout_agreement`; every grid point's (the (p, q)
  sensitivity reviewer 1 asks for) and the oracle (best by test accuracy, a diagnostic only)."""
  net, params = head_model(), state["params"]
  test = strong_view(config, data, data.splits["test"]["x"], inputs)
  per_grid = [
    group_metrics(
      logits_per_seed(net, jax.tree.map(lambda leaf, g=g: leaf[g], params), test),
      data.splits["test"],
    )
    for g in range(len(grid["q"]))
  ]
  average = np.stack([m["average"] for m in per_grid])  # (G, R)
  worst = np.stack([m["worst"] for m in per_grid])
  groups = np.stack([m["groups"] for m in per_grid])
  seeds = np.arange(config.num_seeds)
  w2s_metrics = student_test_metrics(config, data, inputs["student"], inputs)
  score = heldout_agreement(config, data, params, inputs)  # (G, R)
  chosen = np.argmax(score, axis=0)  # first maximum, per seed
  picked = {
    "average": average[chosen, seeds],
    "worst": worst[chosen, seeds],
    "groups": groups[chosen, seeds],
  }
  out = _report("enhanced", picked)
  out["enhanced_gain"] = float((picked["average"] - w2s_metrics["average"]).mean())
  out["worst_group_enhanced_gain"] = float((picked["worst"] - w2s_metrics["worst"]).mean())
  out["enhanced_selected_p"] = float(grid["p"][chosen].mean())
  out["enhanced_selected_q"] = float(grid["q"][chosen].mean())
  oracle = average.argmax(0)
  out["enhanced_oracle_accuracy"] = float(average[oracle, seeds].mean())
  out["worst_group_enhanced_oracle_accuracy"] = float(worst[oracle, seeds].mean())
  for g in range(len(grid["q"])):
    tag = f"p_{grid['p'][g]:g}_q_{grid['q'][g]:g}"
    out[f"enhanced_grid_accuracy/{tag}"] = float(average[g].mean())
    out[f"worst_group_enhanced_grid_accuracy/{tag}"] = float(worst[g].mean())
    out[f"enhanced_grid_heldout_agreement/{tag}"] = float(score[g].mean())
  out.update(subset_diagnostics(config, data, inputs))
  return out


def heldout_agreement(config, data, params, inputs) -> np.ndarray:
  """(G, R) agreement of each grid head with the teacher's pseudolabels on the held-out split (spec
  Sec. 3 step 6): no group label and no true label is read."""
  heldout = strong_view(config, data, data.splits["heldout"]["x"], inputs)
  teacher_labels = jnp.argmax(inputs["pseudolabels"]["heldout"], -1)  # (H, R)
  return np.asarray(_agreement(params, heldout, teacher_labels))


@jax.jit
def _agreement(params, x, labels) -> jax.Array:
  """(G, R) fraction of `x` on which each grid head's argmax equals `labels` (N, R)."""
  predict = lambda p: jnp.argmax(apply_per_seed(head_model(), p, x), -1)
  return jax.vmap(lambda p: jnp.mean(predict(p) == labels, axis=0))(params)


def subset_diagnostics(config, data, inputs) -> dict[str, float]:
  """Minority fraction and pseudolabel accuracy inside each p-subset (uses group labels; report only)."""
  masks = confident_masks(config, data, inputs).astype(bool)  # (N, R, P)
  split = data.splits["unlabelled"]
  minority = split["label"] != split["attribute"]
  correct = np.asarray(jnp.argmax(inputs["pseudolabels"]["unlabelled"], -1)) == split["label"]
  out = {}
  for i, p in enumerate(config.enhanced.p_grid):
    mask = masks[:, :, i]
    out[f"subset_minority_fraction/p_{p:g}"] = float(minority[mask].mean())
    out[f"subset_pseudolabel_accuracy/p_{p:g}"] = float(correct[mask].mean())
  return out


def classification_phases(config) -> list[Phase]:
  data = group_data(config)
  phases = [pretrain_phase(config, data)] if config.task in ("digits", "tfds") else []
  return phases + [
    teacher_phase(config, data),
    pseudolabel_phase(config, data),
    student_phase(config, data),
    enhanced_phase(config, data),
  ]


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  if config.task == "regression":
    return regression_phases(config)
  return classification_phases(config)


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


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
    f"the Sec. 2.1 predictor needs n > d_T + 1 = {d_t + 1} (OLS regime), got {r.num_labelled}",
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
    require_positive_int(config, "pretrain.steps")
    require_positive_int(config, "pretrain.batch_size")
  if config.task == "digits":
    _validate_digits(config)


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
    not set(d.task_digits) & set(d.pretrain_digits),
    "digits.pretrain_digits",
    "must not overlap digits.task_digits (the backbone's task must differ)",
  )
  require(
    list(d.pretrain_digits) == sorted(d.pretrain_digits), "digits.pretrain_digits", "must be sorted"
  )
  require(
    d.teacher_pool in (1, 2, 4, 8), "digits.teacher_pool", f"must divide 8, got {d.teacher_pool}"
  )


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "task", TASKS)
  require_positive_int(config, "num_seeds")
  if config.task == "regression":
    _validate_regression(config)
  else:
    _validate_classification(config)


# ---------------------------------------------------------------------------------------------------
# Study: E1 (one vectorised arm), E2 and the digits variant per (eta_l, eta_u) setting
# ---------------------------------------------------------------------------------------------------


def _setting_name(task: str, eta_l: float, eta_u: float) -> str:
  return f"{task}_l{eta_l:g}_u{eta_u:g}"


def study_arms(config: ml_collections.ConfigDict):
  """`e1` (the regression grid) if `study.regression`, then one arm per (eta_l, eta_u) of
  `study.settings` for each task of `study.tasks`, with that task's `study.overrides` applied."""
  arms = []
  if config.study.regression:
    arm = ml_collections.ConfigDict(config.to_dict())
    arm.task = "regression"
    arms.append(("e1", arm))
  for task in config.study.tasks:
    for eta_l, eta_u in config.study.settings:
      arm = ml_collections.ConfigDict(config.to_dict())
      arm.task = task
      if task in config.study.overrides:
        arm.update(config.study.overrides[task].to_dict())
      arm.groups.eta_labelled, arm.groups.eta_unlabelled = eta_l, eta_u
      arms.append((_setting_name(task, eta_l, eta_u), arm))
  return arms


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _e1_value(results, quantity, **cell) -> float:
  return results[f"{_key(**cell)}/{quantity}"]


def quadratic_fit(shift_sq: np.ndarray, gain: np.ndarray) -> tuple[float, float, float]:
  """Least squares gain = a + b (eta_u - eta_l)^2; returns (a, b, R^2)."""
  design = np.stack([np.ones_like(shift_sq), shift_sq], axis=1)
  (a, b), *_ = np.linalg.lstsq(design, gain, rcond=None)
  residual = gain - design @ np.array([a, b])
  total = np.sum((gain - gain.mean()) ** 2)
  return float(a), float(b), float(1.0 - np.sum(residual**2) / total) if total > 0 else 1.0


def e1_curves(config, results) -> list[dict]:
  """Per (s, ||Xi||^2, eta_l) at eta_t = eta_l: gains over eta_u (sim, std, pred, relayed) in units
  of c d_z, the quadratic fit in (eta_u - eta_l)^2 and the relative errors of the predictor."""
  r, unit = config.regression, results["e1/risk_unit"]
  curves = []
  for s in r.separations:
    for xi2 in r.similarities:
      for eta_l in r.eta_labelled:
        cells = [dict(s=s, xi2=xi2, eta_l=eta_l, eta_u=u, eta_t="eta_l") for u in r.eta_unlabelled]
        get = lambda q, cells=cells: np.array([_e1_value(results, q, **c) for c in cells])
        shift_sq = (np.asarray(r.eta_unlabelled) - eta_l) ** 2
        gain = get("gain") / unit
        a, b, r2 = quadratic_fit(shift_sq, gain)
        er_sim, er_pred = get("student_er"), get("student_er_pred")
        curves.append(
          {
            "s": s,
            "xi2": xi2,
            "eta_l": eta_l,
            "eta_u": np.asarray(r.eta_unlabelled),
            "shift_sq": shift_sq,
            "gain": gain,
            "gain_std": get("gain_std") / unit,
            "gain_pred": get("gain_pred") / unit,
            "gain_relayed": get("gain_relayed") / unit,
            "fit": (a, b, r2),
            "student_rel_error": np.abs(er_sim - er_pred) / er_pred,
          }
        )
  return curves


def _e1_teacher_rel_errors(config, results) -> np.ndarray:
  r = config.regression
  errors = []
  for s in r.separations:
    for eta_l in r.eta_labelled:
      for label in ETA_T_LABELS:
        sim = _e1_value(results, "teacher_er", s=s, eta_l=eta_l, eta_t=label)
        pred = _e1_value(results, "teacher_er_pred", s=s, eta_l=eta_l, eta_t=label)
        errors.append(abs(sim - pred) / pred)
  return np.asarray(errors)


def e1_summary(config, results) -> dict:
  curves = e1_curves(config, results)
  matched = [c["gain"][np.argmin(c["shift_sq"])] for c in curves if c["shift_sq"].min() < 1e-12]
  xi0 = [c for c in curves if c["xi2"] == 0]
  student_err = np.concatenate([c["student_rel_error"] for c in curves])
  teacher_err = _e1_teacher_rel_errors(config, results)
  failures = lambda key: int(sum((c[key] < 0).sum() for c in curves))
  peak_offset = lambda cs: float(
    np.mean([abs(c["eta_u"][np.argmax(c["gain"])] - c["eta_l"]) for c in cs])
  )
  curvature_grows = all(
    np.all(np.diff([c["fit"][1] for c in xi0 if c["eta_l"] == eta_l]) < 0)
    for eta_l in config.regression.eta_labelled
  )
  return {
    "e1_min_gain_matched": float(min(matched)),
    "e1_gain_nonnegative_when_matched": bool(min(matched) >= 0),
    "e1_gain_falls_with_shift_xi0": bool(all(c["fit"][1] < 0 for c in xi0)),
    "e1_quadratic_r2_min_xi0": float(min(c["fit"][2] for c in xi0)),
    "e1_quadratic_r2_median_all": float(np.median([c["fit"][2] for c in curves])),
    "e1_curvature_grows_with_separation_xi0": bool(curvature_grows),
    "e1_peak_offset_xi0": peak_offset(xi0),
    "e1_peak_offset_xi_positive": peak_offset([c for c in curves if c["xi2"] > 0]),
    "e1_failures_simulated": failures("gain"),
    "e1_failures_predicted": failures("gain_pred"),
    "e1_failures_relayed": failures("gain_relayed"),
    "e1_num_cells": int(sum(len(c["gain"]) for c in curves)),
    "e1_student_rel_error_median": float(np.median(student_err)),
    "e1_student_rel_error_p90": float(np.quantile(student_err, 0.9)),
    "e1_student_within_10pct": float(np.mean(student_err < 0.1)),
    "e1_teacher_rel_error_median": float(np.median(teacher_err)),
    "e1_teacher_rel_error_max": float(teacher_err.max()),
  }


def _classification_rows(results) -> list[dict]:
  rows = []
  for arm, res in results.items():
    if arm == "e1":
      continue
    task, l_part, u_part = arm.rsplit("_", 2)
    eta_l, eta_u = float(l_part[1:]), float(u_part[1:])
    w2s_acc, enhanced = res["w2s_accuracy"], res["enhanced_accuracy"]
    rows.append(
      {
        "task": task,
        "eta_l": eta_l,
        "eta_u": eta_u,
        "setting": "matched" if eta_l == eta_u else "mismatched",
        "teacher_acc": res["teacher_accuracy"],
        "teacher_wg": res["worst_group_teacher_accuracy"],
        "w2s_acc": w2s_acc,
        "w2s_wg": res["worst_group_w2s_accuracy"],
        "enhanced_acc": enhanced,
        "enhanced_wg": res["worst_group_enhanced_accuracy"],
        "w2s_gain": res["w2s_gain"],
        "enhanced_gain": res["enhanced_gain"],
        "enhanced_rel_improvement_pct": 100.0 * (enhanced - w2s_acc) / w2s_acc,
        "selected_p": res["enhanced_selected_p"],
        "selected_q": res["enhanced_selected_q"],
        "oracle_acc": res["enhanced_oracle_accuracy"],
      }
    )
  return rows


def classification_summary(rows) -> dict:
  out = {}
  for task in sorted({row["task"] for row in rows}):
    mean = lambda key, setting, task=task: float(
      np.mean([r[key] for r in rows if r["task"] == task and r["setting"] == setting] or [np.nan])
    )
    out[f"{task}_enhanced_gain_mismatched"] = mean("enhanced_gain", "mismatched")
    out[f"{task}_enhanced_gain_matched"] = mean("enhanced_gain", "matched")
    out[f"{task}_remedy_helps_most_when_mismatched"] = bool(
      mean("enhanced_gain", "mismatched") > mean("enhanced_gain", "matched")
    )
    out[f"{task}_w2s_gain_matched"] = mean("w2s_gain", "matched")
    out[f"{task}_w2s_gain_mismatched"] = mean("w2s_gain", "mismatched")
  return out


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  import matplotlib

  matplotlib.use("Agg")
  summary, figures, notes = {}, {}, ""
  if "e1" in results:
    summary.update(e1_summary(config, results["e1"]))
    curves = e1_curves(config, results["e1"])
    figures.update(e1_figures(config, curves))
    notes = e1_notes(curves)
  rows = _classification_rows(results)
  if rows:
    summary.update(classification_summary(rows))
    figures["remedy"] = remedy_figure(rows)
  return Report(rows=rows, summary=summary, figures=figures, notes=notes)


def e1_notes(curves) -> str:
  """A Markdown table per E1 curve: matched gain, fit and failures (units of c d_z)."""
  header = (
    "| s | xi2 | eta_l | G matched (sim) | G matched (Sec. 2.1) | G matched (relayed) | fit b | R^2 "
    "| min G (sim) | eta_u with G<0 |"
  )
  lines = ["E1, eta_t = eta_l, gains in units of c d_z:", "", header, "|" + "---|" * 10]
  for c in curves:
    i = int(np.argmin(c["shift_sq"]))
    failing = ",".join(f"{u:g}" for u, g in zip(c["eta_u"], c["gain"], strict=True) if g < 0) or "-"
    lines.append(
      f"| {c['s']:g} | {c['xi2']:g} | {c['eta_l']:g} | {c['gain'][i]:.3f} +- {c['gain_std'][i]:.3f} | "
      f"{c['gain_pred'][i]:.3f} | {c['gain_relayed'][i]:.3f} | {c['fit'][1]:.2f} | {c['fit'][2]:.3f} | "
      f"{c['gain'].min():.3f} | {failing} |"
    )
  return "\n".join(lines)


def e1_figures(config, curves) -> dict:
  import matplotlib.pyplot as plt

  r = config.regression
  rows, cols = len(r.similarities), len(r.separations)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
  for c in curves:
    ax = axes[r.similarities.index(c["xi2"]), r.separations.index(c["s"])]
    color = f"C{r.eta_labelled.index(c['eta_l'])}"
    ax.errorbar(
      c["shift_sq"],
      c["gain"],
      yerr=c["gain_std"],
      fmt="o",
      ms=3,
      color=color,
      label=f"eta_l={c['eta_l']:g}",
    )
    grid = np.linspace(0, c["shift_sq"].max(), 50)
    ax.plot(grid, c["fit"][0] + c["fit"][1] * grid, "-", color=color, lw=1)
    ax.set_title(f"s={c['s']:g}, ||Xi||^2={c['xi2']:g}", fontsize=9)
  for ax in axes.flat:
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xlabel("(eta_u - eta_l)^2")
    ax.set_ylabel("gain / (c d_z)")
  axes[0, 0].legend(fontsize=7)
  fig.tight_layout()
  sim = np.concatenate([c["gain"] for c in curves])
  pred = np.concatenate([c["gain_pred"] for c in curves])
  relayed = np.concatenate([c["gain_relayed"] for c in curves])
  fig2, ax2 = plt.subplots(1, 2, figsize=(9, 4))
  for ax, theory, name in (
    (ax2[0], pred, "Sec. 2.1 exact-moment"),
    (ax2[1], relayed, "relayed Thm 1-2"),
  ):
    ax.scatter(theory, sim, s=5)
    lim = [min(sim.min(), theory.min()), max(sim.max(), theory.max())]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set_xlabel(f"predicted gain ({name})")
    ax.set_ylabel("simulated gain")
  fig2.tight_layout()
  return {
    "e1_gain_vs_shift": fig,
    "e1_simulated_vs_predicted": fig2,
    "e1_failure_region": _failure_figure(config, curves),
  }


def _failure_figure(config, curves):
  import matplotlib.pyplot as plt

  r = config.regression
  rows, cols = len(r.similarities), len(r.separations)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
  for xi_index, xi2 in enumerate(r.similarities):
    for s_index, s in enumerate(r.separations):
      ax = axes[xi_index, s_index]
      sel = [c for c in curves if c["xi2"] == xi2 and c["s"] == s]
      gain = np.stack([c["gain"] for c in sel])
      bound = max(np.abs(gain).max(), 1e-9)
      ax.imshow(gain, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto", origin="lower")
      for i, c in enumerate(sel):
        for j in range(len(c["eta_u"])):
          if c["gain_pred"][j] < 0:
            ax.plot(j, i, "kx", ms=4)
          if c["gain_relayed"][j] < 0:
            ax.plot(j, i, "o", mfc="none", mec="k", ms=6)
      ax.set_xticks(
        range(len(r.eta_unlabelled)), [f"{u:g}" for u in r.eta_unlabelled], fontsize=6, rotation=90
      )
      ax.set_yticks(range(len(sel)), [f"{c['eta_l']:g}" for c in sel], fontsize=7)
      ax.set_title(f"s={s:g}, ||Xi||^2={xi2:g}: G (red < 0)", fontsize=8)
      ax.set_xlabel("eta_u")
      ax.set_ylabel("eta_l")
  fig.suptitle(
    "simulated gain; x: Sec. 2.1 predicts G < 0; o: relayed formula predicts G < 0", fontsize=9
  )
  fig.tight_layout()
  return fig


def remedy_figure(rows):
  import matplotlib.pyplot as plt

  tasks = sorted({row["task"] for row in rows})
  fig, axes = plt.subplots(len(tasks), 2, figsize=(10, 3.2 * len(tasks)), squeeze=False)
  for t, task in enumerate(tasks):
    sel = [row for row in rows if row["task"] == task]
    labels = [f"l={row['eta_l']:g}\nu={row['eta_u']:g}" for row in sel]
    for k, (metric, title) in enumerate(
      (("acc", "average accuracy"), ("wg", "worst-group accuracy"))
    ):
      ax = axes[t, k]
      for m, model in enumerate(("teacher", "w2s", "enhanced")):
        ax.bar(
          np.arange(len(sel)) + 0.27 * (m - 1),
          [row[f"{model}_{metric}"] for row in sel],
          0.27,
          label=model,
        )
      ax.set_xticks(range(len(sel)), labels, fontsize=8)
      ax.set_title(f"{task}: {title}", fontsize=9)
      ax.set_ylim(0, 1)
  axes[0, 0].legend(fontsize=8)
  fig.tight_layout()
  return fig


METHOD = Method(name="w2s", phases=phases, validate=validate, study_arms=study_arms, report=report)
