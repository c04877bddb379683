"""The classification pipeline (E2, digits, tfds): weak teacher, pseudolabels, W2S student, Enhanced-W2S.

"Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026),
its remedy Enhanced-W2S as steps 1-6 of the package docstring. Each stage is a phase of the shared
loop and every head is vmapped over `config.num_seeds` independent replicates (parameters with a
leading seed axis, data (num, R, ...)); the enhanced heads add a leading (p, q) grid axis.

  pretrain      (digits, tfds) the strong backbone, frozen: a CNN trained here by SimCLR on unlabelled,
                unstriped digits (`backbones.py`), or an MLP trained on a different task.
  teacher       the weak model on the labelled split, cross-entropy (step 1).
  pseudolabels  num_steps = 0: teacher predictions on the unlabelled and held-out splits (step 2).
  student       vanilla W2S, a linear head on frozen strong features (step 3).
  enhanced      Enhanced-W2S for every (p, q) of the grid at once; (p, q) chosen per seed (steps 4-6).
  ceiling       diagnostic heads on the true labels of the unlabelled split (group-balanced and plain).

The splits are built in `core/data/spurious_splits.py`; losses, subset and group metrics are in
`core/w2s.py`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import w2s
from core.data import images, spurious_splits
from core.data import spurious as spurious_data
from core.data.spurious_splits import NUM_GROUPS, GroupData
from core.nn import precision
from core.nn.mlp import MLP
from methods.base import Phase, cached_per_config
from methods.w2s import backbones
from methods.w2s.runtime import runtime_barrier

NUM_CLASSES = 2
PSEUDO = ("unlabelled", "heldout")  # the splits the teacher pseudolabels

# ---------------------------------------------------------------------------------------------------
# Data: the config's splits, built once per config
# ---------------------------------------------------------------------------------------------------


def _sizes(config) -> dict[str, tuple[int, float]]:
  g = config.groups
  return {
    "labelled": (g.num_labelled, g.eta_labelled),
    "unlabelled": (g.num_unlabelled, g.eta_unlabelled),
    "heldout": (g.num_heldout, g.eta_unlabelled),
  }


def e2_data(config) -> GroupData:
  """E2: per seed, labelled (eta_l), unlabelled and held-out (eta_u), a balanced test set."""
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
  return spurious_splits.e2_splits(
    design, config.seed, config.num_seeds, _sizes(config), config.groups.num_test
  )


def digits_data(config) -> GroupData:
  """Digits 5-9 with a stripe (label = odd digit); the backbone pre-trains on digits 0-4."""
  d = config.digits
  splits = images.digits(images.DIGITS_LEVELS, config.seed)
  return spurious_splits.striped_digits_splits(
    splits["train"],
    splits["test"],
    config.seed,
    config.num_seeds,
    _sizes(config),
    d.task_digits,
    d.pretrain_digits,
    d.stripe_intensity,
  )


def _tfds_pool(config, split: str, max_examples: int) -> dict[str, np.ndarray]:
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
  return spurious_splits.pixel_pool(pool, t.flip_attribute)


def tfds_data(config) -> GroupData:
  """A tfds dataset with a natural spurious attribute; the minority has attribute != label."""
  t = config.tfds
  return spurious_splits.tfds_splits(
    _tfds_pool(config, t.train_split, t.max_train_examples),
    _tfds_pool(config, t.test_split, t.max_test_examples),
    config.seed,
    config.num_seeds,
    _sizes(config),
    config.groups.num_test,
  )


@cached_per_config(maxsize=4)
def group_data(config) -> GroupData:
  return {"classification": e2_data, "digits": digits_data, "tfds": tfds_data}[config.task](config)


# ---------------------------------------------------------------------------------------------------
# Models: weak and strong views, heads vmapped over seeds (and over the (p, q) grid)
# ---------------------------------------------------------------------------------------------------


def teacher_model(config) -> MLP:
  return MLP(hidden=tuple(config.teacher.hidden), num_outputs=NUM_CLASSES)


def head_model() -> MLP:
  return MLP(hidden=(), num_outputs=NUM_CLASSES)


def backbone_model(config, num_classes: int) -> MLP | backbones.DigitCNN:
  """The strong backbone at `config.model.dtype` (`pretrain.network`: an MLP, or the digits CNN);
  its features reach the heads in float32. The teacher and the heads stay float32: they are small,
  and their probabilities are what the paper measures. `num_classes` is the size of its output (the
  pre-training classes, or the projection of the contrastive objective)."""
  dtype = precision.compute_dtype(config.model.dtype)
  if config.pretrain.network == "cnn":
    return backbones.DigitCNN(
      channels=tuple(config.pretrain.channels), num_outputs=num_classes, dtype=dtype
    )
  return MLP(hidden=tuple(config.pretrain.hidden), num_outputs=num_classes, dtype=dtype)


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
  net = backbone_model(config, _backbone_outputs(config, data))
  features = _backbone_view(net, inputs["pretrain"], jnp.asarray(x))
  if not config.pretrain.standardize_features:
    return features
  pool = _backbone_view(net, inputs["pretrain"], jnp.asarray(data.splits["unlabelled"]["x"]))
  return _standardize(features, pool)


@jax.jit
def _standardize(features: jax.Array, pool: jax.Array) -> jax.Array:
  """(num, R, D) features z-scored per seed and dimension by the unlabelled pool's (N, R, D) mean and
  standard deviation: label-free, and it puts every feature on one scale for the heads' Adam."""
  mean, std = pool.mean(axis=0), pool.std(axis=0)
  return (features - mean) / jnp.maximum(std, 1e-6)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _e2_view(design, kind: str, x: jax.Array) -> jax.Array:
  fn = {"weak": w2s.e2_weak_features, "strong": w2s.e2_strong_features}[kind]
  return _flat_apply(lambda v: fn(v, design), x)


