"""Reinforcement-learning pieces shared by the RL methods: jitted gymnax environments, rollouts,
GAE, the clipped PPO surrogate and an actor-critic PPO loss, the NN-NPG loss of Zou et al.'s released
code, epochs of minibatch updates, step-size and sampling schedules, a policy/value MLP and a timer.

Everything here is pure and traceable: a rollout is a `lax.scan` over environment steps with the
environment's own auto-reset, so a whole "collect, then update" iteration can live in one jitted
function and be `vmap`ped over seeds.

Conventions: one environment per seed (the layout of single-environment reference code); a
`Transition` holds the *true* next observation `next_obs` (gymnax's `final_observation`, taken before
the auto-reset) so that a time-limit truncation can bootstrap from it, and `terminated` / `truncated`
separately.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import rlax

ENVIRONMENTS = ("CartPole-v1", "Acrobot-v1")

# A typical magnitude per observation coordinate, used to give isotropic kernels a per-coordinate
# length scale: CartPole's termination thresholds (x 2.4, angle 12 degrees) and velocities seen under
# random play; Acrobot's cos/sin coordinates and a quarter of its velocity limits (4 pi, 9 pi).
OBS_SCALES = {
  "CartPole-v1": (2.4, 2.0, 0.21, 2.0),
  "Acrobot-v1": (1.0, 1.0, 1.0, 1.0, math.pi, 2.25 * math.pi),
}


# ---------------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------------


class EnvSpec(NamedTuple):
  name: str
  obs_dim: int
  num_actions: int
  max_episode_steps: int


def make_env(name: str):
  """`(env, env_params, spec)` of a gymnax environment; an unknown name fails listing the known ones."""
  if name not in ENVIRONMENTS:
    raise ValueError(f"unknown environment {name!r}; known: {', '.join(ENVIRONMENTS)}")
  import gymnax

  env, params = gymnax.make(name)
  spec = EnvSpec(
    name,
    int(env.observation_space(params).shape[0]),
    int(env.num_actions),
    int(params.max_steps_in_episode),
  )
  return env, params, spec


class EnvCarry(NamedTuple):
  """The environment between steps: its state, current observation and the running episode."""

  env_state: Any
  obs: jax.Array
  episode_return: jax.Array
  episode_length: jax.Array


class Transition(NamedTuple):
  """One step `(s, a, r, s')`; leading axes are whatever the rollout stacked (time, seeds, ...).

  `episode_return` is the return of the episode that ended at this step (0 where `done` is False).
  """

  obs: jax.Array
  action: jax.Array
  reward: jax.Array
  next_obs: jax.Array
  terminated: jax.Array
  truncated: jax.Array
  episode_return: jax.Array
  extras: dict

  @property
  def done(self) -> jax.Array:
    return jnp.logical_or(self.terminated, self.truncated)


def env_reset(env, env_params, rng: jax.Array) -> EnvCarry:
  obs, env_state = env.reset(rng, env_params)
  return EnvCarry(env_state, obs, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))


def env_step(env, env_params, carry: EnvCarry, action, rng, extras=None):
  """One step with auto-reset; returns the new carry and the transition it made."""
  obs, env_state, reward, terminated, truncated, info = env.step(
    rng, carry.env_state, action, env_params
  )
  reward = jnp.asarray(reward, jnp.float32)
  terminated = jnp.asarray(terminated, bool)
  truncated = jnp.asarray(truncated, bool)
  done = jnp.logical_or(terminated, truncated)
  episode_return = carry.episode_return + reward
  transition = Transition(
    obs=carry.obs,
    action=action,
    reward=reward,
    next_obs=info["final_observation"],
    terminated=terminated,
    truncated=truncated,
    episode_return=jnp.where(done, episode_return, 0.0),
    extras={} if extras is None else extras,
  )
  carry = EnvCarry(
    env_state,
    obs,
    jnp.where(done, 0.0, episode_return),
    jnp.where(done, 0, carry.episode_length + 1),
  )
  return carry, transition


ActFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, dict]]


def rollout(env, env_params, act: ActFn, carry: EnvCarry, rng: jax.Array, num_steps: int):
  """`num_steps` steps of `act(obs, rng) -> (action, extras)` as a `lax.scan`; transitions `[T, ...]`."""

  def one_step(carry, step_rng):
    act_rng, env_rng = jax.random.split(step_rng)
    action, extras = act(carry.obs, act_rng)
    return env_step(env, env_params, carry, action, env_rng, extras)

  return jax.lax.scan(one_step, carry, jax.random.split(rng, num_steps))


def rollout_chunks(
  env,
  env_params,
  act: ActFn,
  carry: EnvCarry,
  rng: jax.Array,
  num_chunks: jax.Array,
  chunk: int,
  capacity: int,
):
  """A rollout of a traced length `num_chunks * chunk` <= `capacity` into a fixed-size buffer.

  For a sample size that changes from update to update under `jit` (the growing n(k) rule): the
  environment runs only the chunks asked for (a `fori_loop` with a traced trip count); the rest of
  the buffer holds zeros and `valid` marks the filled rows.
  """
  if capacity % chunk:
    raise ValueError(f"capacity {capacity} is not a multiple of the chunk size {chunk}")
  abstract = jax.eval_shape(lambda c, r: rollout(env, env_params, act, c, r, chunk)[1], carry, rng)
  buffer = jax.tree.map(lambda leaf: jnp.zeros((capacity,) + leaf.shape[1:], leaf.dtype), abstract)

  def fill(index, loop_carry):
    env_carry, buffer = loop_carry
    env_carry, piece = rollout(
      env, env_params, act, env_carry, jax.random.fold_in(rng, index), chunk
    )
    buffer = jax.tree.map(
      lambda b, p: jax.lax.dynamic_update_slice_in_dim(b, p, index * chunk, 0), buffer, piece
    )
    return env_carry, buffer

  carry, buffer = jax.lax.fori_loop(0, num_chunks, fill, (carry, buffer))
  valid = jnp.arange(capacity) < num_chunks * chunk
  return carry, buffer, valid


def completed_episodes(transitions: Transition, valid: jax.Array | None = None):
  """`(sum of returns, count)` of the episodes that ended in `transitions` (rows where `valid`)."""
  done = transitions.done
  if valid is not None:
    done = jnp.logical_and(done, valid)
  return jnp.sum(jnp.where(done, transitions.episode_return, 0.0)), jnp.sum(done)


def sample_action(logits: jax.Array, rng: jax.Array) -> jax.Array:
  return jax.random.categorical(rng, logits).astype(jnp.int32)


def policy_act(logits_fn: Callable[[jax.Array], jax.Array]) -> ActFn:
  """The `ActFn` that samples from `softmax(logits_fn(obs))` and records nothing."""

  def act(obs, rng):
    return sample_action(logits_fn(obs), rng), {}

  return act


def actor_critic_act(apply_fn: Callable, params) -> ActFn:
  """The `ActFn` of an actor-critic head `apply_fn(params, obs) -> (logits..., value)`: samples from
  the logits and records the action's log-probability and the state value (what PPO's update reads)."""

  def act(obs, rng):
    out = apply_fn(params, obs)
    logits, value = out[:-1], out[-1]
    action = sample_action(logits, rng)
    log_prob = jax.nn.log_softmax(logits)[action]
    return action, {"log_prob": log_prob, "value": value}

  return act


def evaluation_returns(
  env, env_params, logits_fn: Callable, rng: jax.Array, num_episodes: int, max_steps: int
) -> jax.Array:
  """Returns `(num_episodes,)` of fresh episodes under the stochastic policy `softmax(logits_fn(obs))`.

  Runs `num_episodes` environments for `max_steps` steps and keeps each one's first episode.
  """

  def one_episode(episode_rng):
    reset_rng, run_rng = jax.random.split(episode_rng)

    def one_step(loop_carry, step_rng):
      carry, total, alive = loop_carry
      act_rng, env_rng = jax.random.split(step_rng)
      action = sample_action(logits_fn(carry.obs), act_rng)
      carry, transition = env_step(env, env_params, carry, action, env_rng)
      total = total + jnp.where(alive, transition.reward, 0.0)
      return (carry, total, jnp.logical_and(alive, ~transition.done)), None

    start = (env_reset(env, env_params, reset_rng), jnp.zeros(()), jnp.ones((), bool))
    (_, total, _), _ = jax.lax.scan(one_step, start, jax.random.split(run_rng, max_steps))
    return total

  return jax.vmap(one_episode)(jax.random.split(rng, num_episodes))


# ---------------------------------------------------------------------------------------------------
# Networks and losses
# ---------------------------------------------------------------------------------------------------


class DiscreteMLP(nn.Module):
  """`obs (..., d) -> (..., num_outputs)`: ReLU torso of `hidden` widths and one linear head.

  The NPG port reads the head as logits and Q-values at once; clip-PPO uses `num_actions + 1`
  outputs (logits, then the state value).
  """

  hidden: Sequence[int]
  num_outputs: int

  @nn.compact
  def __call__(self, obs: jax.Array) -> jax.Array:
    h = obs
    for width in self.hidden:
      h = nn.relu(nn.Dense(width)(h))
    return nn.Dense(self.num_outputs)(h)


def categorical_kl(logits_p: jax.Array, logits_q: jax.Array) -> jax.Array:
  """KL(p || q) over the last axis, from logits."""
  log_p, log_q = jax.nn.log_softmax(logits_p), jax.nn.log_softmax(logits_q)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def categorical_entropy(logits: jax.Array) -> jax.Array:
  log_p = jax.nn.log_softmax(logits)
  return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def gae(
  rewards: jax.Array,
  values: jax.Array,
  next_values: jax.Array,
  terminated: jax.Array,
  done: jax.Array,
  gamma: float,
  lam: float,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation over time axis 0, as a reverse `lax.scan`.

  `delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t)` with `V(s'_t)` at the true next state
  (so a time-limit truncation bootstraps), and `A_t = delta_t + gamma lam (1 - done_t) A_{t+1}`: the
  trace is cut at every episode end. Returns `(advantages, value targets = advantages + values)`.

  Not rlax's `truncated_generalized_advantage_estimation`: it bootstraps from `values[t + 1]`, the next
  state of the sequence, which with auto-resetting environments is the reset state at an episode's
  end, so a time-limit truncation would bootstrap from the wrong state. Without truncations the two
  agree (tests/test_kernel_ppo.py checks it).
  """
  if not rewards.shape == values.shape == next_values.shape == terminated.shape == done.shape:
    raise ValueError(
      "gae: rewards, values, next_values, terminated, done must share a shape, got "
      f"{[x.shape for x in (rewards, values, next_values, terminated, done)]}"
    )
  not_terminated = 1.0 - terminated.astype(rewards.dtype)
  continues = 1.0 - done.astype(rewards.dtype)
  deltas = rewards + gamma * not_terminated * next_values - values

  def backward(advantage, inputs):
    delta, cont = inputs
    advantage = delta + gamma * lam * cont * advantage
    return advantage, advantage

  _, advantages = jax.lax.scan(
    backward, jnp.zeros_like(deltas[0]), (deltas, continues), reverse=True
  )
  return advantages, advantages + values


