"""Kernel PPO's phase `train`: the problem sizes, the four agents' policies and updates, the jitted
rollout-and-update unit vmapped over (exponent x seed), and the evaluation (final returns, learning
curves, throughput). The paper and the choices made are in `methods/kernel_ppo/__init__.py`."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import rkhs, rl
from methods.base import Phase, cached_per_config, figure_grid, with_changes

ALGORITHMS = ("nn_npg", "rff_npg", "exact_npg", "ppo")
KERNEL_ALGORITHMS = ("rff_npg", "exact_npg")

# ---------------------------------------------------------------------------------------------------
# Problem: the environment and the sizes every function needs, built once per config
# ---------------------------------------------------------------------------------------------------


class Problem(NamedTuple):
  env: Any
  env_params: Any
  spec: rl.EnvSpec
  obs_scale: tuple[float, ...]
  num_updates: int  # outer iterations k per seed (num_steps * updates_per_step)
  num_steps: int  # steps of the shared loop
  capacity: int  # rows of the per-update batch buffer (n_max, or n for fixed n)
  support: int  # rows of the exact kernel policy's expansion


@cached_per_config(maxsize=16)
def problem(config: ml_collections.ConfigDict) -> Problem:
  env, env_params, spec = rl.make_env(config.env_name)
  s, growth = config.sampling, growth_of(config)
  updates = rl.updates_within(config.env_steps, s.base, growth, s.maximum, s.base)
  num_steps = updates // config.updates_per_step
  num_updates = num_steps * config.updates_per_step
  sizes = rl.sample_sizes(max(num_updates, 1), s.base, growth, s.maximum, s.base)
  capacity = max(sizes)
  return Problem(
    env,
    env_params,
    spec,
    tuple(rl.OBS_SCALES[config.env_name]),
    num_updates,
    num_steps,
    capacity,
    sum(sizes) + capacity,
  )


def growth_of(config) -> float:
  return config.sampling.growth if config.algorithm in KERNEL_ALGORITHMS else 0.0


def powers(config) -> tuple[float, ...]:
  """The step-size exponents of the run: `schedule.power` first, then `schedule.extra_powers`."""
  return (config.schedule.power,) + tuple(config.schedule.extra_powers)


def step_size(config, k: jax.Array, power: jax.Array) -> jax.Array:
  """Delta_k = c k^power of update k = 1, 2, ... (Cor. 14); the released code's KL weight is 1/Delta_k."""
  s = config.schedule
  first = s.first_step_size if s.released_convention else None
  return s.scale * rl.npg_step_size(k, power, first)


# ---------------------------------------------------------------------------------------------------
# Policies: logits of each algorithm's agent state
# ---------------------------------------------------------------------------------------------------


def network(config, prob: Problem) -> rl.DiscreteMLP:
  extra = 1 if config.algorithm == "ppo" else 0
  return rl.DiscreteMLP(tuple(config.nn.hidden), prob.spec.num_actions + extra)


def scaled(config, prob: Problem, obs: jax.Array) -> jax.Array:
  """Observations in kernel units: divided by the environment's scale and the length scale."""
  return obs / (jnp.asarray(prob.obs_scale) * config.kernel.lengthscale)


def policy_logits(config, prob: Problem, agent, obs: jax.Array) -> jax.Array:
  """Logits of pi_k at `obs (..., d)`: the MLP, phi(s)^T Theta_k, or the kernel expansion."""
  algorithm, num_actions = config.algorithm, prob.spec.num_actions
  if algorithm == "nn_npg":
    return tempered(config, network(config, prob).apply(agent["params"], obs))
  if algorithm == "ppo":
    return network(config, prob).apply(agent["params"], obs)[..., :num_actions]
  x = scaled(config, prob, obs)
  if algorithm == "rff_npg":
    return rkhs.feature_values(agent["logit_weights"], rkhs.feature_map(agent["features"], x))
  flat = x.reshape(-1, x.shape[-1])
  return rkhs.expansion_values(agent["expansion"], flat).reshape(x.shape[:-1] + (num_actions,))


# ---------------------------------------------------------------------------------------------------
# (A) NN-NPG (the released code's loss) and clip-PPO with GAE; the losses are in `core.rl`
# ---------------------------------------------------------------------------------------------------


