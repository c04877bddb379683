"""FastMix's search phase: one proxy, the mixture learned alongside it (Alg. 1).

One loop step is one outer iteration: `fastmix.inner_steps` (n1) optimiser steps of the proxy on
`sum_i alpha_i L_i` over uniform per-source batches, the last of them through per-source gradients
`grad L_i(w^t)` (their alpha-weighted sum is that step's update, so they cost nothing extra), then
the target gradient at `w^{t+1}` on one validation batch (plus `beta` times the training gradient
there, on the same training batch), the hypergradient `-eta_t <g_target, grad L_i>` over all
parameters or the LM head only (`fastmix.hypergradient`), and one optimiser step on the logits `z`
(`core/mixture.py`). `fastmix.num_seeds` independent searches (own initialisations, own data
streams, own `z` when `fastmix.init = "random"`) run as one vmapped axis.

Evaluation: the found mixtures `softmax(z)`, their L1 distance to the known optimum, the weight
left on sources the target does not use, the alpha trajectory, the ideal proxy's target loss at
the found mixture, the cost in training steps and the wall-clock.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import mixture
from methods.base import Phase
from methods.fastmix import tasks as tasks_lib
from methods.fastmix import training
from methods.fastmix.tasks import Task, load_task

ENTROPY_SIGNS = {"paper": 1.0, "code": -1.0}


def num_rounds(config) -> int:
  return config.steps // config.fastmix.inner_steps


def outer_optimizer(config) -> optax.GradientTransformation:
  """Adam / AdamW(wd 0) on the logits, betas (`outer_b1`, `outer_b2`) as in the official scripts."""
  f = config.fastmix
  if f.outer_optimizer == "adamw":
    return optax.adamw(f.outer_lr, b1=f.outer_b1, b2=f.outer_b2, weight_decay=0.0)
  return optax.adam(f.outer_lr, b1=f.outer_b1, b2=f.outer_b2)


def search_cost_steps(config) -> float:
  """Per outer step: n1 inner steps, one validation gradient (`val_rows` = the batch) and, with
  beta, one more training gradient at w^{t+1}."""
  extra = 1.0 + (1.0 if config.fastmix.beta else 0.0)
  return float(num_rounds(config) * (config.fastmix.inner_steps + extra))


# ---------------------------------------------------------------------------------------------------
# State and data
# ---------------------------------------------------------------------------------------------------


def initial_logits(config, rng, num_sources: int) -> jax.Array:
  """`z_0`: ones (uniform, the validation-target script) or `init_scale * N(0, 1)` (SFT script)."""
  if config.fastmix.init == "random":
    return config.fastmix.init_scale * jax.random.normal(rng, (num_sources,))
  return jnp.ones((num_sources,))


def init_one(config, task: Task, rng) -> dict:
  key_model, key_z = jax.random.split(rng)
  params = task.init_params(key_model)
  logits = initial_logits(config, key_z, task.num_sources)
  trajectory = jnp.zeros((num_rounds(config) + 1, task.num_sources))
  return {
    "params": params,
    "opt_state": training.inner_optimizer(config, config.steps).init(params),
    "logits": logits,
    "outer_state": outer_optimizer(config).init(logits),
    "round": jnp.zeros((), jnp.int32),
    "trajectory": trajectory.at[0].set(mixture.mixture_weights(logits)),
  }


def init_state(config, rng, inputs=None) -> dict:
  del inputs
  task = load_task(config)
  keys = jax.random.split(rng, config.fastmix.num_seeds)
  return jax.vmap(functools.partial(init_one, config, task))(keys)


def search_batches(config, task: Task) -> training.Batches:
  """Outer step r: for each replicate, the stratified batches of inner steps `r n1 .. r n1 + n1 - 1`
  (fields `[B, R, n1, ...]`), `source [B]`, and one validation batch per replicate (`val_*`)."""
  n1, rows = config.fastmix.inner_steps, config.data.rows_per_source
  size = training.batch_rows(config, task)

  def generate(r: int):
    per_seed, vals, source = [], [], None
    for seed in range(config.fastmix.num_seeds):
      stream = tasks_lib.TRAIN + 10 * seed
      inner = [task.stratified(stream, r * n1 + j, rows) for j in range(n1)]
      source = inner[0]["source"]
      per_seed.append({f: np.stack([b[f] for b in inner], axis=1) for f in task.fields})
      vals.append(task.validation_batch(r + 100_003 * seed, size))
    batch = training.stack_models(per_seed)
    batch.update({f"val_{f}": v for f, v in training.stack_models(vals).items()})
    batch["source"] = source
    return batch

  return training.Batches(generate, size)


# ---------------------------------------------------------------------------------------------------
# The outer step (Alg. 1)
# ---------------------------------------------------------------------------------------------------


def target_gradient(config, task: Task, params, val_inputs, train_inputs, source, alpha):
  """`grad [l_val + beta L_train](w^{t+1})` over all parameters or the head; and `l_val`."""

  def objective(p):
    val = task.example_losses(p, val_inputs).mean()
    if not config.fastmix.beta:
      return val, val
    train = mixture.weighted_loss(task.example_losses(p, train_inputs), source, alpha)
    return val + config.fastmix.beta * train, val

  if config.fastmix.hypergradient == "head":
    grad_fn = jax.grad(lambda h: objective(tasks_lib.with_head(params, h)), has_aux=True)
    return grad_fn(tasks_lib.head_of(params))
  return jax.grad(objective, has_aux=True)(params)


def outer_round(config, task: Task, state, train, val_inputs, *, source):
  """One outer iteration of one replicate: `train` fields `[n1, B, ...]`, `val_inputs` `[B, ...]`."""
  n1, k = config.fastmix.inner_steps, task.num_sources
  optimizer = training.inner_optimizer(config, config.steps)
  alpha = mixture.mixture_weights(state["logits"])

  def inner(carry, inputs):
    params, opt_state, loss = training.weighted_update(
      task, optimizer, *carry, inputs, source, alpha
    )
    return (params, opt_state), loss

  first = jax.tree.map(lambda x: x[:-1], train)
  last = jax.tree.map(lambda x: x[-1], train)
  (params, opt_state), losses = jax.lax.scan(inner, (state["params"], state["opt_state"]), first)

  def source_mean(p, inputs):
    return task.example_losses(p, inputs).mean()

  grouped = tasks_lib.group_by_source(last, k)
  source_losses, source_grads = jax.vmap(jax.value_and_grad(source_mean), in_axes=(None, 0))(
    params, grouped
  )
  grads = jax.tree.map(lambda g: jnp.tensordot(alpha, g, axes=1), source_grads)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  inner_lr = training.inner_schedule(config, config.steps)(state["round"] * n1 + n1 - 1)
  g_target, val_loss = target_gradient(config, task, params, val_inputs, last, source, alpha)
  if config.fastmix.hypergradient == "head":
    source_grads = tasks_lib.head_of(source_grads)
  dl_dalpha = mixture.hypergradient(g_target, source_grads, inner_lr)
  f = config.fastmix
  g_z = mixture.outer_gradient(
    state["logits"], dl_dalpha, f.entropy_weight, ENTROPY_SIGNS[f.entropy_sign]
  )
  z_updates, outer_state = outer_optimizer(config).update(
    g_z, state["outer_state"], state["logits"]
  )
  logits = optax.apply_updates(state["logits"], z_updates)
  new = {
    "params": params,
    "opt_state": opt_state,
    "logits": logits,
    "outer_state": outer_state,
    "round": state["round"] + 1,
    "trajectory": state["trajectory"].at[state["round"] + 1].set(mixture.mixture_weights(logits)),
  }
  train_loss = (jnp.sum(losses) + jnp.dot(alpha, source_losses)) / n1
  metrics = {"loss": train_loss, "val_loss": val_loss, "dl_dalpha": dl_dalpha, "alpha": alpha}
  return new, metrics


def search_step(config, state, batch, rng):
  """Every replicate's outer iteration (vmapped)."""
  del rng
  task = load_task(config)
  train = {f: jnp.moveaxis(batch[f], (0, 1, 2), (2, 0, 1)) for f in task.fields}  # [R, n1, B]
  val = training.models_first({f: batch[f"val_{f}"] for f in task.fields})
  step = functools.partial(outer_round, config, task, source=batch["source"])
  state, metrics = training.map_models(config, step, state, train, val)
  alpha = metrics["alpha"].mean(0)
  out = {"loss": metrics["loss"].mean(), "val_loss": metrics["val_loss"].mean()}
  out.update({f"alpha/{name}": alpha[i] for i, name in enumerate(task.source_names)})
  out["alpha_entropy"] = -mixture.negative_entropy(alpha)
  return state, out


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