def ppo_clip_loss(
  logits: jax.Array,
  old_log_probs: jax.Array,
  actions: jax.Array,
  advantages: jax.Array,
  clip: float,
) -> jax.Array:
  """The clipped surrogate `-E[min(rho A, clip(rho, 1-eps, 1+eps) A)]` (Schulman et al. 2017, Eq. 7),
  rlax's `clipped_surrogate_pg_loss` on the probability ratios of `actions`."""
  log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[..., None], -1)[..., 0]
  ratio = jnp.exp(log_probs - old_log_probs)
  return rlax.clipped_surrogate_pg_loss(ratio.reshape(-1), advantages.reshape(-1), clip)


def npg_joint_loss(
  apply_fn: Callable,
  params,
  old_params,
  batch: Transition,
  step_size: jax.Array,
  gamma: float,
  value_coef: float,
  entropy_coef: float,
  bootstrap_current_state: bool = False,
  time_limit_terminal: bool = False,
  old_logits: jax.Array | None = None,
  temperature: float = 1.0,
) -> tuple[jax.Array, dict]:
  """The NN-NPG loss of the released code of Zou et al. (ICLR 2026; conniemessi/TD-and-PPO-in-RKHS,
  `main_discrete.py`): one head `f = apply_fn(params, obs)` gives the logits of pi and Q at once, and

    -E[<pi, Qbar> - (1/Delta) KL(pi || pi_old)] + c_v (Q(s, a) - target)^2 - c_ent H(pi),
    target = r + gamma (1 - terminal) sum_a' pi(a'|s') Qbar(s', a'),

  with Qbar and the target stop-gradient. The released code's quirks are flags: it weights Qbar(s', .)
  by pi(.|s) (`bootstrap_current_state`) and treats a time-limit truncation as terminal
  (`time_limit_terminal`). Returns the loss and `critic_loss`, `kl`, `entropy`.

  One forward pass of `params` covers s and s' (stacked rows); `old_logits`, pi_old's outputs on
  `batch.obs`, can be computed once per update by the caller (pi_old is fixed during it) instead of
  once per minibatch from `old_params`.

  `temperature` tau makes the policy pi = softmax(f / tau) while f stays the critic Q: tau enters
  every place the policy does (<pi, Qbar>, KL(pi || pi_old) with pi_old = softmax(f_old / tau), the
  entropy bonus, the weights of Qbar(s', .) in the TD target), not the critic term Q(s, a) = f(s, a).
  tau = 1 (the default) is the released code's pi = softmax(Q) and builds the same graph as without
  the option; `old_logits` are pi_old's raw head outputs f_old.
  """
  rows = batch.obs.shape[0]
  both = apply_fn(params, jnp.concatenate([batch.obs, batch.next_obs]))
  q, next_q = both[:rows], jax.lax.stop_gradient(both[rows:])
  if old_logits is None:
    old_logits = apply_fn(old_params, batch.obs)
  tempered = (lambda f: f) if temperature == 1.0 else (lambda f: f / temperature)
  logits = tempered(q)
  q_bar = jax.lax.stop_gradient(q)
  probs = jax.nn.softmax(logits)
  kl = categorical_kl(logits, tempered(old_logits))
  policy_loss = -jnp.mean(jnp.sum(probs * q_bar, -1) - kl / step_size)
  bootstrap_logits = jax.lax.stop_gradient(logits) if bootstrap_current_state else tempered(next_q)
  next_value = jnp.sum(jax.nn.softmax(bootstrap_logits) * next_q, -1)
  terminal = batch.done if time_limit_terminal else batch.terminated
  target = batch.reward + gamma * (1.0 - terminal) * next_value
  q_taken = jnp.take_along_axis(q, batch.action[:, None], -1)[:, 0]
  critic_loss = jnp.mean((q_taken - target) ** 2)
  entropy = jnp.mean(categorical_entropy(logits))
  loss = policy_loss + value_coef * critic_loss - entropy_coef * entropy
  return loss, {"critic_loss": critic_loss, "kl": jnp.mean(kl), "entropy": entropy}