def tempered(config, q: jax.Array) -> jax.Array:
  """NN-NPG's policy logits f / tau of its head f = Q (`nn.policy_temperature`; tau = 1 is the
  released code's pi = softmax(Q) and leaves f untouched)."""
  tau = config.nn.policy_temperature
  return q if tau == 1.0 else q / tau


def optimizer(config) -> optax.GradientTransformation:
  return optax.adam(config.nn.learning_rate)


def epochs_of_minibatches(config, loss_fn, params, opt_state, rows: int, rng):
  """`nn.epochs` passes of Adam over minibatches of `nn.minibatch_size` rows (`core.rl.minibatch_epochs`)."""
  nn_config = config.nn
  return rl.minibatch_epochs(
    optimizer(config),
    loss_fn,
    params,
    opt_state,
    rows,
    nn_config.minibatch_size,
    nn_config.epochs,
    rng,
    nn_config.shuffle,
  )


def nn_npg_update(config, prob: Problem, agent, transitions, valid, delta, rng):
  """T epochs of the released code's joint loss (`core.rl.npg_joint_loss`) against pi_old = pi_k,
  then pi_old <- pi_{k+1}."""
  del valid  # fixed n: every row is filled
  apply_fn, nn_config = network(config, prob).apply, config.nn
  old_logits = apply_fn(agent["old_params"], transitions.obs)  # pi_old is fixed for the update
  diagnostics = {
    "q_gap": rl.q_gap(old_logits),
    "policy_entropy": jnp.mean(rl.categorical_entropy(tempered(config, old_logits))),
  }

  def loss_fn(params, indices):
    batch = jax.tree.map(lambda x: x[indices], transitions)
    return rl.npg_joint_loss(
      apply_fn,
      params,
      agent["old_params"],
      batch,
      delta,
      config.gamma,
      nn_config.value_coef,
      nn_config.entropy_coef,
      bootstrap_current_state=nn_config.quirk_bootstrap_current_state,
      time_limit_terminal=nn_config.quirk_time_limit_terminal,
      old_logits=old_logits[indices],
      temperature=nn_config.policy_temperature,
    )

  rows = transitions.reward.shape[0]
  params, opt_state, loss, aux = epochs_of_minibatches(
    config, loss_fn, agent["params"], agent["opt_state"], rows, rng
  )
  agent = {"params": params, "old_params": params, "opt_state": opt_state}
  return agent, {"loss": loss, "step_size": delta, **aux, **diagnostics}


def ppo_update(config, prob: Problem, agent, transitions, valid, delta, rng):
  """GAE (lambda) advantages on the batch, then epochs of the clipped surrogate."""
  del valid, delta
  apply_fn, params, ppo = network(config, prob).apply, agent["params"], config.ppo
  values = transitions.extras["value"]
  next_values = apply_fn(params, transitions.next_obs)[:, -1]
  advantages, targets = rl.gae(
    transitions.reward,
    values,
    next_values,
    transitions.terminated,
    transitions.done,
    config.gamma,
    ppo.gae_lambda,
  )

  def loss_fn(params, indices):
    batch = jax.tree.map(lambda x: x[indices], transitions)
    return rl.actor_critic_ppo_loss(
      apply_fn,
      params,
      batch,
      advantages[indices],
      targets[indices],
      ppo.clip,
      ppo.value_coef,
      ppo.entropy_coef,
      ppo.normalize_advantages,
    )

  params, opt_state, loss, aux = epochs_of_minibatches(
    config, loss_fn, params, agent["opt_state"], transitions.reward.shape[0], rng
  )
  # the policy entropy of the update's minibatch steps (no extra forward pass over the batch)
  info = {"loss": loss, "step_size": 0.0, **aux, "policy_entropy": aux["entropy"]}
  return {"params": params, "opt_state": opt_state}, info


# ---------------------------------------------------------------------------------------------------
# (B) RFF-kernel NPG and (C) exact-kernel NPG; kernel TD is in `core.rkhs`
# ---------------------------------------------------------------------------------------------------


def next_action_weights(config, prob: Problem, agent, next_obs, rng) -> jax.Array:
  """a1 at s1 under pi_k: its probabilities ("expected") or a one-hot draw ("sampled", Alg. 1 (i))."""
  logits = policy_logits(config, prob, agent, next_obs)
  if config.kernel.next_action == "expected":
    return jax.nn.softmax(logits)
  return jax.nn.one_hot(jax.random.categorical(rng, logits), prob.spec.num_actions)


