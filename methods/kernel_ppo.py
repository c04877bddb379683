"""Kernel PPO: "Sampling Complexity of TD and PPO in RKHS" (Zou, Ren, Zhang, Ding, Li; ICLR 2026).

Claim: NPG in an RKHS -- kernel TD for the critic f^(k) ~ Q^{pi_k}, then the KL-proximal step
pi_{k+1} ∝ pi_k exp(Delta_k f^(k)) -- improves at rate O(k^{-1/2}) with Delta_k = k^{-1/2} and a
sampling rule n(k) that grows with k (Thm 13, Cor. 14); in the released code's experiments
Delta_k = k^{-0.5} reaches the optimum of CartPole-v1 while k^{-0.2} is unstable and k^{-1.5}
stalls, and one-step TD NPG runs faster than clip-PPO with GAE (7210 vs 5406 env steps/s).

One phase, `train`. Each step of the shared loop runs `updates_per_step` outer iterations k
(rollout of n(k) environment steps with pi_k, critic, policy step) for every seed at once: the
rollout-and-update loop is one jitted function `vmap`ped over `num_seeds` seeds. `config.algorithm`:

  nn_npg     (A) port of the released code (spec Sec. 2): one MLP f_theta gives logits and Q; per
             update T epochs of Adam on -E[<pi_theta, Qbar>] + (1/Delta_k) KL(pi_theta || pi_old)
             + c_v TD-MSE - c_ent H (`nn_npg_loss`). The TD target weights Q(s', .) with pi(.|s');
             `nn.quirk_bootstrap_current_state` restores the released code's pi(.|s).
  rff_npg    (B) the RKHS algorithm (Alg. 1) with random Fourier features of
             K((s,a),(s',a')) = k_RBF(s,s') 1[a=a']: T kernel-TD iterations on theta (primal form of
             the spec's functional-gradient iteration, `core.rkhs.feature_td_iterate`), then the
             exact exponentiated step Theta_k = Theta_{k-1} + Delta_k theta^(k), logits
             phi(s)^T Theta_k (`core.rkhs`). Fixed n or growing n(k) = min(n0 k^rho, n_max).
  exact_npg  (C) the same with the exact kernel on each batch (dense n x n Gram): coefficients b^(k)
             by the closed-form fixed point (K + (alpha/eta) I - gamma C)^{-1} r or by the
             coefficient iteration; the policy is one kernel expansion over every batch seen, its
             coefficients Delta_k b^(k) accumulated (`core.rkhs.KernelExpansion`).
  ppo        clip-PPO with GAE (lambda 0.95, clip 0.2), same MLP torso, batch, epochs and
             minibatches: the throughput and return baseline.

Choices where the spec is open (each a config field):
* One environment per seed, collected continuously across episode ends (the released code's
  128-step counter); evaluation runs `eval.num_episodes` fresh episodes per seed with the final
  stochastic policy: `final_return_mean` / `final_return_std` are the mean and the spread over
  seeds of the per-seed mean return. `env_steps_per_second` counts every seed's steps of the jitted
  rollout + update function, timed after compilation (best of `eval.throughput_repeats`).
* The critic's TD target drops the bootstrap only at true terminations; a time-limit truncation
  bootstraps from the pre-reset observation (the released code treats it as terminal:
  `nn.quirk_time_limit_terminal`). The released code's first KL is against a separately
  initialised network (`nn.quirk_separate_old_init`); here pi_old = pi at the start of the update.
* Step sizes: the released code uses Delta_1 = 20, then Delta_k = (k-1)^p
  (`schedule.released_convention`, default for nn_npg); the kernel variants use Delta_k = k^p.
* Kernel variants: observations are divided by a per-coordinate scale (`core.rl.OBS_SCALES`) and
  `kernel.lengthscale`; a1 enters by its expectation under pi_k(.|s1) (`kernel.next_action`,
  "sampled" draws a1 as in Alg. 1 (i)); the step size `kernel.td_step_size` is eta n (the step on the
  mean residual, so the ridge alpha/eta = lambda n keeps lambda fixed as n(k) grows), and (B) warm
  starts theta^(k) at theta^(k-1). Growing n(k) is rounded up to whole chunks of n0 steps.
* The study compares schedules at an equal budget of environment steps per seed (`env_steps`), so
  growing n(k) makes fewer, better-informed updates.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import rkhs, rl
from methods.base import (
  Method,
  Phase,
  Report,
  require,
  require_choice,
  require_positive_int,
  with_changes,
)

ALGORITHMS = ("nn_npg", "rff_npg", "exact_npg", "ppo")
KERNEL_ALGORITHMS = ("rff_npg", "exact_npg")
MAX_EXACT_BATCH = 4096  # dense n x n Gram per update
MAX_EXACT_SUPPORT = 262_144  # kernel-expansion rows the exact policy may hold


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


def _frozen(config: ml_collections.ConfigDict) -> str:
  return config.to_json(sort_keys=True)


def _thawed(frozen: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(json.loads(frozen))


@functools.lru_cache(maxsize=16)
def _problem(frozen: str) -> Problem:
  config = _thawed(frozen)
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


def problem(config: ml_collections.ConfigDict) -> Problem:
  return _problem(_frozen(config))


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
  if algorithm in ("nn_npg", "ppo"):
    return network(config, prob).apply(agent["params"], obs)[..., :num_actions]
  x = scaled(config, prob, obs)
  if algorithm == "rff_npg":
    return rkhs.feature_values(agent["logit_weights"], rkhs.feature_map(agent["features"], x))
  flat = x.reshape(-1, x.shape[-1])
  return rkhs.expansion_values(agent["expansion"], flat).reshape(x.shape[:-1] + (num_actions,))


def sampling_act(config, prob: Problem, agent) -> rl.ActFn:
  def act(obs, rng):
    return rl.sample_action(policy_logits(config, prob, agent, obs), rng), {}

  return act


# ---------------------------------------------------------------------------------------------------
# (A) NN-NPG: the released code's loss, and (PPO) clip-PPO with GAE
# ---------------------------------------------------------------------------------------------------


def optimizer(config) -> optax.GradientTransformation:
  return optax.adam(config.nn.learning_rate)


def nn_npg_loss(config, prob: Problem, params, old_params, batch: rl.Transition, delta):
  """-E[<pi, Qbar> - (1/Delta_k) KL(pi || pi_old)] + c_v (Q(s,a) - target)^2 - c_ent H(pi) (Sec. 2).

  target = r + gamma (1 - terminal) sum_a' pi(a'|s') Qbar(s', a'), all of it stop-gradient.
  """
  net, nn_config = network(config, prob), config.nn
  logits = net.apply(params, batch.obs)
  next_q = jax.lax.stop_gradient(net.apply(params, batch.next_obs))
  old_logits = net.apply(old_params, batch.obs)
  q_bar = jax.lax.stop_gradient(logits)
  probs = jax.nn.softmax(logits)
  kl = rl.categorical_kl(logits, old_logits)
  policy_loss = -jnp.mean(jnp.sum(probs * q_bar, -1) - kl / delta)
  bootstrap_logits = q_bar if nn_config.quirk_bootstrap_current_state else next_q
  next_value = jnp.sum(jax.nn.softmax(bootstrap_logits) * next_q, -1)
  terminal = batch.done if nn_config.quirk_time_limit_terminal else batch.terminated
  target = batch.reward + config.gamma * (1.0 - terminal) * next_value
  q_taken = jnp.take_along_axis(logits, batch.action[:, None], -1)[:, 0]
  critic_loss = jnp.mean((q_taken - target) ** 2)
  entropy = jnp.mean(rl.categorical_entropy(logits))
  loss = policy_loss + nn_config.value_coef * critic_loss - nn_config.entropy_coef * entropy
  return loss, {"critic_loss": critic_loss, "kl": jnp.mean(kl), "entropy": entropy}


def ppo_loss(config, prob: Problem, params, batch: rl.Transition, advantages, targets):
  """Clip surrogate + c_v (V - GAE target)^2 - c_ent H (the baseline; advantages from `core.rl.gae`)."""
  out = network(config, prob).apply(params, batch.obs)
  logits, values = out[:, :-1], out[:, -1]
  if config.ppo.normalize_advantages:
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
  policy_loss = rl.ppo_clip_loss(
    logits, batch.extras["log_prob"], batch.action, advantages, config.ppo.clip
  )
  critic_loss = jnp.mean((values - targets) ** 2)
  entropy = jnp.mean(rl.categorical_entropy(logits))
  loss = policy_loss + config.ppo.value_coef * critic_loss - config.ppo.entropy_coef * entropy
  return loss, {"critic_loss": critic_loss, "entropy": entropy}


def epochs_of_minibatches(config, loss_fn, params, opt_state, rows: int, rng):
  """`nn.epochs` passes of Adam over minibatches of `nn.minibatch_size` rows (in order unless
  `nn.shuffle`); `loss_fn(params, indices) -> (loss, aux)`. Returns params, opt state, mean loss/aux."""
  opt = optimizer(config)

  def minibatch_step(carry, indices):
    params, opt_state = carry
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, indices)
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), (loss, aux)

  def epoch(carry, epoch_rng):
    order = rl.minibatches(rows, config.nn.minibatch_size, epoch_rng if config.nn.shuffle else None)
    return jax.lax.scan(minibatch_step, carry, order)

  (params, opt_state), (losses, aux) = jax.lax.scan(
    epoch, (params, opt_state), jax.random.split(rng, config.nn.epochs)
  )
  return params, opt_state, jnp.mean(losses), jax.tree.map(jnp.mean, aux)


def nn_npg_update(config, prob: Problem, agent, transitions, valid, delta, rng):
  """T epochs of the joint loss against pi_old = pi_k, then pi_old <- pi_{k+1} (Sec. 2)."""
  del valid  # fixed n: every row is filled

  def loss_fn(params, indices):
    batch = jax.tree.map(lambda x: x[indices], transitions)
    return nn_npg_loss(config, prob, params, agent["old_params"], batch, delta)

  rows = transitions.reward.shape[0]
  params, opt_state, loss, aux = epochs_of_minibatches(
    config, loss_fn, agent["params"], agent["opt_state"], rows, rng
  )
  agent = {"params": params, "old_params": params, "opt_state": opt_state}
  return agent, {"loss": loss, "step_size": delta, **aux}


def ppo_update(config, prob: Problem, agent, transitions, valid, delta, rng):
  """GAE (lambda) advantages on the batch, then epochs of the clipped surrogate."""
  del valid, delta
  net, params = network(config, prob), agent["params"]
  values = transitions.extras["value"]
  next_values = net.apply(params, transitions.next_obs)[:, -1]
  advantages, targets = rl.gae(
    transitions.reward,
    values,
    next_values,
    transitions.terminated,
    transitions.done,
    config.gamma,
    config.ppo.gae_lambda,
  )

  def loss_fn(params, indices):
    batch = jax.tree.map(lambda x: x[indices], transitions)
    return ppo_loss(config, prob, params, batch, advantages[indices], targets[indices])

  params, opt_state, loss, aux = epochs_of_minibatches(
    config, loss_fn, params, agent["opt_state"], transitions.reward.shape[0], rng
  )
  return {"params": params, "opt_state": opt_state}, {"loss": loss, "step_size": 0.0, **aux}


def ppo_act(config, prob: Problem, agent) -> rl.ActFn:
  def act(obs, rng):
    out = network(config, prob).apply(agent["params"], obs)
    logits, value = out[:-1], out[-1]
    action = rl.sample_action(logits, rng)
    log_prob = jax.nn.log_softmax(logits)[action]
    return action, {"log_prob": log_prob, "value": value}

  return act


# ---------------------------------------------------------------------------------------------------
# (B) RFF-kernel NPG and (C) exact-kernel NPG
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
  if kernel.solver == "solve":
    theta = rkhs.feature_td_fixed_point(batch, kernel.td_decay, eta, valid)
  else:
    start = agent["theta"] if kernel.warm_start else jnp.zeros_like(agent["theta"])
    theta = rkhs.feature_td_iterate(start, batch, kernel.td_decay, eta, kernel.td_iterations, valid)
  residual = jnp.where(valid, rkhs.feature_td_residual(theta, batch), 0.0)
  loss = jnp.sum(residual**2) / jnp.maximum(jnp.sum(valid), 1)
  agent = {**agent, "theta": theta, "logit_weights": agent["logit_weights"] + delta * theta}
  return agent, {"loss": loss, "critic_loss": loss, "step_size": delta}


def exact_critic(config, x0, actions0, x1, actions1, rewards, discounts, valid):
  """b^(k) on one batch: the dense Grams K, C and the fixed point or the coefficient iteration."""
  gram0 = rkhs.state_action_gram(x0, actions0, x0, actions0)
  gram10 = rkhs.state_action_gram(x1, actions1, x0, actions0)
  kernel, eta = config.kernel, td_step(config, valid)
  if kernel.solver == "solve":
    b = rkhs.kernel_td_fixed_point(gram0, gram10, rewards, discounts, kernel.td_decay, eta, valid)
  else:
    b = rkhs.kernel_td_iterate(
      gram0, gram10, rewards, discounts, kernel.td_decay, eta, kernel.td_iterations, mask=valid
    )
  residual = jnp.where(valid, rkhs.kernel_td_residual(b, gram0, gram10, rewards, discounts), 0.0)
  return b, jnp.sum(residual**2) / jnp.maximum(jnp.sum(valid), 1)


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
  }


def collect(config, prob: Problem, seed_state, k, rng):
  """n(k) environment steps with pi_k into a buffer of `capacity` rows; `valid` marks the filled."""
  agent = seed_state["agent"]
  act = (
    ppo_act(config, prob, agent) if config.algorithm == "ppo" else sampling_act(config, prob, agent)
  )
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
  seed_state = {
    **seed_state,
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
# The phase
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


@functools.lru_cache(maxsize=16)
def _final_returns_fn(frozen: str):
  """Jitted `(agents of all members, rng) -> (members, episodes)` returns of fresh episodes."""
  config = _thawed(frozen)
  prob = _problem(frozen)

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


def power_prefix(config, power: float) -> str:
  """Result-key prefix of an exponent: none for `schedule.power`, `p<power>/` for extra ones."""
  return "" if power == config.schedule.power else f"p{power:g}/"


def evaluate(config, state, rng) -> dict[str, float]:
  """Per exponent: final returns over seeds and the learning curve; throughput of the unit."""
  prob = problem(config)
  eval_rng, bench_rng = jax.random.split(rng)
  returns = np.asarray(_final_returns_fn(_frozen(config))(state["agent"], eval_rng))
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
  return results


def curve_of(results: Mapping[str, Any], prefix: str = ""):
  """`(env steps, mean return, std over seeds)` per loop step from an evaluation's results."""
  get = lambda field: np.asarray(results[f"{prefix}curve/{field}"], np.float64)
  return get("env_steps"), get("return_mean"), get("return_std")


