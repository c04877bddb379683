"""Which phases a run makes (`config.mixer`), and the retraining phase every run ends with.

  fastmix  search [+ regmix, with `compare_regmix`: RegMix's proxies, for `cost_ratio_vs_regmix`]
  regmix   regmix
  climb    climb_0 .. climb_{R-1}
  doremi   reference, doremi
  sweep    sweep
  uniform  (nothing to search)
  oracle   (nothing to search: the known optimum)
and then `retrain`: fresh proxies-sized models trained on the found mixture(s) and on the task's
reference mixtures (markov: the known optimum, whose loss is `oracle_loss`), `retrain.num_seeds`
seeds each, every model on batches *sampled* from its mixture (a source per example drawn from
alpha, the way a found mixture is used), all as one vmapped stack. Seed s of every mixture uses the
same random stream, so the loss differences between mixtures are paired.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from methods.base import Phase
from methods.fastmix import baselines, search, training
from methods.fastmix import tasks as tasks_lib
from methods.fastmix.tasks import Task, load_task

MIXERS = ("fastmix", "regmix", "climb", "doremi", "sweep", "uniform", "oracle")


def search_phases(config) -> tuple[list[Phase], str | None]:
  """The mixer's phases and the name of the one whose outputs hold the found mixture."""
  mixer = config.mixer
  if mixer == "fastmix":
    phases = [search.phase(config)]
    if config.compare_regmix:
      phases.append(baselines.regmix_phase(config, "regmix", "regmix_", compare_with="search"))
    return phases, "search"
  if mixer == "regmix":
    return [baselines.regmix_phase(config)], "regmix"
  if mixer == "climb":
    phases = baselines.climb_phases(config)
    return phases, phases[-1].name
  if mixer == "doremi":
    return baselines.doremi_phases(config), "doremi"
  if mixer == "sweep":
    return [baselines.sweep_phase(config)], "sweep"
  return [], None


def phases(config) -> list[Phase]:
  found_phase_list, found = search_phases(config)
  return found_phase_list + [retrain_phase(config, found)]


# ---------------------------------------------------------------------------------------------------
# Retraining on the found mixture
# ---------------------------------------------------------------------------------------------------


def fixed_mixture(config, task: Task) -> np.ndarray:
  """The mixture of a run that searches nothing: uniform, or the known optimum."""
  if config.mixer == "oracle":
    return task.optimum
  return np.full(task.num_sources, 1.0 / task.num_sources)


def found_mixtures(config, task: Task, found: str | None, inputs) -> np.ndarray:
  """`[R, K]`: the search's answers (one per replicate)."""
  if found is None:
    return fixed_mixture(config, task)[None]
  return np.asarray(inputs[found]["alpha"], np.float64)


def retrain_mixtures(config, task: Task, found: str | None, inputs) -> np.ndarray:
  """`[R + Q, K]`: the found mixtures, then the task's references."""
  searched = found_mixtures(config, task, found, inputs)
  references = [np.asarray(task.references[name], np.float64) for name in task.references]
  return np.concatenate([searched] + [r[None] for r in references])


def retrain_steps(config) -> int:
  return config.retrain.steps or config.steps


def retrain_init(config, found, rng, inputs) -> dict:
  task = load_task(config)
  searched = inputs[found]["alpha"].shape[0] if found else 1  # static under jit
  count = (searched + len(task.references)) * config.retrain.num_seeds
  seeds = jnp.arange(count) % config.retrain.num_seeds
  keys = jax.vmap(lambda s: jax.random.fold_in(rng, s))(seeds)  # seed s: one init for every mixture
  params = jax.vmap(task.init_params)(keys)
  optimizer = training.inner_optimizer(config, retrain_steps(config))
  return {"params": params, "opt_state": jax.vmap(optimizer.init)(params)}


def retrain_batches(config, task: Task, mixtures: np.ndarray) -> training.Batches:
  """Model `m * S + s` reads stream `RETRAIN + 10 s` of its mixture: `[B, models, ...]`."""
  size, seeds = training.batch_rows(config, task), config.retrain.num_seeds

  def generate(step: int):
    batches = [
      task.mixture(alpha, tasks_lib.RETRAIN + 10 * s, step, size)
      for alpha in mixtures
      for s in range(seeds)
    ]
    return training.stack_models(batches)

  return training.Batches(generate, size)


def retrain_step(config, state, batch, rng):
  del rng
  task = load_task(config)
  optimizer = training.inner_optimizer(config, retrain_steps(config))
  inputs = training.models_first({f: batch[f] for f in task.fields})

  def one(params, opt_state, x):
    loss, grads = jax.value_and_grad(lambda p: task.example_losses(p, x).mean())(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params, opt_state, losses = training.map_models(
    config, one, state["params"], state["opt_state"], inputs
  )
  return {"params": params, "opt_state": opt_state}, {"loss": losses.mean()}


def _per_mixture(values: np.ndarray, seeds: int) -> np.ndarray:
  return values.reshape(-1, seeds)


def retrain_evaluate(config, found, state, inputs) -> dict:
  """Target (test) loss of each found mixture's models and of each reference's, paired by seed."""
  task = load_task(config)
  seeds = config.retrain.num_seeds
  losses = _per_mixture(training.stacked_means(config, state["params"], task.test_set), seeds)
  count = len(found_mixtures(config, task, found, inputs))
  results = {"target_loss": float(losses[:count].mean()), "target_loss/models": losses[:count]}
  if found is None:
    results.update(search.mixture_results(task, found_mixtures(config, task, None, inputs)))
    results["search_cost_steps"], results["search_seconds"] = 0.0, 0.0
  for q, name in enumerate(task.references):
    reference = losses[count + q]
    results[f"{name}_loss"] = float(reference.mean())
    results[f"{name}_loss/seeds"] = reference
    gap = losses[:count] - reference[None]
    results[f"target_minus_{name}_loss"] = float(gap.mean())
    if gap.size > 1:
      results[f"target_minus_{name}_loss_stderr"] = float(gap.std(ddof=1) / np.sqrt(gap.size))
  if task.example_correct is not None:
    accuracy = training.stacked_means(config, state["params"], task.test_set, kind="correct")
    accuracy = _per_mixture(accuracy, seeds)
    results["target_accuracy"] = float(accuracy[:count].mean())
    for q, name in enumerate(task.references):
      results[f"{name}_accuracy"] = float(accuracy[count + q].mean())
  if "oracle" in task.references:
    results["target_excess_over_oracle"] = results["target_loss"] / results["oracle_loss"] - 1.0
  return results


def retrain_phase(config, found: str | None) -> Phase:
  task = load_task(config)
  return Phase(
    name="retrain",
    num_steps=retrain_steps(config),
    init=functools.partial(retrain_init, config, found),
    step=functools.partial(retrain_step, config),
    data=lambda inputs: retrain_batches(
      config, task, retrain_mixtures(config, task, found, inputs)
    ),
    evaluate=lambda state, rng, inputs: retrain_evaluate(config, found, state, inputs),
  )
