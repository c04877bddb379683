"""The baselines in the same code: RegMix-lite, CLIMB-lite, DoReMi-lite and the brute-force sweep.

Every proxy here is the FastMix proxy (same model, optimiser, steps and training stream), trained on
the reparametrised loss `sum_i alpha_i L_i` over the same uniform per-source batches, so a proxy
costs exactly one FastMix-sized run and the methods differ only in how they choose mixtures. The
proxies of a phase are one vmapped stack, never a Python loop.

  regmix  `regmix.num_proxies` proxies on RegMix's Dirichlet mixtures; each proxy's target loss is
          its mean loss on the fixed validation set; a regressor (`regmix.regressor`, see
          `core/mixture.py`; the other regressors' curves are reported too) maps mixture -> loss;
          the answer is the mean of the `regmix.top_k` best-predicted of `regmix.num_candidates`
          simulated mixtures. The same fit on the first n proxies, for n in
          `regmix.proxy_counts`, gives the quality-cost curve; with `compare_with` the phase also
          reports the cost RegMix needs to match FastMix's L1 error (`cost_ratio_vs_regmix`).
  sweep   the brute-force reference: every mixture of `sweep.active_sources` on a lattice of step
          1 / `sweep.resolution`; the answer is the proxy with the lowest target loss.
  climb   `len(climb.proxies_per_round)` phases; round 0 draws RegMix mixtures, round r > 0 fits
          the regressor to every earlier proxy and trains the `proxies_per_round[r]` best-predicted
          of `climb.num_candidates` draws around the best proxy so far, the region narrowing by
          `climb.concentration_growth` per round; the answer is the mean of the `climb.top_k`
          best-predicted draws around the best proxy after the last round.
  doremi  a reference proxy on the uniform mixture, then a proxy trained with Group-DRO weights:
          per step the per-source excess loss `mean_tokens max(l_proxy - l_ref, 0)` moves the
          weights by `doremi_update`; the answer is the weights' average over the run. It targets
          the worst source's excess loss, not the target (no validation data).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import mixture
from methods.base import Phase, cached_per_config
from methods.fastmix import search, training
from methods.fastmix import tasks as tasks_lib
from methods.fastmix.tasks import load_task

# ---------------------------------------------------------------------------------------------------
# A stack of proxies on given mixtures
# ---------------------------------------------------------------------------------------------------


def proxies_init(config, count: int, mixtures_fn, rng, inputs) -> dict:
  task = load_task(config)
  key_mix, key_model = jax.random.split(rng)
  optimizer = training.inner_optimizer(config, config.steps)
  params, opt_state = training.init_stack(task, optimizer, key_model, count)
  mixtures = jnp.asarray(mixtures_fn(key_mix, inputs), jnp.float32)
  return {"params": params, "opt_state": opt_state, "mixtures": mixtures}


def proxies_step(config, state, batch, rng):
  del rng
  task = load_task(config)
  optimizer = training.inner_optimizer(config, config.steps)
  params, opt_state, losses = training.stacked_weighted_step(
    config, task, optimizer, state["params"], state["opt_state"], batch, state["mixtures"]
  )
  new = {"params": params, "opt_state": opt_state, "mixtures": state["mixtures"]}
  return new, {"loss": losses.mean(), "loss_spread": losses.max() - losses.min()}


def proxy_losses(config, state) -> np.ndarray:
  """`[M]`: every proxy's mean loss on the fixed validation set (its target loss)."""
  return training.stacked_means(config, state["params"], load_task(config).validation_set)


def proxies_cost_steps(config, count: int) -> float:
  task = load_task(config)
  scoring = training.eval_cost_steps(config, task, config.eval.num_examples, count)
  return float(count * config.steps + scoring)


def proxies_seconds(config, name: str, state) -> float:
  task = load_task(config)
  batch = training.stratified_batches(config, task).batch(0)
  step = functools.partial(proxies_step, config)
  per_step = training.seconds_per_step(config, name, step, state, batch, config.eval.timing_repeats)
  return per_step * config.steps