def td_inputs(config, prob: Problem, agent, transitions, valid, rng):
  """Scaled s0, s1, action weights of a0 and a1, rewards, gamma (1 - terminal), masked rows zeroed."""
  terminal = transitions.terminated
  discounts = config.gamma * (1.0 - terminal.astype(jnp.float32)) * valid
  actions0 = jax.nn.one_hot(transitions.action, prob.spec.num_actions) * valid[:, None]
  actions1 = next_action_weights(config, prob, agent, transitions.next_obs, rng)
  rewards = transitions.reward * valid
  return (
    scaled(config, prob, transitions.obs),
    actions0,
    scaled(config, prob, transitions.next_obs),
    actions1,
    rewards,
    discounts,
  )


def td_step(config, valid) -> jax.Array:
  """eta of the sum-form iteration: `kernel.td_step_size` / n, n the filled rows of the batch."""
  return config.kernel.td_step_size / jnp.maximum(jnp.sum(valid), 1)


def rff_npg_update(config, prob: Problem, agent, transitions, valid, delta, rng):
  """Kernel TD on features for theta^(k) ~ Q^{pi_k}, then Theta_k = Theta_{k-1} + Delta_k theta^(k)."""
  x0, actions0, x1, actions1, rewards, discounts = td_inputs(
    config, prob, agent, transitions, valid, rng
  )
  features = agent["features"]
  batch = rkhs.FeatureBatch(
    rkhs.feature_map(features, x0),
    actions0,
    rkhs.feature_map(features, x1),
    actions1,
    rewards,
    discounts,
  )
  kernel, eta = config.kernel, td_step(config, valid)
  start = agent["theta"] if kernel.warm_start else jnp.zeros_like(agent["theta"])
  theta, loss = rkhs.feature_td_critic(
    batch, start, kernel.td_decay, eta, kernel.td_iterations, kernel.solver, valid
  )
  agent = {**agent, "theta": theta, "logit_weights": agent["logit_weights"] + delta * theta}
  return agent, {"loss": loss, "critic_loss": loss, "step_size": delta}


def exact_critic(config, x0, actions0, x1, actions1, rewards, discounts, valid):
  """b^(k) on one batch: the dense Grams K, C and the fixed point or the coefficient iteration."""
  kernel = config.kernel
  return rkhs.exact_td_critic(
    x0,
    actions0,
    x1,
    actions1,
    rewards,
    discounts,
    kernel.td_decay,
    td_step(config, valid),
    kernel.td_iterations,
    kernel.solver,
    valid,
  )


def exact_npg_update(config, prob: Problem, agent, transitions, valid, delta, rng):
  """f^(k) = sum_i b_i K(omega0_i, .) exactly; the policy expansion gains Delta_k b_i at (s0_i, a0_i)."""
  x0, actions0, x1, actions1, rewards, discounts = td_inputs(
    config, prob, agent, transitions, valid, rng
  )
  b, loss = exact_critic(config, x0, actions0, x1, actions1, rewards, discounts, valid)
  expansion = rkhs.expansion_append(
    agent["expansion"], x0, delta * b[:, None] * actions0, jnp.sum(valid).astype(jnp.int32)
  )
  return {**agent, "expansion": expansion}, {"loss": loss, "critic_loss": loss, "step_size": delta}


UPDATES = {
  "nn_npg": nn_npg_update,
  "ppo": ppo_update,
  "rff_npg": rff_npg_update,
  "exact_npg": exact_npg_update,
}


# ---------------------------------------------------------------------------------------------------
# One seed: init, one outer iteration, a chunk of iterations
# ---------------------------------------------------------------------------------------------------


def init_agent(config, prob: Problem, rng) -> dict:
  dim, num_actions = prob.spec.obs_dim, prob.spec.num_actions
  if config.algorithm in ("nn_npg", "ppo"):
    init_rng, old_rng = jax.random.split(rng)
    params = network(config, prob).init(init_rng, jnp.zeros((dim,)))
    agent = {"params": params, "opt_state": optimizer(config).init(params)}
    if config.algorithm == "nn_npg":
      separate = config.nn.quirk_separate_old_init
      agent["old_params"] = (
        network(config, prob).init(old_rng, jnp.zeros((dim,))) if separate else params
      )
    return agent
  if config.algorithm == "rff_npg":
    features = rkhs.random_features(rng, dim, config.kernel.num_features)
    zeros = jnp.zeros((num_actions, config.kernel.num_features))
    return {"features": features, "theta": zeros, "logit_weights": zeros}
  return {"expansion": rkhs.empty_expansion(prob.support, dim, num_actions)}