def curve_figure(config, state, rng) -> dict[str, Any]:
  """The learning curve of each exponent: mean +- std over seeds against env steps per seed."""
  del rng
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  curve, steps = np.asarray(state["curve"]), np.asarray(state["curve_env_steps"])[0]
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for index, power in enumerate(powers(config)):
    rows = curve[index * config.num_seeds : (index + 1) * config.num_seeds]
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before the first episode
      mean, std = np.nanmean(rows, 0), np.nanstd(rows, 0)
    _band(ax, steps, mean, std, f"Delta_k ~ k^{power:g}")
  ax.set_title(f"{config.algorithm}, {config.env_name}")
  ax.set_xlabel("environment steps per seed (thousands)")
  ax.set_ylabel("training return")
  ax.legend()
  return {"returns": fig}


def _band(ax, x, mean, std, label):
  """A mean curve and its +-std band against env steps, in thousands."""
  x = np.asarray(x) / 1000
  (line,) = ax.plot(x, mean, label=label)
  ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)


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


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "algorithm", ALGORITHMS)
  require_choice(config, "env_name", rl.ENVIRONMENTS)
  for field in (
    "num_seeds",
    "env_steps",
    "updates_per_step",
    "sampling.base",
    "sampling.maximum",
    "nn.epochs",
    "nn.minibatch_size",
    "eval.num_episodes",
    "eval.throughput_repeats",
  ):
    require_positive_int(config, field)
  require(0.0 < config.gamma < 1.0, "gamma", f"must be in (0, 1), got {config.gamma}")
  _validate_schedule(config)
  _validate_sampling(config)
  if config.algorithm in ("nn_npg", "ppo"):
    require(
      config.sampling.base % config.nn.minibatch_size == 0,
      "nn.minibatch_size",
      f"{config.nn.minibatch_size} does not divide the batch sampling.base = {config.sampling.base}",
    )
    require(len(config.nn.hidden) > 0, "nn.hidden", "needs at least one hidden layer")
  if config.algorithm in KERNEL_ALGORITHMS:
    _validate_kernel(config)
  prob, s = problem(config), config.sampling
  updates = rl.updates_within(config.env_steps, s.base, growth_of(config), s.maximum, s.base)
  require(
    prob.num_steps >= 1,
    "env_steps",
    f"{config.env_steps} steps per seed give {updates} updates, fewer than "
    f"updates_per_step = {config.updates_per_step}",
  )
  if config.algorithm == "exact_npg":
    require(
      prob.support <= MAX_EXACT_SUPPORT,
      "env_steps",
      f"the exact kernel policy would hold {prob.support} points (max {MAX_EXACT_SUPPORT}); "
      "lower env_steps or use algorithm = rff_npg",
    )