def proxies_phase(config, name, count, mixtures_fn, evaluate, outputs) -> Phase:
  task = load_task(config)
  return Phase(
    name=name,
    num_steps=config.steps,
    init=functools.partial(proxies_init, config, count, mixtures_fn),
    step=functools.partial(proxies_step, config),
    data=lambda inputs: training.stratified_batches(config, task),
    evaluate=lambda state, rng, inputs: evaluate(state, inputs),
    outputs=lambda state, inputs: outputs(state, inputs),
  )


def _found(alpha: np.ndarray, cost_steps: float, seconds: float) -> dict:
  """What a search hands to the retraining phase (and to the comparison with FastMix)."""
  return {
    "alpha": jnp.asarray(alpha, jnp.float32)[None],
    "cost_steps": jnp.asarray(cost_steps),
    "seconds": jnp.asarray(seconds),
  }


# ---------------------------------------------------------------------------------------------------
# RegMix
# ---------------------------------------------------------------------------------------------------


def regmix_sampler(config, key, count: int) -> jax.Array:
  r = config.regmix
  return mixture.regmix_mixtures(
    key,
    load_task(config).data_prior,
    count,
    temperature=r.temperature,
    min_strength=r.min_strength,
    max_strength=r.max_strength,
    num_strengths=r.num_strengths,
    minimum=r.minimum,
    max_usage=r.max_usage,
  )


@cached_per_config(maxsize=8)
def _regmix_fit_fn(config, regressor: str):
  """Jitted `(mixtures [M, K], losses [M], used [M]) -> alpha [K]` (RegMix's regression + pick)."""
  candidates = regmix_sampler(config, jax.random.key(config.seed + 1), config.regmix.num_candidates)

  def fit(mixtures, losses, used):
    model = mixture.fit_regressor(regressor, mixtures, losses, weights=used)
    return mixture.regmix_select(model, candidates, config.regmix.top_k)

  return jax.jit(fit)


def regmix_answer(config, mixtures, losses, count: int, regressor: str = "") -> np.ndarray:
  """RegMix's mixture from the first `count` proxies."""
  used = (np.arange(len(losses)) < count).astype(np.float32)
  fit = _regmix_fit_fn(config, regressor or config.regmix.regressor)
  return np.asarray(fit(mixtures, losses, used), np.float64)


def regmix_curve(config, mixtures, losses, regressor: str = "") -> dict:
  """The answer, its L1 error and cost for the first n proxies, n in `regmix.proxy_counts` and
  all of them (the last entry: the run's answer)."""
  task = load_task(config)
  counts = [n for n in config.regmix.proxy_counts if n < len(losses)] + [len(losses)]
  answers = np.stack([regmix_answer(config, mixtures, losses, n, regressor) for n in counts])
  curve = {
    "counts": np.asarray(counts, np.float64),
    "cost_steps": np.asarray([proxies_cost_steps(config, n) for n in counts]),
    "mixtures": answers,
  }
  if task.optimum is not None:
    curve["l1_error"] = np.abs(answers - task.optimum[None]).sum(-1)
  if task.ideal_loss is not None:
    curve["ideal_target_loss"] = np.asarray([task.ideal_loss(a) for a in answers])
  return curve


def cost_ratio(config, curve: dict, fastmix_l1: float, fastmix_cost: float, seconds: dict) -> dict:
  """What RegMix spends to reach FastMix's L1 error (+ `regmix.quality_slack`): the smallest n of
  the curve that does, or (a lower bound) the largest n when none does."""
  reached = np.nonzero(curve["l1_error"] <= fastmix_l1 + config.regmix.quality_slack)[0]
  index = int(reached[0]) if len(reached) else len(curve["counts"]) - 1
  n = curve["counts"][index]
  return {
    "regmix_matched": float(len(reached) > 0),
    "regmix_proxies_to_match": float(n),
    "cost_ratio_vs_regmix": float(curve["cost_steps"][index] / fastmix_cost),
    "wallclock_ratio_vs_regmix": float(
      seconds["regmix"] * n / max(curve["counts"][-1], 1) / max(seconds["fastmix"], 1e-9)
    ),
  }