def found_mixtures(state) -> np.ndarray:
  """`[R, K]` softmax(z) of every replicate: the final mixture, as the official code saves it."""
  return np.asarray(mixture.mixture_weights(state["logits"]), np.float64)


def mixture_results(task: Task, found: np.ndarray, prefix: str = "") -> dict:
  """The found mixtures against the known optimum (when there is one) and the ideal proxy."""
  out = {f"{prefix}mixture": found}
  if task.optimum is not None:
    errors = np.abs(found - task.optimum[None]).sum(-1)
    unused = task.optimum == 0
    out[f"{prefix}mixture_l1_error"] = float(errors.mean())
    out[f"{prefix}mixture_l1_error/seeds"] = errors
    if len(errors) > 1:
      out[f"{prefix}mixture_l1_error_stderr"] = float(errors.std(ddof=1) / np.sqrt(len(errors)))
    out[f"{prefix}unused_source_weight"] = float(found[:, unused].sum(-1).mean())
  if task.ideal_loss is not None:
    out[f"{prefix}ideal_target_loss"] = float(np.mean([task.ideal_loss(a) for a in found]))
    if task.optimum is not None:
      out[f"{prefix}ideal_oracle_loss"] = task.ideal_loss(task.optimum)
  return out


def evaluate(config, state, inputs) -> dict:
  task = load_task(config)
  found = found_mixtures(state)
  results = mixture_results(task, found)
  trajectory = np.asarray(state["trajectory"])
  results["trajectory"] = trajectory
  average = trajectory[:, trajectory.shape[1] // 2 :].mean(1)
  if task.optimum is not None:
    results["average_mixture_l1_error"] = float(np.abs(average - task.optimum).sum(-1).mean())
  results["search_cost_steps"] = search_cost_steps(config)
  results["search_seconds"] = search_seconds(config, state)
  return results


def search_seconds(config, state) -> float:
  task = load_task(config)
  batch = search_batches(config, task).batch(0)
  per_step = training.seconds_per_step(
    config,
    "search",
    functools.partial(search_step, config),
    state,
    batch,
    config.eval.timing_repeats,
  )
  return per_step * num_rounds(config)


def outputs(config, state, inputs) -> dict:
  return {
    "alpha": jnp.asarray(found_mixtures(state), jnp.float32),
    "cost_steps": jnp.asarray(search_cost_steps(config)),
    "seconds": jnp.asarray(search_seconds(config, state)),
  }


def phase(config) -> Phase:
  task = load_task(config)
  return Phase(
    name="search",
    num_steps=num_rounds(config),
    init=functools.partial(init_state, config),
    step=functools.partial(search_step, config),
    data=lambda inputs: search_batches(config, task),
    evaluate=lambda state, rng, inputs: evaluate(config, state, inputs),
    outputs=lambda state, inputs: outputs(config, state, inputs),
  )