def _validate_schedule(config) -> None:
  s = config.schedule
  require(s.scale > 0, "schedule.scale", f"must be positive, got {s.scale}")
  require(
    s.first_step_size > 0, "schedule.first_step_size", f"must be positive, got {s.first_step_size}"
  )
  all_powers = powers(config)
  require(
    all(isinstance(p, int | float) for p in all_powers),
    "schedule.extra_powers",
    f"must be numbers, got {tuple(s.extra_powers)!r}",
  )
  require(
    len(set(all_powers)) == len(all_powers),
    "schedule.extra_powers",
    f"must not repeat schedule.power or each other, got {all_powers}",
  )


def _validate_sampling(config) -> None:
  s = config.sampling
  require(s.growth >= 0.0, "sampling.growth", f"must be >= 0, got {s.growth}")
  require(
    s.maximum % s.base == 0 and s.maximum >= s.base,
    "sampling.maximum",
    f"must be a multiple of sampling.base = {s.base} and at least it, got {s.maximum}",
  )
  if config.algorithm not in KERNEL_ALGORITHMS:
    require(
      s.growth == 0.0,
      "sampling.growth",
      f"growing n(k) is implemented for {KERNEL_ALGORITHMS}, not {config.algorithm!r}; set it to 0",
    )


def _validate_kernel(config) -> None:
  kernel = config.kernel
  require_choice(config, "kernel.solver", ("iterate", "solve"))
  require_choice(config, "kernel.next_action", ("expected", "sampled"))
  require_positive_int(config, "kernel.num_features")
  require_positive_int(config, "kernel.td_iterations")
  require(
    kernel.lengthscale > 0, "kernel.lengthscale", f"must be positive, got {kernel.lengthscale}"
  )
  require(
    kernel.td_step_size > 0, "kernel.td_step_size", f"must be positive, got {kernel.td_step_size}"
  )
  require(
    0.0 <= kernel.td_decay < 1.0, "kernel.td_decay", f"must be in [0, 1), got {kernel.td_decay}"
  )
  if kernel.solver == "solve":
    require(
      kernel.td_decay > 0, "kernel.td_decay", "the closed-form solve needs alpha > 0 (a ridge)"
    )
  if config.algorithm == "exact_npg":
    require(
      config.sampling.maximum <= MAX_EXACT_BATCH,
      "sampling.maximum",
      f"the exact kernel builds an n x n Gram per update; n <= {MAX_EXACT_BATCH}, "
      f"got {config.sampling.maximum}",
    )