def regmix_phase(config, name: str = "regmix", prefix: str = "", compare_with: str = "") -> Phase:
  """RegMix's proxies; `prefix` names its results when it runs beside FastMix (`compare_with`)."""
  count = config.regmix.num_proxies

  def evaluate(state, inputs):
    task = load_task(config)
    mixtures, losses = np.asarray(state["mixtures"]), proxy_losses(config, state)
    curve = regmix_curve(config, mixtures, losses)
    found = curve["mixtures"][-1][None]
    results = search.mixture_results(task, found, prefix)
    results.update({f"{prefix}curve_{k}": v for k, v in curve.items()})
    for other in mixture.REGRESSORS:
      if other != config.regmix.regressor:
        extra = regmix_curve(config, mixtures, losses, other)
        results.update({f"{prefix}curve_{other}_{k}": v for k, v in extra.items() if k != "counts"})
    results[f"{prefix}proxy_mixtures"] = mixtures
    results[f"{prefix}proxy_losses"] = losses
    results[f"{prefix}search_cost_steps"] = proxies_cost_steps(config, count)
    results[f"{prefix}search_seconds"] = proxies_seconds(config, name, state)
    if compare_with and task.optimum is not None:
      fastmix = inputs[compare_with]
      fastmix_l1 = float(np.abs(np.asarray(fastmix["alpha"]) - task.optimum).sum(-1).mean())
      seconds = {"regmix": results[f"{prefix}search_seconds"], "fastmix": float(fastmix["seconds"])}
      results.update(cost_ratio(config, curve, fastmix_l1, float(fastmix["cost_steps"]), seconds))
    return results

  def outputs(state, inputs):
    losses = proxy_losses(config, state)
    alpha = regmix_answer(config, np.asarray(state["mixtures"]), losses, count)
    cost, seconds = proxies_cost_steps(config, count), proxies_seconds(config, name, state)
    return _found(alpha, cost, seconds)

  return proxies_phase(
    config,
    name,
    count,
    lambda key, inputs: regmix_sampler(config, key, count),
    evaluate,
    outputs,
  )


# ---------------------------------------------------------------------------------------------------
# Brute-force sweep
# ---------------------------------------------------------------------------------------------------


def sweep_mixtures(config) -> np.ndarray:
  task = load_task(config)
  active = tuple(config.sweep.active_sources) or tuple(range(task.num_sources))
  return mixture.simplex_lattice(task.num_sources, active, config.sweep.resolution)


def sweep_phase(config) -> Phase:
  points = sweep_mixtures(config)
  count = len(points)

  def evaluate(state, inputs):
    task = load_task(config)
    losses = proxy_losses(config, state)
    best = points[int(np.argmin(losses))]
    results = search.mixture_results(task, best[None])
    results["proxy_mixtures"] = points
    results["proxy_losses"] = losses
    if task.ideal_loss is not None:
      ideal = np.asarray([task.ideal_loss(p) for p in points])
      results["proxy_ideal_losses"] = ideal
      results["ideal_best_mixture"] = points[int(np.argmin(ideal))]
    results["search_cost_steps"] = proxies_cost_steps(config, count)
    results["search_seconds"] = proxies_seconds(config, "sweep", state)
    return results

  def outputs(state, inputs):
    best = points[int(np.argmin(proxy_losses(config, state)))]
    cost, seconds = proxies_cost_steps(config, count), proxies_seconds(config, "sweep", state)
    return _found(best, cost, seconds)

  return proxies_phase(
    config, "sweep", count, lambda key, inputs: jnp.asarray(points), evaluate, outputs
  )


