"""DCD SSMs on group state tracking: the model, the data, the `train` phase and the length-generalisation
evaluation (the method's package docstring, `methods/dcd_ssm/__init__.py`, maps it to the paper)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import dcd_constructions, optim
from core.data import groups as groups_lib
from core.nn import precision, ssm
from methods.base import ConfigError, Phase, cached_per_config, config_key, figure_grid

SCAN_IMPLEMENTATIONS = ("auto", "pallas", "xla", "sequential")
INITS = ("random", "construction")


# ---------------------------------------------------------------------------------------------------
# Model, data, construction
# ---------------------------------------------------------------------------------------------------


def group_of(config: ml_collections.ConfigDict) -> groups_lib.FiniteGroup:
  try:
    return groups_lib.by_name(config.data.group)
  except ValueError as error:
    raise ConfigError(f"config.data.group: {error}") from None


def model_of(config: ml_collections.ConfigDict, group: groups_lib.FiniteGroup) -> ssm.StateTracker:
  m = config.model
  implementation = None if m.scan_implementation == "auto" else m.scan_implementation
  return ssm.StateTracker(
    vocab_size=group.order,
    num_classes=group.order,
    d_model=m.d_model,
    d_state=m.d_state,
    d_hidden=m.d_hidden,
    num_layers=m.num_layers,
    kind=m.kind,
    scan_implementation=implementation,
    dtype=precision.compute_dtype(m.dtype),
    input_term=m.input_term,
    block_norm=m.block_norm,
  )


def cascade_of(config: ml_collections.ConfigDict) -> dcd_constructions.Cascade:
  """The exact construction for `config` (Thm 1 / Thm 2), or a ConfigError saying why there is none."""
  try:
    return dcd_constructions.construction_for(
      config.data.group, config.model.kind, config.model.num_layers
    )
  except ValueError as error:
    raise ConfigError(f"config.model.init: 'construction' impossible here: {error}") from None


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam with linear warmup and cosine decay (E2), global-norm clipping."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip)


def initial_params(config, model, group, rng) -> dict:
  """Random init, or the construction plus `model.init_noise` relative noise (E1, E3)."""
  init_rng, noise_rng = jax.random.split(rng)
  dummy = jnp.zeros((1, config.data.train_length), jnp.int32)
  random_params = model.init(init_rng, dummy)
  if config.model.init == "random":
    return random_params
  shapes = jax.eval_shape(model.init, init_rng, dummy)
  exact = dcd_constructions.construction_params(
    cascade_of(config), model, shapes, config.model.logit_scale
  )
  if config.model.init_noise == 0:
    return jax.tree.map(jnp.asarray, exact)
  return dcd_constructions.perturb(exact, random_params, config.model.init_noise, noise_rng)


def init_state(config, model, group, rng, inputs=None) -> dict:
  del inputs
  params = initial_params(config, model, group, rng)
  return {"params": params, "opt_state": optimizer(config).init(params)}


def cross_entropy(model, params, batch) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy and accuracy of the prefix-product labels at every position."""
  logits = model.apply(params, batch["x"])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
  return loss, accuracy


def train_step(config, model, state, batch, rng):
  del rng
  (loss, accuracy), grads = jax.value_and_grad(
    lambda p: cross_entropy(model, p, batch), has_aux=True
  )(state["params"])
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
  return {"params": params, "opt_state": opt_state}, metrics


# ---------------------------------------------------------------------------------------------------
# Evaluation: length generalisation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def _correct_fn(config: ml_collections.ConfigDict):
  """Jitted `(params, x, y) -> [batch, T] bool` correctness of every position."""
  model = model_of(config, group_of(config))
  return jax.jit(lambda params, x, y: jnp.argmax(model.apply(params, x), -1) == y)


_CURVES: dict = {}  # the last curve per config, so the figure reuses the evaluation's pass


def _fingerprint(params) -> float:
  return float(sum(np.sum(np.asarray(leaf, np.float64)) for leaf in jax.tree.leaves(params)))


def accuracy_by_position(config: ml_collections.ConfigDict, params) -> np.ndarray:
  """Accuracy at each position 1..max(eval.lengths) over the fixed evaluation set, `[T]`."""
  key = (config_key(config), _fingerprint(params))
  if key not in _CURVES:
    _CURVES.clear()
    _CURVES[key] = _accuracy_by_position(config, params)
  return _CURVES[key]