def trace_names(config) -> tuple[str, ...]:
  """What each member keeps per update k: the sum and count of the training episodes that ended in
  it and, for NN-NPG and clip-PPO, the policy entropy on its batch (NN-NPG: with pi_k before the
  update, and the Q-gap `core.rl.q_gap` of its head; clip-PPO: mean over the update's minibatch
  steps)."""
  names = ("return_sum", "episodes")
  if config.algorithm == "nn_npg":
    return names + ("policy_entropy", "q_gap")
  if config.algorithm == "ppo":
    return names + ("policy_entropy",)
  return names


def init_seed(config, prob: Problem, rng, power) -> dict:
  env_rng, agent_rng = jax.random.split(rng)
  return {
    "power": jnp.asarray(power, jnp.float32),  # this member's step-size exponent
    "agent": init_agent(config, prob, agent_rng),
    "env": rl.env_reset(prob.env, prob.env_params, env_rng),
    "update": jnp.zeros((), jnp.int32),  # outer iterations done (k - 1 at the next update)
    "env_steps": jnp.zeros((), jnp.int32),
    "loop_step": jnp.zeros((), jnp.int32),
    "last_return": jnp.full((), jnp.nan, jnp.float32),  # NaN until an episode has ended
    "curve": jnp.full((prob.num_steps,), jnp.nan, jnp.float32),  # mean training return per step
    "curve_env_steps": jnp.zeros((prob.num_steps,), jnp.int32),
    "trace": {name: jnp.zeros((prob.num_updates,), jnp.float32) for name in trace_names(config)},
  }


def act_fn(config, prob: Problem, agent) -> rl.ActFn:
  """How pi_k acts while collecting: clip-PPO also records log-probabilities and values."""
  if config.algorithm == "ppo":
    return rl.actor_critic_act(network(config, prob).apply, agent["params"])
  return rl.policy_act(lambda obs: policy_logits(config, prob, agent, obs))


def collect(config, prob: Problem, seed_state, k, rng):
  """n(k) environment steps with pi_k into a buffer of `capacity` rows; `valid` marks the filled."""
  act = act_fn(config, prob, seed_state["agent"])
  s = config.sampling
  n = rl.sample_size(k, s.base, growth_of(config), s.maximum, s.base)
  if prob.capacity == s.base:  # fixed n: one plain scan
    env, transitions = rl.rollout(prob.env, prob.env_params, act, seed_state["env"], rng, s.base)
    return env, transitions, jnp.ones((s.base,), bool), n
  env, transitions, valid = rl.rollout_chunks(
    prob.env, prob.env_params, act, seed_state["env"], rng, n // s.base, s.base, prob.capacity
  )
  return env, transitions, valid, n


def outer_iteration(config, prob: Problem, seed_state, rng):
  """Update k: (i) sample n(k) tuples with pi_k, (ii) critic, (iii) policy step (Alg. 1)."""
  collect_rng, update_rng = jax.random.split(rng)
  k = seed_state["update"] + 1
  env, transitions, valid, n = collect(config, prob, seed_state, k, collect_rng)
  delta = step_size(config, k, seed_state["power"])
  agent, info = UPDATES[config.algorithm](
    config, prob, seed_state["agent"], transitions, valid, delta, update_rng
  )
  return_sum, episodes = rl.completed_episodes(transitions, valid)
  seed_state = {**seed_state, "agent": agent, "env": env, "update": k}
  seed_state["env_steps"] = seed_state["env_steps"] + n
  info = {**info, "return_sum": return_sum, "episodes": episodes, "sample_size": n}
  return seed_state, info