# ---------------------------------------------------------------------------------------------------
# CLIMB
# ---------------------------------------------------------------------------------------------------


def climb_name(r: int) -> str:
  return f"climb_{r}"


def _history(inputs, rounds: int):
  mixtures = jnp.concatenate([inputs[climb_name(r)]["mixtures"] for r in range(rounds)])
  losses = jnp.concatenate([inputs[climb_name(r)]["losses"] for r in range(rounds)])
  return mixtures, losses


def climb_candidates(config, key, mixtures, losses, rounds_done: int, count: int) -> jax.Array:
  """The `count` best-predicted draws around the best proxy so far (round `rounds_done`)."""
  c = config.climb
  model = mixture.fit_regressor(config.regmix.regressor, mixtures, losses)
  centre = mixtures[jnp.argmin(losses)]
  concentration = c.concentration * c.concentration_growth ** (rounds_done - 1)
  draws = mixture.climb_candidates(key, centre, concentration, c.num_candidates, c.floor)
  return mixture.top_predicted(model, draws, count)


def climb_round_mixtures(config, r: int, key, inputs) -> jax.Array:
  count = config.climb.proxies_per_round[r]
  if r == 0:
    return regmix_sampler(config, key, count)
  mixtures, losses = _history(inputs, r)
  return climb_candidates(config, key, mixtures, losses, r, count)


def climb_phases(config) -> list[Phase]:
  rounds = len(config.climb.proxies_per_round)
  phases = []
  for r in range(rounds):
    count = config.climb.proxies_per_round[r]
    last = r == rounds - 1
    phases.append(
      proxies_phase(
        config,
        climb_name(r),
        count,
        functools.partial(climb_round_mixtures, config, r),
        functools.partial(_climb_evaluate, config, r, last),
        functools.partial(_climb_outputs, config, r, last),
      )
    )
  return phases