@functools.partial(jax.jit, static_argnums=0)
def _backbone_view(net, params, x: jax.Array) -> jax.Array:
  return _flat_apply(lambda v: net.apply(params, v, method="features"), x)


def _backbone_outputs(config, data: GroupData) -> int:
  """The backbone's output size: its pre-training classes, or the contrastive projection's width."""
  if config.pretrain.objective == "contrastive":
    return config.pretrain.projection_dim
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
  """The whole set as every step's batch (full-batch Adam); rows split across processes."""

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


def _views(config, x: jax.Array, rng) -> tuple[jax.Array, jax.Array]:
  """Two independent augmentations of a batch of flattened digits (`config.pretrain.augment`)."""
  a = config.pretrain.augment
  view = lambda key: backbones.augment_digits(key, x, a.shift, a.keep, tuple(a.contrast), a.noise)
  key_a, key_b = jax.random.split(rng)
  return view(key_a), view(key_b)


def contrastive_step(model, optimizer, config, state, batch, rng):
  """One Adam step of SimCLR: NT-Xent between two augmented views of the batch; labels unused."""

  def loss_fn(params):
    view_a, view_b = _views(config, batch["x"], rng)
    z_a, z_b = model.apply(params, view_a), model.apply(params, view_b)
    return backbones.nt_xent(z_a, z_b, config.pretrain.temperature)

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
# Phases
# ---------------------------------------------------------------------------------------------------


def _adam(learning_rate: float):
  return optax.adam(learning_rate)


def pretrain_phase(config, data: GroupData) -> Phase:
  """The strong backbone, trained here on a different task (digits 0-4 / other attributes)."""
  net = backbone_model(config, _backbone_outputs(config, data))
  optimizer = _adam(config.pretrain.learning_rate)
  dim = data.pretrain["x"].shape[1]
  test_x = jnp.asarray(data.pretrain_test["x"])
  contrastive = config.pretrain.objective == "contrastive"

  def evaluate(state, rng, inputs):
    if contrastive:  # label-free: held-out NT-Xent and positive-pair retrieval
      view_a, view_b = _views(config, test_x, rng)
      z_a, z_b = net.apply(state["params"], view_a), net.apply(state["params"], view_b)
      return {
        "pretrain_heldout_loss": float(backbones.nt_xent(z_a, z_b, config.pretrain.temperature)),
        "pretrain_pair_accuracy": float(backbones.pair_accuracy(z_a, z_b)),
      }
    logits = net.apply(state["params"], test_x)
    return {
      "pretrain_accuracy": float(jnp.mean(jnp.argmax(logits, -1) == data.pretrain_test["label"]))
    }

  from core.data import batching

  step = (
    functools.partial(contrastive_step, net, optimizer, config)
    if contrastive
    else functools.partial(pretrain_step, net, optimizer)
  )
  return Phase(
    name="pretrain",
    num_steps=config.pretrain.steps,
    init=lambda rng, inputs: _train_state(net.init(rng, jnp.zeros((1, dim))), optimizer),
    step=step,
    data=lambda inputs: batching.from_arrays(
      data.pretrain, config.pretrain.batch_size, config.seed
    ),
    evaluate=evaluate,
    outputs=lambda state, inputs: state["params"],
  )


def teacher_phase(config, data: GroupData) -> Phase:
  """Weak teacher: cross-entropy on the n labelled examples (step 1)."""
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
  """Hard (one-hot argmax) or soft (softmax) pseudolabels (step 2)."""
  if config.pseudolabels == "hard":
    return jax.nn.one_hot(jnp.argmax(logits, -1), NUM_CLASSES)
  return jax.nn.softmax(logits)


