"""IID's phases: data, the fusion models and their losses, the vmapped training step with
best-validation selection, and the evaluation (see the package docstring)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import fusion
from core.data import batching
from core.data import multimodal as mm
from core.nn import fusion as fusion_nn
from methods.base import Phase, cached_per_config


class ModelSpec(NamedTuple):
  fusion: str
  informatic: bool
  coherence: bool


MODELS = {
  "lf": ModelSpec("late", False, False),
  "if": ModelSpec("intermediate", False, False),
  "concat": ModelSpec("concat", False, False),
  "if_ic": ModelSpec("intermediate", True, False),
  "if_dc": ModelSpec("intermediate", False, True),
  "full": ModelSpec("intermediate", True, True),
}
REPLICATES = "/replicates"  # suffix of the (deltas, seeds) array of a metric

# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def is_synthetic(config) -> bool:
  return config.data.name == "synthetic"


def num_replicates(config) -> int:
  return len(config.data.deltas) * config.data.num_seeds


@cached_per_config(maxsize=8)
def load_data(config: ml_collections.ConfigDict) -> dict:
  """{"train": arrays or a lazy tfds source, "train_eval", "test": arrays}. Synthetic arrays carry the
  replicate axis 1 (num, P, ...); tfds arrays are shared by every replicate (num, ...)."""
  d = config.data
  if is_synthetic(config):
    make = functools.partial(
      mm.synthetic_replicates,
      range(d.first_seed, d.first_seed + d.num_seeds),
      tuple(d.deltas),
      num_classes=d.num_classes,
      semantic_dim=d.semantic_dim,
      input_dim=d.input_dim,
      view_dim=d.view_dim,
      class_scale=d.class_scale,
      tail_rate=d.tail_rate,
    )
    train = make("train", d.num_train)
    splits = {"train": train, "train_eval": train, "test": make("test", d.num_test)}
    if d.num_val:
      splits["val"] = make("val", d.num_val)
    return splits
  fields = mm.TwoModalityFields(*d.fields)
  train = mm.tfds_two_modality_source(d.name, d.train_split, d.data_dir or None)
  test = mm.tfds_two_modality_source(d.name, d.test_split, d.data_dir or None)
  return {
    "train": train,
    "train_eval": mm.load_records(train, fields, d.num_train_eval),
    "test": mm.load_records(test, fields, d.num_test),
  }


def train_batches(config, data) -> batching.IndexedBatches:
  if is_synthetic(config):
    return batching.from_arrays(data["train"], config.batch_size, config.seed)
  fields = mm.TwoModalityFields(*config.data.fields)
  return batching.from_random_access(
    data["train"], config.batch_size, config.seed, lambda r: mm.two_modality_record(r, fields)
  )


def _data_axis(config):
  """The batch axis that indexes replicates (None: every replicate sees the same data)."""
  return 1 if is_synthetic(config) else None


# ---------------------------------------------------------------------------------------------------
# Model, losses, step
# ---------------------------------------------------------------------------------------------------


def model_of(config, name: str) -> fusion_nn.FusionClassifier:
  m = config.model
  return fusion_nn.FusionClassifier(
    fusion=MODELS[name].fusion,
    num_classes=config.data.num_classes,
    encoder_kind=m.encoder,
    encoder_hidden=tuple(m.hidden),
    latent_dim=m.latent_dim,
    weighting=m.weighting,
    static_weights=tuple(m.static_weights),
  )


def uses_confidence(config, name: str) -> bool:
  """Whether the model fuses with PDF weights (IID-P) and so trains confidence networks."""
  return config.model.weighting == "pdf" and MODELS[name].fusion != "concat"


def optimizer(config) -> optax.GradientTransformation:
  return optax.adam(config.optim.learning_rate)


def selects_best(config) -> bool:
  """Whether evaluation uses each replicate's best-validation weights (synthetic data with a split)."""
  return bool(config.eval.select_best) and is_synthetic(config) and config.data.num_val > 0


def init_state(config, name: str, example_shapes, val, rng, inputs=None) -> dict:
  """Per-replicate weights and RIP matrices, drawn from (config.seed, seed index) only, so every model
  and delta of a seed index starts from the same encoders; with `eval.select_best`, the validation
  split and the best weights so far (selected every `eval.select_every` steps)."""
  del rng, inputs
  model = model_of(config, name)
  dummy = tuple(jnp.zeros((1, *shape), jnp.float32) for shape in example_shapes)
  seed_index = jnp.arange(num_replicates(config)) % config.data.num_seeds
  keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(config.seed), s))(seed_index)
  params = jax.vmap(lambda k: model.init(k, dummy))(keys)
  projection = jax.vmap(
    lambda k: fusion.rip_matrix(
      jax.random.fold_in(k, 1), config.dc.projection_dim, config.model.latent_dim
    )
  )(keys)
  state = {
    "params": params,
    "opt_state": jax.vmap(optimizer(config).init)(params),
    "projection": projection,
    "step": jnp.zeros((), jnp.int32),
  }
  if selects_best(config):
    state["val"] = {k: jnp.asarray(v) for k, v in val.items()}
    state["best"] = {
      "params": params,
      "val_accuracy": jnp.full((num_replicates(config),), -1.0),
      "step": jnp.zeros((num_replicates(config),), jnp.int32),
    }
  return state