def q_gap(q: jax.Array) -> jax.Array:
  """Mean over rows of max_a Q(s, a) - min_a Q(s, a): the spread that softmax(Q / tau) sees, in units
  of tau."""
  return jnp.mean(jnp.max(q, -1) - jnp.min(q, -1))


def actor_critic_ppo_loss(
  apply_fn: Callable,
  params,
  batch: Transition,
  advantages: jax.Array,
  targets: jax.Array,
  clip: float,
  value_coef: float,
  entropy_coef: float,
  normalize_advantages: bool = True,
) -> tuple[jax.Array, dict]:
  """Clip-PPO on an actor-critic head `apply_fn(params, obs) -> (logits..., value)`: the clipped
  surrogate + c_v (V - target)^2 - c_ent H, with `batch.extras["log_prob"]` recorded at collection
  (`actor_critic_act`) and advantages and value targets from `gae`. Returns the loss and
  `critic_loss`, `entropy`."""
  out = apply_fn(params, batch.obs)
  logits, values = out[:, :-1], out[:, -1]
  if normalize_advantages:
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
  policy_loss = ppo_clip_loss(logits, batch.extras["log_prob"], batch.action, advantages, clip)
  critic_loss = jnp.mean((values - targets) ** 2)
  entropy = jnp.mean(categorical_entropy(logits))
  loss = policy_loss + value_coef * critic_loss - entropy_coef * entropy
  return loss, {"critic_loss": critic_loss, "entropy": entropy}