def pseudolabel_phase(config, data: GroupData) -> Phase:
  """Teacher pseudolabels on the unlabelled and held-out splits (num_steps = 0)."""
  net = teacher_model(config)

  def init(rng, inputs):
    splits = {n: data.splits[n]["x"] for n in PSEUDO}
    params, splits = runtime_barrier((inputs["teacher"], splits), rng)
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
  """Vanilla W2S: a head on frozen strong features fit to the pseudolabels (step 3)."""
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
  """(N, R, P): 1 on the ceil(pN) lowest-entropy unlabelled points of the W2S student, per seed and p
  (step 4)."""
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
  """Enhanced-W2S over the (p, q) grid, one vmapped axis (steps 4-6)."""
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
  """(G, R) agreement of each grid head with the teacher's pseudolabels on the held-out split (step 6):
  no group label and no true label is read."""
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


CEILINGS = ("ceiling", "ceiling_erm")  # group-balanced weights | plain true labels


def ceiling_weights(split) -> np.ndarray:
  """(N, R, 2) example weights of the two ceiling heads: every (y, a) group of the split weighted
  equally (its points 1 / (4 n_group)), and uniform (1 / N)."""
  groups = split["label"] * 2 + split["attribute"]  # (N, R)
  counts = np.stack([(groups == g).sum(0) for g in range(NUM_GROUPS)])  # (4, R)
  present = (counts > 0).sum(0)  # groups with any point, per seed
  balanced = 1.0 / (np.take_along_axis(counts, groups, axis=0) * present)
  uniform = np.full(groups.shape, 1.0 / len(groups))
  return np.stack([balanced, uniform], axis=-1).astype(np.float32)


def weighted_head_step(model: MLP, optimizer, state, batch, rng):
  """One Adam step for K heads (leading parameter axis), each on its own example weights (N, R, K)."""
  del rng

  def per_head(params, weight):
    losses = w2s.cross_entropy(apply_per_seed(model, params, batch["x"]), batch["target"])
    return jnp.sum(weight * losses, axis=0)  # (R,)

  def loss_fn(params):
    per_point = jax.vmap(per_head, in_axes=(0, 2))(params, batch["weight"])  # (K, R)
    return per_point.sum(), per_point

  (_, per_point), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  return {"params": params, "opt_state": opt_state}, {"loss": per_point.mean()}


def ceiling_phase(config, data: GroupData) -> Phase:
  """The strong ceilings: the student's head, step size and budget, fit to the true labels of the
  unlabelled split, once with its (y, a) groups weighted equally (`ceiling`: the best head on true
  labels the strong features offer) and once plainly (`ceiling_erm`: minority fraction eta_u, as the
  student's data). Diagnostics only (they read true and group labels), against which the teacher
  and the W2S student are read; the performance gap recovered is (W2S - teacher) / (ceiling -
  teacher), for the balanced ceiling."""
  net, optimizer = head_model(), _adam(config.student.learning_rate)
  unlabelled = data.splits["unlabelled"]
  target = np.asarray(jax.nn.one_hot(unlabelled["label"], NUM_CLASSES))
  weight = ceiling_weights(unlabelled)

  def arrays(inputs):
    x = strong_view(config, data, unlabelled["x"], inputs)
    return {"x": np.asarray(x), "target": target, "weight": weight}

  def init(rng, inputs):
    dim, keys = _strong_dim(config, data, inputs), jax.random.split(rng, len(CEILINGS))
    params = jax.vmap(lambda k: init_per_seed(net, k, config.num_seeds, dim))(keys)
    return _train_state(params, optimizer)

  def evaluate(state, rng, inputs):
    teacher = teacher_test_metrics(config, data, inputs)
    student = student_test_metrics(config, data, inputs["student"], inputs)
    out = {}
    for k, name in enumerate(CEILINGS):
      head = jax.tree.map(lambda leaf, k=k: leaf[k], state["params"])
      metrics = student_test_metrics(config, data, head, inputs)
      out.update(_report(name, metrics))
      out[f"{name}_minus_teacher"] = float((metrics["average"] - teacher["average"]).mean())
    out["w2s_performance_gap_recovered"] = float(
      np.mean(student["average"] - teacher["average"]) / out["ceiling_minus_teacher"]
    )
    return out

  return Phase(
    name="ceiling",
    num_steps=config.student.steps,
    init=init,
    step=functools.partial(weighted_head_step, net, optimizer),
    data=lambda inputs: head_source(config, arrays(inputs)),
    evaluate=evaluate,
  )


def classification_phases(config) -> list[Phase]:
  data = group_data(config)
  phases = [pretrain_phase(config, data)] if config.task in ("digits", "tfds") else []
  # the ceiling comes last so that the other phases keep their index, hence their rngs
  return phases + [
    teacher_phase(config, data),
    pseudolabel_phase(config, data),
    student_phase(config, data),
    enhanced_phase(config, data),
    ceiling_phase(config, data),
  ]
