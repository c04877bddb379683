"""What every phase shares: the proxy's optimiser, data sources, stacked models, evaluation, timing.

Costs are counted in training steps: one forward and backward pass over a training batch of
`K * data.rows_per_source` examples is 1 step; a forward-only pass counts 1/3 (a backward costs
about two forwards). Wall-clock is the median time of the compiled step times the number of steps,
measured after the phase on this machine (compilation excluded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import mixture
from kernels.timing import median_seconds
from methods.base import cached_per_config, config_key
from methods.fastmix.tasks import Batch, Task, load_task

FORWARD_COST = 1.0 / 3.0


def batch_rows(config, task: Task | None = None) -> int:
  """Examples per training step: `K * rows_per_source` (stratified, the same for every method)."""
  task = task or load_task(config)
  return task.num_sources * config.data.rows_per_source


# ---------------------------------------------------------------------------------------------------
# Optimisers
# ---------------------------------------------------------------------------------------------------


def inner_schedule(config, total_steps: int) -> optax.Schedule:
  """Linear warmup, then constant or cosine decay to `final_fraction` of the peak."""
  o = config.optim
  warmup = min(o.warmup_steps, total_steps // 2)
  if o.schedule == "constant":
    return optax.join_schedules(
      [
        optax.linear_schedule(0.0, o.learning_rate, max(warmup, 1)),
        optax.constant_schedule(o.learning_rate),
      ],
      [warmup],
    )
  return optax.warmup_cosine_decay_schedule(
    0.0, o.learning_rate, warmup, total_steps, end_value=o.learning_rate * o.final_fraction
  )


def inner_optimizer(config, total_steps: int) -> optax.GradientTransformation:
  """AdamW (b2 = `optim.b2`) with global-norm clipping: the proxy's optimiser in every method."""
  o = config.optim
  return optax.chain(
    optax.clip_by_global_norm(o.grad_clip),
    optax.adamw(inner_schedule(config, total_steps), b2=o.b2, weight_decay=o.weight_decay),
  )


# ---------------------------------------------------------------------------------------------------
# Data sources (leading axis = the global batch, as the loop shards it)
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Batches:
  """`generate(step) -> {field: [B, ...]}` with each process keeping its rows."""

  generate: Callable[[int], Batch]
  global_batch_size: int

  def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
    rows = self.global_batch_size // process_count
    part = slice(process_index * rows, (process_index + 1) * rows)
    return {name: value[part] for name, value in self.generate(step).items()}


def stratified_batches(config, task: Task, stream: int = 0) -> Batches:
  """The shared training stream: `rows_per_source` examples of every source per step."""
  rows = config.data.rows_per_source
  return Batches(lambda step: task.stratified(stream, step, rows), batch_rows(config, task))


def stack_models(batches: list[Batch]) -> Batch:
  """Per-model batches `[B, ...]` as one batch `[B, models, ...]`."""
  return {name: np.stack([b[name] for b in batches], axis=1) for name in batches[0]}


def models_first(inputs: Batch) -> Batch:
  """`[B, models, ...]` -> `[models, B, ...]` inside a step."""
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), inputs)


# ---------------------------------------------------------------------------------------------------
# Stacked models
# ---------------------------------------------------------------------------------------------------


def map_models(config, fn: Callable, *stacked):
  """`fn` over the leading (model) axis of `stacked`: vmapped in groups of `config.stack_chunk`
  (0 = all at once), the groups in a compiled loop (`jax.lax.map`). XLA:CPU runs a batched matmul
  several times slower than a loop of the same small matmuls, so CPU configs map one model at a time."""
  chunk = config.stack_chunk
  count = jax.tree.leaves(stacked)[0].shape[0]
  if chunk == 0 or chunk >= count:
    return jax.vmap(fn)(*stacked)
  return jax.lax.map(lambda args: fn(*args), stacked, batch_size=chunk)


# ---------------------------------------------------------------------------------------------------
# Stacked proxies trained on loss weights (RegMix, CLIMB, the sweep, DoReMi's reference)
# ---------------------------------------------------------------------------------------------------


def init_stack(task: Task, optimizer, rng, count: int):
  """`count` independently initialised models and their optimiser states, stacked."""
  params = jax.vmap(task.init_params)(jax.random.split(rng, count))
  return params, jax.vmap(optimizer.init)(params)


def weighted_update(task: Task, optimizer, params, opt_state, inputs, source, alpha):
  """One optimiser step on `weighted_loss` (Sec. 3.1's reparametrisation) of one model."""

  def loss_fn(p):
    return mixture.weighted_loss(task.example_losses(p, inputs), source, alpha)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def stacked_weighted_step(config, task: Task, optimizer, params, opt_state, batch, mixtures):
  """Every stacked model one step on the same stratified batch, each with its own loss weights."""
  inputs = {f: batch[f] for f in task.fields}

  def step(p, o, alpha):
    return weighted_update(task, optimizer, p, o, inputs, batch["source"], alpha)

  return map_models(config, step, params, opt_state, mixtures)


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=8)
def _chunk_fn(config, kind: str):
  task = load_task(config)
  per_example = task.example_losses if kind == "loss" else task.example_correct
  return jax.jit(lambda params, x: map_models(config, lambda p: per_example(p, x), params))


def stacked_means(config, params, inputs: Batch, kind: str = "loss") -> np.ndarray:
  """`[models]`: the mean per-example loss (or accuracy) of each stacked model over `inputs`, in
  chunks of `eval.batch_size` (the last one padded; one compilation)."""
  fn, size = _chunk_fn(config, kind), config.eval.batch_size
  count = len(next(iter(inputs.values())))
  total = 0.0
  for start in range(0, count, size):
    rows = min(size, count - start)
    chunk = {
      k: np.concatenate([v[start : start + rows], np.repeat(v[start : start + 1], size - rows, 0)])
      for k, v in inputs.items()
    }
    total = total + np.asarray(fn(params, chunk), np.float64)[:, :rows].sum(axis=1)
  return total / count


def eval_cost_steps(config, task: Task, count: int, models: int) -> float:
  """Training-step equivalents of scoring `models` models on `count` examples (forward only)."""
  return FORWARD_COST * models * count / batch_rows(config, task)


# ---------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------

_SECONDS: dict = {}


def seconds_per_step(config, phase: str, step: Callable, state, batch, repeats: int) -> float:
  """Median wall time of one compiled call of `step(state, batch, rng)` (cached per config and
  phase, so a phase's evaluation and its outputs share one measurement)."""
  key = (config_key(config), phase)
  if key not in _SECONDS:
    batch = jax.tree.map(jnp.asarray, batch)
    fn = jax.jit(step)
    _SECONDS[key] = median_seconds(fn, state, batch, jax.random.key(0), repeats=repeats)
  return _SECONDS[key]