def seed_chunk(config, prob: Problem, seed_state, rng):
  """`updates_per_step` outer iterations of one seed; records the mean return of the episodes that
  ended in them (the previous value when none did, NaN before the first) on the learning curve."""
  seed_state, info = jax.lax.scan(
    functools.partial(outer_iteration, config, prob),
    seed_state,
    jax.random.split(rng, config.updates_per_step),
  )
  episodes = jnp.sum(info["episodes"])
  mean_return = jnp.where(
    episodes > 0, jnp.sum(info["return_sum"]) / jnp.maximum(episodes, 1), seed_state["last_return"]
  )
  index = jnp.minimum(seed_state["loop_step"], prob.num_steps - 1)
  first_update = (index * config.updates_per_step,)
  trace = {
    name: jax.lax.dynamic_update_slice(values, info[name].astype(jnp.float32), first_update)
    for name, values in seed_state["trace"].items()
  }
  seed_state = {
    **seed_state,
    "trace": trace,
    "last_return": mean_return,
    "loop_step": seed_state["loop_step"] + 1,
    "curve": seed_state["curve"].at[index].set(mean_return),
    "curve_env_steps": seed_state["curve_env_steps"].at[index].set(seed_state["env_steps"]),
  }
  metrics = {name: jnp.mean(value) for name, value in info.items() if name not in ("return_sum",)}
  metrics["return"] = mean_return
  return seed_state, metrics


def all_seeds_chunk(config, prob: Problem, state, rng):
  """The jitted unit: `seed_chunk` vmapped over the members (exponent x seed) of `state`; metrics
  averaged over the members of `schedule.power`."""
  members = state["power"].shape[0]
  state, metrics = jax.vmap(functools.partial(seed_chunk, config, prob))(
    state, jax.random.split(rng, members)
  )
  main = jax.tree.map(lambda x: jnp.nanmean(x[: config.num_seeds]), metrics)
  for index, power in enumerate(powers(config)[1:], start=1):
    rows = slice(index * config.num_seeds, (index + 1) * config.num_seeds)
    main[f"p{power:g}/return"] = jnp.nanmean(metrics["return"][rows])
  return state, main


# ---------------------------------------------------------------------------------------------------
# The phase: init, step, evaluation (final returns, curves, throughput), the learning-curve figure
# ---------------------------------------------------------------------------------------------------


def init_state(config, prob: Problem, rng, inputs=None):
  """Members `(power, seed)` in power-major order; every exponent sees the same seeds."""
  del inputs
  seed_rngs = jax.random.split(rng, config.num_seeds)
  rngs = seed_rngs[jnp.tile(jnp.arange(config.num_seeds), len(powers(config)))]
  member_powers = jnp.repeat(jnp.asarray(powers(config), jnp.float32), config.num_seeds)
  return jax.vmap(functools.partial(init_seed, config, prob))(rngs, member_powers)


def train_step(config, prob: Problem, state, batch, rng):
  del batch  # RL: the step makes its own data
  return all_seeds_chunk(config, prob, state, rng)


@cached_per_config(maxsize=16)
def final_returns_fn(config: ml_collections.ConfigDict):
  """Jitted `(agents of all members, rng) -> (members, episodes)` returns of fresh episodes."""
  prob = problem(config)

  def per_member(agent, rng):
    return rl.evaluation_returns(
      prob.env,
      prob.env_params,
      lambda obs: policy_logits(config, prob, agent, obs),
      rng,
      config.eval.num_episodes,
      prob.spec.max_episode_steps,
    )

  def all_members(agents, rng):
    members = jax.tree.leaves(agents)[0].shape[0]
    return jax.vmap(per_member)(agents, jax.random.split(rng, members))

  return jax.jit(all_members)


def _unit_env_steps(config, state) -> int:
  """Environment steps (all seeds) one call of the unit makes from `state`."""
  s, k = config.sampling, int(np.asarray(state["update"])[0])
  sizes = rl.sample_sizes(k + config.updates_per_step, s.base, growth_of(config), s.maximum, s.base)
  return sum(sizes[k:]) * int(state["update"].shape[0])


def throughput(config, prob: Problem, state, rng) -> dict[str, float]:
  """Environment steps per second of the jitted rollout + update unit on the `num_seeds` members
  of `schedule.power` (so runs with and without extra exponents compare), compile excluded. With
  `eval.compare_with_ppo`, clip-PPO's unit (same env, network, batch, epochs, seeds) is timed in
  the same process, interleaved with it."""
  main = jax.tree.map(lambda x: x[: config.num_seeds], state)
  calls = [(functools.partial(all_seeds_chunk, config, prob), (main, rng))]
  steps = [_unit_env_steps(config, main)]
  compare = config.eval.compare_with_ppo and config.algorithm != "ppo"
  if compare:
    ppo_config = baseline_config(config)
    ppo_prob = problem(ppo_config)
    ppo_state = init_state(ppo_config, ppo_prob, rng)
    calls.append((functools.partial(all_seeds_chunk, ppo_config, ppo_prob), (ppo_state, rng)))
    steps.append(_unit_env_steps(ppo_config, ppo_state))
  seconds = rl.best_seconds(calls, config.eval.throughput_repeats)
  results = {"env_steps_per_second": steps[0] / seconds[0]}
  if compare:
    results["ppo_env_steps_per_second"] = steps[1] / seconds[1]
    results["throughput_ratio_vs_ppo"] = results["env_steps_per_second"] / (steps[1] / seconds[1])
  return results