def _accuracy_by_position(config: ml_collections.ConfigDict, params) -> np.ndarray:
  group, lengths = group_of(config), config.eval.lengths
  data = groups_lib.evaluation_set(
    group, max(lengths), config.eval.num_sequences, config.data.eval_seed
  )
  correct_fn, size = _correct_fn(config), config.eval.batch_size
  hits = np.zeros(max(lengths))
  for start in range(0, config.eval.num_sequences, size):
    x, y = data["x"][start : start + size], data["y"][start : start + size]
    hits += np.asarray(correct_fn(params, x, y)).sum(0)
  return hits / config.eval.num_sequences


def length_metrics(config: ml_collections.ConfigDict, curve: np.ndarray) -> dict[str, float]:
  """`accuracy_at_<L>` per evaluation length, the train-length accuracy and the longest length whose
  accuracy (and that of every shorter evaluation length) exceeds `eval.threshold`."""
  window, threshold = config.eval.window, config.eval.threshold
  at = {L: float(curve[max(L - window, 0) : L].mean()) for L in sorted(config.eval.lengths)}
  train_length = config.data.train_length
  longest = 0
  for L, accuracy in at.items():
    if accuracy <= threshold:
      break
    longest = L
  results = {f"accuracy_at_{L}": accuracy for L, accuracy in at.items()}
  results["accuracy_at_train_length"] = float(
    curve[max(train_length - window, 0) : train_length].mean()
  )
  results["longest_length_over_90"] = float(longest)
  results["accuracy_all_positions"] = float(curve.mean())
  return results


def evaluate(config, state) -> dict[str, float]:
  results = length_metrics(config, accuracy_by_position(config, state["params"]))
  if config.model.kind in ssm.EIGENVALUE_KINDS:
    results["state_growth"] = state_growth(config, state["params"])
  return results


@cached_per_config(maxsize=16)
def _first_layer_states_fn(config: ml_collections.ConfigDict):
  """Jitted `(params, x) -> [batch, T, d_state]` complex states of the first DCD layer."""
  model = model_of(config, group_of(config))
  is_first = lambda module, name: isinstance(module, ssm.DCDLayer) and module.path[0] == "layer_0"

  def states(params, x):
    _, captured = model.apply(params, x, capture_intermediates=is_first, mutable=["intermediates"])
    return captured["intermediates"]["layer_0"]["recurrence"]["__call__"][0]

  return jax.jit(states)


def state_growth(config: ml_collections.ConfigDict, params) -> float:
  """Largest ratio over the first layer's state coordinates of the mean `|h_t|` at the longest
  evaluation length to that at the training length: ~1 when every coordinate stays on its circle,
  large when a coordinate counts positions (`lambda ~ 1` with `b != 0`), a feature the decoder saw
  only up to the training length."""
  data = groups_lib.evaluation_set(
    group_of(config), max(config.eval.lengths), config.eval.num_sequences, config.data.eval_seed
  )
  x = data["x"][: config.eval.batch_size]
  modulus = np.abs(np.asarray(_first_layer_states_fn(config)(params, x))).mean(0)  # [T, d]
  at_train = modulus[config.data.train_length - 1]
  return float(np.max(modulus[-1] / np.maximum(at_train, 1e-6)))


def accuracy_figure(config, state):
  curve = accuracy_by_position(config, state["params"])
  fig, ((ax,),) = figure_grid(figsize=(6, 3))
  ax.plot(np.arange(1, len(curve) + 1), curve)
  ax.axvline(config.data.train_length, color="gray", ls="--", label="train length")
  ax.axhline(config.eval.threshold, color="C3", ls=":", label=f"{config.eval.threshold:.0%}")
  ax.set(xlabel="position t", ylabel="accuracy of p_t", ylim=(0, 1.02), xscale="log")
  ax.set_title(f"{config.data.group}, {config.model.kind}, {config.model.num_layers} layer(s)")
  ax.legend()
  fig.tight_layout()
  return fig


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  group = group_of(config)
  model = model_of(config, group)
  return [
    Phase(
      name="evaluate" if config.evaluate_only else "train",
      num_steps=0 if config.evaluate_only else config.steps,
      init=functools.partial(init_state, config, model, group),
      step=functools.partial(train_step, config, model),
      data=lambda inputs: groups_lib.tracking_batches(
        group, config.data.train_length, config.batch_size, config.seed
      ),
      evaluate=lambda state, rng, inputs: evaluate(config, state),
      artifacts=(
        (lambda state, rng, inputs: {"accuracy_by_position": accuracy_figure(config, state)})
        if config.eval.write_figure
        else None
      ),
    )
  ]