def minibatches(num_rows: int, minibatch_size: int, rng: jax.Array | None) -> jax.Array:
  """Row indices `(num_minibatches, minibatch_size)`: in order (rng None) or a random permutation."""
  if num_rows % minibatch_size:
    raise ValueError(f"{num_rows} rows do not split into minibatches of {minibatch_size}")
  order = jnp.arange(num_rows) if rng is None else jax.random.permutation(rng, num_rows)
  return order.reshape(num_rows // minibatch_size, minibatch_size)


def minibatch_epochs(
  optimizer: optax.GradientTransformation,
  loss_fn: Callable,
  params,
  opt_state,
  num_rows: int,
  minibatch_size: int,
  epochs: int,
  rng: jax.Array,
  shuffle: bool = False,
):
  """`epochs` passes of `optimizer` over minibatches of `minibatch_size` rows, in order unless
  `shuffle`, as nested `lax.scan`s; `loss_fn(params, row indices) -> (loss, aux)`.

  Returns the params, the optimiser state, and the loss and aux averaged over every minibatch step.
  """

  def minibatch_step(carry, indices):
    params, opt_state = carry
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, indices)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), (loss, aux)

  def epoch(carry, epoch_rng):
    order = minibatches(num_rows, minibatch_size, epoch_rng if shuffle else None)
    return jax.lax.scan(minibatch_step, carry, order)

  (params, opt_state), (losses, aux) = jax.lax.scan(
    epoch, (params, opt_state), jax.random.split(rng, epochs)
  )
  return params, opt_state, jnp.mean(losses), jax.tree.map(jnp.mean, aux)