def baseline_config(config) -> ml_collections.ConfigDict:
  """The clip-PPO baseline of `config`: same environment, network, batch, epochs and seeds."""
  return with_changes(config, algorithm="ppo", schedule__extra_powers=(), sampling__growth=0.0)


def group_results(curve, curve_steps, returns, prefix: str) -> dict[str, Any]:
  """Final returns (mean and std over seeds of the per-seed mean) and the learning curve (arrays
  over loop steps) of one exponent's seeds: `curve (seeds, loop steps)` (NaN before a seed's first
  episode ended; points before any seed's are left out), `returns (seeds, episodes)`."""
  per_seed = returns.mean(axis=1)
  started = ~np.all(np.isnan(curve), axis=0)
  results = {
    f"{prefix}final_return_mean": float(per_seed.mean()),
    f"{prefix}final_return_std": float(per_seed.std()),
    f"{prefix}final_return_min_seed": float(per_seed.min()),
    f"{prefix}train_return_last_mean": float(np.nanmean(curve[:, -1])) if started[-1] else -np.inf,
  }
  curve = curve[:, started]
  results[f"{prefix}curve/env_steps"] = curve_steps[started]
  results[f"{prefix}curve/return_mean"] = np.nanmean(curve, axis=0)
  results[f"{prefix}curve/return_std"] = np.nanstd(curve, axis=0)
  return results


def windowed_returns(return_sum, episodes, window: int) -> np.ndarray:
  """`(updates,)`: after each update, the mean return of the last >= `window` training episodes
  (whole updates back; the released code logs a 20-episode running mean), -inf until `window`
  episodes have ended. `return_sum`, `episodes`: per update, as in the member's trace."""
  sums = np.concatenate([[0.0], np.cumsum(np.asarray(return_sum, np.float64))])
  counts = np.concatenate([[0.0], np.cumsum(np.asarray(episodes, np.float64))])
  start = (
    np.searchsorted(counts, counts[1:] - window, side="right") - 1
  )  # latest start with >= window
  safe = np.maximum(start, 0)
  spanned = counts[1:] - counts[safe]
  means = (sums[1:] - sums[safe]) / np.maximum(spanned, 1.0)
  return np.where((start >= 0) & (spanned >= window), means, -np.inf)


def trace_results(config, trace: Mapping[str, np.ndarray], curve_steps, prefix: str) -> dict:
  """One exponent's seeds' traces (`name -> (seeds, updates)`): per seed the best and the last
  `eval.return_window`-episode training mean (`windowed_returns`); per diagnostic (policy entropy,
  Q-gap) its mean over each loop step's updates, mean and std over seeds, against env steps, and
  its value in the last loop step (per seed and mean)."""
  running = np.stack(
    [
      windowed_returns(s, c, config.eval.return_window)
      for s, c in zip(trace["return_sum"], trace["episodes"], strict=True)
    ]
  )
  best, last = running.max(axis=1), running[:, -1]
  results = {
    f"{prefix}window_return_best_per_seed": best,
    f"{prefix}window_return_best_mean": float(best.mean()),
    f"{prefix}window_return_last_per_seed": last,
    f"{prefix}window_return_last_mean": float(last.mean()),
    f"{prefix}diag/env_steps": np.asarray(curve_steps),
  }
  for name in set(trace) - {"return_sum", "episodes"}:
    values = np.asarray(trace[name])
    per_step = values.reshape(values.shape[0], -1, config.updates_per_step).mean(axis=-1)
    results[f"{prefix}diag/{name}_mean"] = per_step.mean(axis=0)
    results[f"{prefix}diag/{name}_std"] = per_step.std(axis=0)
    results[f"{prefix}final_{name}_per_seed"] = per_step[:, -1]
    results[f"{prefix}final_{name}"] = float(per_step[:, -1].mean())
  return results