# ---------------------------------------------------------------------------------------------------
# Study: step-size exponents, fixed vs growing n(k), throughput TD-NPG vs clip-PPO
# ---------------------------------------------------------------------------------------------------


def study_arms(config: ml_collections.ConfigDict):
  """(1) nn_npg on each of `study.envs` with every exponent of `study.powers` in one run (vmapped
  over exponent x seed; `study.main_power` first); (2) rff_npg at `study.main_power` with fixed n
  and with n(k) growing at `study.sampling_growth` on each of `study.sampling_envs`; (3) clip-PPO on
  `study.throughput_env`, whose throughput is compared with nn_npg's there."""
  study, arms = config.study, []
  extra = tuple(p for p in study.powers if p != study.main_power)
  for env_name in study.envs:
    arms.append(
      (
        f"nn_npg_{env_name}",
        with_changes(
          config,
          algorithm="nn_npg",
          env_name=env_name,
          schedule__power=study.main_power,
          schedule__extra_powers=extra,
          eval__compare_with_ppo=env_name == study.throughput_env,
        ),
      )
    )
  for env_name in study.sampling_envs:
    for rule, growth in (("fixed", 0.0), ("growing", study.sampling_growth)):
      arms.append(
        (
          f"rff_npg_{env_name}_{rule}",
          with_changes(
            config,
            algorithm="rff_npg",
            env_name=env_name,
            schedule__power=study.main_power,
            schedule__scale=study.kernel_step_scale,
            schedule__released_convention=False,
            sampling__growth=growth,
            updates_per_step=config.updates_per_step
            if growth == 0
            else study.growing_updates_per_step,
            eval__compare_with_ppo=False,
          ),
        )
      )
  ppo = with_changes(
    config, algorithm="ppo", env_name=study.throughput_env, eval__compare_with_ppo=False
  )
  arms.append((f"ppo_{study.throughput_env}", ppo))
  return arms