def _cross_entropy(logits, labels) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def replicate_loss(config, name: str, params, projection, x1, x2, y):
  """L = CE + (LF) the heads' CE + alpha L_ic + beta L_dc (+ with PDF weights, IID-P, the
  confidence networks' L1 loss) for one replicate; returns (L, terms)."""
  spec, model = MODELS[name], model_of(config, name)
  out = model.apply(params, (x1, x2), train=True)
  ce = _cross_entropy(out.logits, y)
  terms = {"ce": ce, "accuracy": jnp.mean(jnp.argmax(out.logits, -1) == y)}
  loss = ce
  if uses_confidence(config, name):
    confidence = fusion.confidence_loss(out.confidence, out.unimodal_logits, y)
    loss, terms["confidence"] = loss + config.model.confidence_weight * confidence, confidence
  if spec.fusion == "late":
    unimodal = jax.vmap(_cross_entropy, in_axes=(0, None))(out.unimodal_logits, y)
    loss = loss + config.lf.unimodal_weight * jnp.sum(unimodal)
  if spec.informatic:
    ic = fusion.informatic_constraint(
      out.logits,
      out.unimodal_logits,
      out.fused,
      out.latents,
      y,
      config.ic.kl_weight,
      config.ic.unimodal_sign,
    )
    loss, terms["informatic"] = loss + config.ic.alpha * ic, ic
  if spec.coherence:
    dc = fusion.distribution_coherence(
      out.latents,
      projection,
      config.dc.keep,
      config.dc.epsilon,
      config.dc.marginal_weight,
      config.dc.iterations,
      config.dc.use_fft,
    )
    loss, terms["coherence"] = loss + config.dc.beta * dc, dc
  return loss, terms


def train_step(config, name: str, state, batch, rng):
  """One Adam step of every replicate (vmapped; the replicates share nothing), then, every
  `eval.select_every` steps, the best-validation weights of each replicate are updated."""
  del rng
  opt = optimizer(config)

  def one(params, opt_state, projection, x1, x2, y):
    grad_fn = jax.value_and_grad(functools.partial(replicate_loss, config, name), has_aux=True)
    (loss, terms), grads = grad_fn(params, projection, x1, x2, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, terms

  axis = _data_axis(config)
  params, opt_state, loss, terms = jax.vmap(one, in_axes=(0, 0, 0, axis, axis, axis))(
    state["params"], state["opt_state"], state["projection"], batch["x1"], batch["x2"], batch["y"]
  )
  new_state = dict(state, params=params, opt_state=opt_state, step=state["step"] + 1)
  if "best" in state:
    new_state["best"] = jax.lax.cond(
      new_state["step"] % config.eval.select_every == 0,
      lambda: _select_best(config, name, state["best"], params, state["val"], new_state["step"]),
      lambda: state["best"],
    )
  metrics = {"loss": loss.mean(), **{k: v.mean() for k, v in terms.items()}}
  return new_state, metrics


def _select_best(config, name: str, best, params, val, step):
  """Keeps, per replicate, the weights of the first step with the highest validation accuracy."""
  model = model_of(config, name)

  def accuracy(p, x1, x2, y):
    return jnp.mean(jnp.argmax(model.apply(p, (x1, x2)).logits, -1) == y)

  val_accuracy = jax.vmap(accuracy, in_axes=(0, 1, 1, 1))(params, val["x1"], val["x2"], val["y"])
  better = val_accuracy > best["val_accuracy"]

  def pick(new, old):
    return jnp.where(better.reshape(-1, *([1] * (new.ndim - 1))), new, old)

  return {
    "params": jax.tree.map(pick, params, best["params"]),
    "val_accuracy": jnp.where(better, val_accuracy, best["val_accuracy"]),
    "step": jnp.where(better, step, best["step"]),
  }


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def _forward_fn(config: ml_collections.ConfigDict, name: str):
  """Jitted `(params, x1, x2) -> (logits (P, n, C), unimodal logits (P, M, n, C), latents (P, M, n, d))`."""
  model, axis = model_of(config, name), _data_axis(config)

  def one(params, x1, x2):
    out = model.apply(params, (x1, x2))
    return out.logits, out.unimodal_logits, out.latents

  return jax.jit(jax.vmap(one, in_axes=(0, axis, axis)))


def predict(config, name: str, params, split: Mapping[str, np.ndarray]):
  """The forward pass over a split in chunks of `eval.chunk` examples; numpy outputs, replicate-major."""
  forward, size = _forward_fn(config, name), config.eval.chunk
  parts = []
  for start in range(0, len(split["y"]), size):
    chunk = [jnp.asarray(split[k][start : start + size]) for k in ("x1", "x2")]
    parts.append(jax.device_get(forward(params, *chunk)))
  return tuple(np.concatenate([p[i] for p in parts], axis=-2) for i in range(3))


def _labels(config, split) -> np.ndarray:
  """Labels as (P, n): per replicate (synthetic) or shared."""
  y = np.asarray(split["y"])
  return y.T if is_synthetic(config) else np.broadcast_to(y, (num_replicates(config), len(y)))


def _accuracy(logits, labels) -> np.ndarray:
  return np.mean(np.argmax(logits, -1) == labels, axis=-1)


def _cross_entropy_np(logits, labels) -> np.ndarray:
  log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1))[..., None]
  log_probs -= logits.max(-1, keepdims=True)
  return -np.mean(np.take_along_axis(log_probs, labels[..., None], -1)[..., 0], axis=-1)