# ---------------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------------


def npg_step_size(k: jax.Array, power: float, first: float | None = None) -> jax.Array:
  """The NPG step size Delta_k = k^power for updates k = 1, 2, ... (Cor. 14 uses power = -1/2).

  With `first`, the released code's convention: Delta_1 = first, Delta_k = (k - 1)^power after.
  """
  k = jnp.asarray(k, jnp.float32)
  if first is None:
    return k**power
  return jnp.where(k <= 1, first, jnp.maximum(k - 1.0, 1.0) ** power)


def sample_size(k: jax.Array, base: int, growth: float, maximum: int, chunk: int) -> jax.Array:
  """The sampling rule n(k) = min(base * k^growth, maximum), rounded up to whole chunks.

  `growth = 0` keeps n fixed at `base`; `growth = 1` is the Gaussian-kernel reading of Cor. 14
  (n(k) proportional to k up to logs).
  """
  n = jnp.minimum(base * jnp.asarray(k, jnp.float32) ** growth, maximum)
  return jnp.minimum(jnp.ceil(n / chunk), maximum // chunk).astype(jnp.int32) * chunk


def sample_sizes(num_updates: int, base: int, growth: float, maximum: int, chunk: int) -> list[int]:
  """n(1), ..., n(num_updates) as Python ints (for budgets and static buffer sizes)."""
  ks = jnp.arange(1, num_updates + 1)
  return [int(n) for n in sample_size(ks, base, growth, maximum, chunk)]


def updates_within(budget: int, base: int, growth: float, maximum: int, chunk: int) -> int:
  """The number of updates K whose samples n(1) + ... + n(K) fit in `budget` environment steps."""
  most = max(budget // chunk, 1)
  spent = jnp.cumsum(sample_size(jnp.arange(1, most + 1), base, growth, maximum, chunk))
  return int(jnp.sum(spent <= budget))


# ---------------------------------------------------------------------------------------------------
# Throughput
# ---------------------------------------------------------------------------------------------------


def best_seconds(calls: Sequence[tuple[Callable, tuple]], repeats: int) -> list[float]:
  """The fastest of `repeats` timed runs of each `fn(*args)` in `calls`, compile excluded.

  Each function is compiled ahead of time (not timed); the timed runs interleave the functions
  (a, b, a, b, ...) so that drifting load from other processes on a shared CPU hits them alike.
  The minimum, not the mean: other processes only ever add time.
  """
  compiled = [(jax.jit(fn).lower(*args).compile(), args) for fn, args in calls]
  best = [math.inf] * len(compiled)
  for _ in range(repeats):
    for index, (fn, args) in enumerate(compiled):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      best[index] = min(best[index], time.perf_counter() - start)
  return best