def best_of(finals: Mapping[float, float]):
  """The exponent with the highest final return, or "tie" when several share it."""
  top = max(finals.values())
  winners = [p for p, value in finals.items() if value == top]
  return winners[0] if len(winners) == 1 else "tie"


def late_drawdown(results: Mapping[str, float], fraction: float, prefix: str = "") -> float:
  """Mean over the last `fraction` of training of (best seed-mean return so far - current): how far
  the learning curve dips below what it had already reached."""
  _, mean, _ = curve_of(results, prefix)
  start = int(len(mean) * (1 - fraction))
  return float((np.maximum.accumulate(mean) - mean)[start:].mean())


def _row(arm: str, power, r: Mapping[str, float], prefix: str, fraction: float) -> dict:
  return {
    "arm": arm,
    "power": power,
    "final_return_mean": r[f"{prefix}final_return_mean"],
    "final_return_std": r[f"{prefix}final_return_std"],
    "train_return_last_mean": r[f"{prefix}train_return_last_mean"],
    "late_drawdown": late_drawdown(r, fraction, prefix),
    "num_updates": r["num_updates"],
    "env_steps_per_second": r["env_steps_per_second"],
  }


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  """Table per (arm, exponent); summary: best exponent per environment, fixed vs growing n(k),
  throughput ratio TD-NPG / clip-PPO; figures: learning curves."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  study, fraction = config.study, config.study.late_fraction
  main = study.main_power
  rows, summary = [], {}
  for env_name in study.envs:
    r = results[f"nn_npg_{env_name}"]
    finals = {}
    for p in study.powers:
      prefix = "" if p == main else f"p{p:g}/"
      rows.append(_row(f"nn_npg_{env_name}", p, r, prefix, fraction))
      finals[p] = r[f"{prefix}final_return_mean"]
      summary[f"{env_name}_nn_npg_p{p:g}_final_return"] = finals[p]
    summary[f"{env_name}_best_power"] = best_of(finals)
  for env_name in study.sampling_envs:
    for rule in ("fixed", "growing"):
      r = results[f"rff_npg_{env_name}_{rule}"]
      rows.append(_row(f"rff_npg_{env_name}_{rule}", main, r, "", fraction))
      summary[f"{env_name}_rff_{rule}_final_return"] = r["final_return_mean"]
      summary[f"{env_name}_rff_{rule}_late_drawdown"] = late_drawdown(r, fraction)
  ppo = results[f"ppo_{study.throughput_env}"]
  rows.append(_row(f"ppo_{study.throughput_env}", None, ppo, "", fraction))
  npg = results.get(f"nn_npg_{study.throughput_env}")
  summary["ppo_final_return"] = ppo["final_return_mean"]
  if npg is not None and "throughput_ratio_vs_ppo" in npg:
    summary["td_npg_env_steps_per_second"] = npg["env_steps_per_second"]
    summary["ppo_env_steps_per_second"] = npg["ppo_env_steps_per_second"]
    summary["throughput_ratio_td_npg_over_ppo"] = npg["throughput_ratio_vs_ppo"]
  figures = {
    "returns_vs_step_size": _powers_figure(plt, study, results),
    "fixed_vs_growing_n": _sampling_figure(plt, study, results),
  }
  notes = (
    "final_return: fresh episodes with the final stochastic policy, mean (std) over seeds of the "
    f"per-seed mean. late_drawdown: mean over the last {fraction:.0%} of training of (best "
    "seed-mean training return so far - current). Throughput: every seed's env steps per second of "
    f"the jitted rollout + update unit ({config.num_seeds} seeds), compile excluded; the ratio "
    "TD-NPG / clip-PPO is timed interleaved in one process (the nn_npg arm's evaluation)."
  )
  return Report(rows=rows, summary=summary, figures=figures, notes=notes)


def _powers_figure(plt, study, results):
  fig, axes = plt.subplots(1, len(study.envs), figsize=(5 * len(study.envs), 3.5), squeeze=False)
  for ax, env_name in zip(axes[0], study.envs, strict=True):
    for p in study.powers:
      prefix = "" if p == study.main_power else f"p{p:g}/"
      _band(ax, *curve_of(results[f"nn_npg_{env_name}"], prefix), f"Delta_k = k^{p:g}")
    ax.set_title(f"NN-NPG, {env_name}")
    ax.set_xlabel("environment steps per seed (thousands)")
    ax.set_ylabel("training return (mean ± std over seeds)")
    ax.legend()
  fig.tight_layout()
  return fig


def _sampling_figure(plt, study, results):
  envs = study.sampling_envs
  fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.5), squeeze=False)
  for ax, env_name in zip(axes[0], envs, strict=True):
    for rule in ("fixed", "growing"):
      _band(ax, *curve_of(results[f"rff_npg_{env_name}_{rule}"]), f"{rule} n(k)")
    ax.set_title(f"RFF-kernel NPG, {env_name}, k^{study.main_power:g}")
    ax.set_xlabel("environment steps per seed (thousands)")
    ax.set_ylabel("training return (mean ± std over seeds)")
    ax.legend()
  fig.tight_layout()
  return fig


METHOD = Method(
  name="kernel_ppo", phases=phases, validate=validate, study_arms=study_arms, report=report
)