def incoherence(latents: np.ndarray, num_points: int) -> tuple[np.ndarray, np.ndarray]:
  """Per replicate: exact W_2 between the first `num_points` test latents of modality 1 and 2, and
  that W_2 divided by the RMS distance of the pooled latents to their mean."""
  raw, relative = [], []
  for z in latents:  # (M, n, d)
    a, b = z[0, :num_points], z[1, :num_points]
    w2 = fusion.exact_wasserstein(a, b)
    pooled = np.concatenate([a, b])
    spread = math.sqrt(np.mean(np.sum((pooled - pooled.mean(0)) ** 2, -1)))
    raw.append(w2)
    relative.append(w2 / max(spread, 1e-12))
  return np.asarray(raw), np.asarray(relative)


def weight_metrics(config, name: str, data, params) -> dict[str, np.ndarray]:
  """Per replicate (P,): test/train/val accuracy, the gap (train - test accuracy), cross-entropies and
  their gap, the measured incoherence; unimodal test accuracy (P, M) where the model has unimodal heads."""
  test_logits, test_unimodal, test_latents = predict(config, name, params, data["test"])
  train_logits, _, _ = predict(config, name, params, data["train_eval"])
  test_y, train_y = _labels(config, data["test"]), _labels(config, data["train_eval"])
  out = {
    "accuracy": _accuracy(test_logits, test_y),
    "train_accuracy": _accuracy(train_logits, train_y),
    "test_ce": _cross_entropy_np(test_logits, test_y),
    "train_ce": _cross_entropy_np(train_logits, train_y),
  }
  if "val" in data:
    val_logits, _, _ = predict(config, name, params, data["val"])
    out["val_accuracy"] = _accuracy(val_logits, _labels(config, data["val"]))
  out["gap"] = out["train_accuracy"] - out["accuracy"]
  out["ce_gap"] = out["test_ce"] - out["train_ce"]
  out["incoherence"], out["relative_incoherence"] = incoherence(
    test_latents, config.eval.incoherence_points
  )
  if MODELS[name].fusion != "concat":
    out["unimodal_accuracy"] = _accuracy(test_unimodal, test_y[:, None, :])
  return out


def evaluate(config, name: str, data, state) -> dict:
  """`weight_metrics` of the evaluated weights (each replicate's best-validation weights when
  `eval.select_best`, else the final ones) as `<metric>_<name>`, and of the final weights as
  `final_<metric>_<name>` (the same numbers without selection); means over replicates and, under
  `<key>/replicates`, arrays of shape (deltas, seeds[, modalities])."""
  shape = (len(config.data.deltas), config.data.num_seeds)
  final = weight_metrics(config, name, data, state["params"])
  evaluated = (
    weight_metrics(config, name, data, state["best"]["params"]) if "best" in state else final
  )
  results = {}
  for prefix, metrics in (("", evaluated), ("final_", final)):
    for metric, values in metrics.items():
      key = f"{prefix}{metric}_{name}"
      if values.ndim == 1:
        results[key] = float(np.mean(values))
      results[key + REPLICATES] = values.reshape(*shape, *values.shape[1:])
  if "best" in state:
    steps = np.asarray(state["best"]["step"], np.float64)
    results[f"selected_step_{name}"] = float(steps.mean())
    results[f"selected_step_{name}{REPLICATES}"] = steps.reshape(shape)
  return results


def _evaluate_phase(config, name: str, data, state, rng, inputs) -> dict:
  del rng, inputs
  return evaluate(config, name, data, state)


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  data = load_data(config)
  test = data["test"]
  start = 2 if is_synthetic(config) else 1
  example_shapes = tuple(test[k].shape[start:] for k in ("x1", "x2"))
  return [
    Phase(
      name=name,
      num_steps=config.steps,
      init=functools.partial(init_state, config, name, example_shapes, data.get("val")),
      step=functools.partial(train_step, config, name),
      data=lambda inputs: train_batches(config, data),
      evaluate=functools.partial(_evaluate_phase, config, name, data),
    )
    for name in config.models
  ]