def power_prefix(config, power: float) -> str:
  """Result-key prefix of an exponent: none for `schedule.power`, `p<power>/` for extra ones."""
  return "" if power == config.schedule.power else f"p{power:g}/"


def evaluate(config, state, rng) -> dict[str, float]:
  """Per exponent: final returns over seeds and the learning curve; throughput of the unit."""
  prob = problem(config)
  eval_rng, bench_rng = jax.random.split(rng)
  returns = np.asarray(final_returns_fn(config)(state["agent"], eval_rng))
  curve, curve_steps = np.asarray(state["curve"]), np.asarray(state["curve_env_steps"])[0]
  results = {
    "env_steps_per_seed": float(np.asarray(state["env_steps"])[0]),
    "num_updates": float(prob.num_updates),
    **throughput(config, prob, state, bench_rng),
  }
  for index, power in enumerate(powers(config)):
    rows = slice(index * config.num_seeds, (index + 1) * config.num_seeds)
    prefix = power_prefix(config, power)
    results.update(group_results(curve[rows], curve_steps, returns[rows], prefix))
    trace = {name: np.asarray(values)[rows] for name, values in state["trace"].items()}
    results.update(trace_results(config, trace, curve_steps, prefix))
  return results


def curve_of(results: Mapping[str, Any], prefix: str = ""):
  """`(env steps, mean return, std over seeds)` per loop step from an evaluation's results."""
  get = lambda field: np.asarray(results[f"{prefix}curve/{field}"], np.float64)
  return get("env_steps"), get("return_mean"), get("return_std")


def band(ax, x, mean, std, label):
  """A mean curve and its +-std band against env steps, in thousands."""
  x = np.asarray(x) / 1000
  (line,) = ax.plot(x, mean, label=label)
  ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)


def curve_figure(config, state, rng) -> dict[str, Any]:
  """The learning curve of each exponent: mean +- std over seeds against env steps per seed."""
  del rng
  curve, steps = np.asarray(state["curve"]), np.asarray(state["curve_env_steps"])[0]
  fig, ((ax,),) = figure_grid()
  for index, power in enumerate(powers(config)):
    rows = curve[index * config.num_seeds : (index + 1) * config.num_seeds]
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before the first episode
      mean, std = np.nanmean(rows, 0), np.nanstd(rows, 0)
    band(ax, steps, mean, std, f"Delta_k ~ k^{power:g}")
  ax.set_title(f"{config.algorithm}, {config.env_name}")
  ax.set_xlabel("environment steps per seed (thousands)")
  ax.set_ylabel("training return")
  ax.legend()
  figures = {"returns": fig}
  diagnostics = [name for name in ("policy_entropy", "q_gap") if name in state["trace"]]
  if diagnostics:
    figures["diagnostics"] = diagnostics_figure(config, state, steps, diagnostics)
  return figures


def diagnostics_figure(config, state, steps, names):
  """Per diagnostic, its per-loop-step mean (+- std over seeds) of each exponent."""
  fig, axes = figure_grid(1, len(names))
  for ax, name in zip(axes[0], names, strict=True):
    values = np.asarray(state["trace"][name])
    per_step = values.reshape(values.shape[0], -1, config.updates_per_step).mean(axis=-1)
    for index, power in enumerate(powers(config)):
      rows = per_step[index * config.num_seeds : (index + 1) * config.num_seeds]
      band(ax, steps, rows.mean(0), rows.std(0), f"Delta_k ~ k^{power:g}")
    ax.set_title(f"{name}, {config.algorithm}, {config.env_name}, tau = {temperature_of(config):g}")
    ax.set_xlabel("environment steps per seed (thousands)")
    ax.set_yscale("log" if name == "policy_entropy" else "linear")
    ax.legend()
  fig.tight_layout()
  return fig


def temperature_of(config) -> float:
  """The policy temperature tau in force: `nn.policy_temperature` for NN-NPG, 1 otherwise."""
  return config.nn.policy_temperature if config.algorithm == "nn_npg" else 1.0


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  prob = problem(config)
  return [
    Phase(
      name="train",
      num_steps=prob.num_steps,
      init=functools.partial(init_state, config, prob),
      step=functools.partial(train_step, config, prob),
      data=None,
      evaluate=lambda state, rng, inputs: evaluate(config, state, rng),
      artifacts=lambda state, rng, inputs: curve_figure(config, state, rng),
    )
  ]