def _climb_answer(config, r: int, state, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The final mixture from every round's proxies: mean of the `top_k` best-predicted draws."""
  earlier = [inputs[climb_name(i)] for i in range(r)]
  mixtures = np.concatenate([np.asarray(e["mixtures"]) for e in earlier] + [state["mixtures"]])
  losses = np.concatenate(
    [np.asarray(e["losses"]) for e in earlier] + [proxy_losses(config, state)]
  )
  key = jax.random.key(config.seed + 2)
  top = climb_candidates(config, key, mixtures, losses, r + 1, config.climb.top_k)
  return np.asarray(top, np.float64).mean(0), mixtures, losses


def _climb_cost(config, r: int, state) -> tuple[float, float]:
  """Steps of every round, and their wall-clock scaled from the last round's by proxy count."""
  counts = config.climb.proxies_per_round
  seconds = proxies_seconds(config, climb_name(r), state) * sum(counts) / counts[r]
  return proxies_cost_steps(config, sum(counts)), seconds


def _climb_evaluate(config, r: int, last: bool, state, inputs) -> dict:
  losses = proxy_losses(config, state)
  if not last:
    return {f"{climb_name(r)}_best_loss": float(losses.min())}
  task = load_task(config)
  answer, mixtures, all_losses = _climb_answer(config, r, state, inputs)
  results = search.mixture_results(task, answer[None])
  results["proxy_mixtures"] = mixtures
  results["proxy_losses"] = all_losses
  results["search_cost_steps"], results["search_seconds"] = _climb_cost(config, r, state)
  return results


def _climb_outputs(config, r: int, last: bool, state, inputs) -> dict:
  out = {"mixtures": state["mixtures"], "losses": jnp.asarray(proxy_losses(config, state))}
  if last:
    answer, _, _ = _climb_answer(config, r, state, inputs)
    out.update(_found(answer, *_climb_cost(config, r, state)))
  return out


# ---------------------------------------------------------------------------------------------------
# DoReMi
# ---------------------------------------------------------------------------------------------------


def doremi_init(config, rng, inputs) -> dict:
  task = load_task(config)
  params = task.init_params(rng)
  k = task.num_sources
  return {
    "params": params,
    "opt_state": training.inner_optimizer(config, config.steps).init(params),
    "alpha": jnp.full((k,), 1.0 / k),
    "alpha_sum": jnp.zeros((k,)),
    "reference": jax.tree.map(lambda x: x[0], inputs["reference"]["params"]),
  }


def doremi_step(config, state, batch, rng):
  """DoReMi Alg. 1: excess losses per source -> new weights -> one proxy step on them."""
  del rng
  task = load_task(config)
  d = config.doremi
  inputs = {f: batch[f] for f in task.fields}
  grouped = tasks_lib.group_by_source(inputs, task.num_sources)
  reference = jax.vmap(task.token_losses, in_axes=(None, 0))(state["reference"], grouped)
  proxy = jax.vmap(task.token_losses, in_axes=(None, 0))(state["params"], grouped)
  excess = jnp.maximum(proxy - reference, 0.0).mean(axis=(1, 2))
  alpha = mixture.doremi_update(state["alpha"], excess, d.step_size, d.smoothing)
  optimizer = training.inner_optimizer(config, config.steps)
  params, opt_state, loss = training.weighted_update(
    task, optimizer, state["params"], state["opt_state"], inputs, batch["source"], alpha
  )
  new = dict(state, params=params, opt_state=opt_state, alpha=alpha)
  new["alpha_sum"] = state["alpha_sum"] + alpha
  return new, {"loss": loss, "excess": excess.mean()}


def doremi_answer(config, state) -> np.ndarray:
  return np.asarray(state["alpha_sum"] / config.steps, np.float64)


def doremi_cost_steps(config) -> float:
  return float(2 * config.steps + training.FORWARD_COST * config.steps)


def doremi_seconds(config, state, inputs) -> float:
  task = load_task(config)
  batch = training.stratified_batches(config, task).batch(0)
  step = functools.partial(doremi_step, config)
  reference = training.seconds_per_step(
    config,
    "reference",
    functools.partial(proxies_step, config),
    _uniform_stack_state(config, inputs),
    batch,
    config.eval.timing_repeats,
  )
  proxy = training.seconds_per_step(
    config, "doremi", step, state, batch, config.eval.timing_repeats
  )
  return (reference + proxy) * config.steps


def _uniform_stack_state(config, inputs) -> dict:
  ref = inputs["reference"]
  return {"params": ref["params"], "opt_state": ref["opt_state"], "mixtures": ref["mixtures"]}


def doremi_phases(config) -> list[Phase]:
  task = load_task(config)
  k = task.num_sources

  def reference_evaluate(state, inputs):
    return {"reference_loss": float(proxy_losses(config, state)[0])}

  reference = proxies_phase(
    config,
    "reference",
    1,
    lambda key, inputs: jnp.full((1, k), 1.0 / k),
    reference_evaluate,
    lambda state, inputs: state,
  )

  def evaluate(state, rng, inputs):
    results = search.mixture_results(task, doremi_answer(config, state)[None])
    results["doremi_final_weights"] = np.asarray(state["alpha"])
    results["search_cost_steps"] = doremi_cost_steps(config)
    results["search_seconds"] = doremi_seconds(config, state, inputs)
    return results

  def outputs(state, inputs):
    return {
      "alpha": jnp.asarray(doremi_answer(config, state), jnp.float32)[None],
      "cost_steps": jnp.asarray(doremi_cost_steps(config)),
      "seconds": jnp.asarray(doremi_seconds(config, state, inputs)),
    }

  proxy = Phase(
    name="doremi",
    num_steps=config.steps,
    init=functools.partial(doremi_init, config),
    step=functools.partial(doremi_step, config),
    data=lambda inputs: training.stratified_batches(config, task),
    evaluate=evaluate,
    outputs=outputs,
  )
  return [reference, proxy]
