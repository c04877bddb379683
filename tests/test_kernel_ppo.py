"""Kernel PPO: environments, kernel TD, the proximal policy step, RFF, GAE, schedules, smoke runs."""

import functools
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import kernel_ppo as kppo_config
from core import rkhs, rl
from experiments import loop
from methods import kernel_ppo
from methods.base import ConfigError, with_changes

# ---------------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "name, obs_dim, num_actions", [("CartPole-v1", 4, 2), ("Acrobot-v1", 6, 3)]
)
def test_gymnax_environments_step_under_jit_and_vmap(name, obs_dim, num_actions):
  env, params, spec = rl.make_env(name)
  assert (spec.obs_dim, spec.num_actions, spec.max_episode_steps) == (obs_dim, num_actions, 500)
  keys = jax.random.split(jax.random.key(0), 3)
  carry = jax.jit(jax.vmap(lambda k: rl.env_reset(env, params, k)))(keys)
  step = jax.jit(jax.vmap(lambda c, a, k: rl.env_step(env, params, c, a, k)))
  carry, transition = step(carry, jnp.array([0, 1, 1]), keys)
  assert transition.obs.shape == transition.next_obs.shape == (3, obs_dim)
  assert transition.reward.shape == transition.terminated.shape == (3,)
  assert np.all(np.asarray(carry.episode_length) == 1)


def test_unknown_environment_is_named():
  with pytest.raises(ValueError, match="unknown environment 'Pendulum-v1'"):
    rl.make_env("Pendulum-v1")


def test_rollout_keeps_the_true_next_state_and_counts_episodes():
  env, params, _ = rl.make_env("CartPole-v1")
  act = lambda obs, rng: (rl.sample_action(jnp.zeros(2), rng), {})
  carry = rl.env_reset(env, params, jax.random.key(1))
  _, transitions = jax.jit(lambda c, r: rl.rollout(env, params, act, c, r, 200))(
    carry, jax.random.key(2)
  )
  done = np.asarray(transitions.done)
  assert done.sum() >= 2  # random play ends CartPole episodes in ~20 steps
  # s' continues s within an episode, and the observation after an end is a fresh reset
  np.testing.assert_array_equal(
    transitions.next_obs[:-1][~done[:-1]], transitions.obs[1:][~done[:-1]]
  )
  total, count = rl.completed_episodes(transitions)
  lengths = np.diff(np.concatenate([[-1], np.flatnonzero(done)]))
  np.testing.assert_allclose(float(total), lengths.sum())
  assert int(count) == done.sum()


# ---------------------------------------------------------------------------------------------------
# Kernel TD
# ---------------------------------------------------------------------------------------------------


def _td_batch(n=24, dim=3, num_actions=2, gamma=0.9, seed=0):
  """Random tuples: s0, a0 one-hot, s1, pi(.|s1), rewards, discounts with a few terminals."""
  rng = np.random.default_rng(seed)
  x0, x1 = rng.normal(size=(n, dim)), rng.normal(size=(n, dim))
  a0 = np.eye(num_actions)[rng.integers(num_actions, size=n)]
  pi1 = rng.dirichlet(np.ones(num_actions), size=n)
  rewards = rng.normal(size=n)
  discounts = gamma * (rng.random(n) > 0.2)
  return [jnp.asarray(v, jnp.float32) for v in (x0, a0, x1, pi1, rewards, discounts)]


def test_kernel_td_iteration_converges_to_the_closed_form_fixed_point():
  x0, a0, x1, pi1, rewards, discounts = _td_batch()
  gram0 = rkhs.state_action_gram(x0, a0, x0, a0)
  gram10 = rkhs.state_action_gram(x1, pi1, x0, a0)
  alpha, eta = 0.01, 0.05
  radius = float(rkhs.kernel_td_contraction(gram0, gram10, discounts, alpha, eta))
  assert radius < 1.0
  fixed = rkhs.kernel_td_fixed_point(gram0, gram10, rewards, discounts, alpha, eta)
  # the fixed point solves (K + (alpha/eta) I - gamma C) b = r
  system = gram0 - discounts[:, None] * gram10 + (alpha / eta) * jnp.eye(len(rewards))
  np.testing.assert_allclose(system @ fixed, rewards, atol=1e-4)
  iters = int(math.log(1e-7) / math.log(radius)) + 1
  b = jax.jit(rkhs.kernel_td_iterate, static_argnums=6)(
    gram0, gram10, rewards, discounts, alpha, eta, iters
  )
  np.testing.assert_allclose(b, fixed, atol=1e-5 * float(jnp.max(jnp.abs(fixed))) + 1e-5)


def test_masked_rows_take_no_part_in_kernel_td():
  x0, a0, x1, pi1, rewards, discounts = _td_batch(n=16)
  gram0 = rkhs.state_action_gram(x0, a0, x0, a0)
  gram10 = rkhs.state_action_gram(x1, pi1, x0, a0)
  mask = jnp.arange(16) < 10
  full = rkhs.kernel_td_fixed_point(gram0, gram10, rewards, discounts, 0.01, 0.05, mask)
  sub = rkhs.kernel_td_fixed_point(
    gram0[:10, :10], gram10[:10, :10], rewards[:10], discounts[:10], 0.01, 0.05
  )
  np.testing.assert_allclose(full[:10], sub, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(full[10:], 0.0)


def test_feature_td_fixed_point_predicts_what_the_coefficient_form_predicts():
  """theta = Psi0^T b: with K = Psi0 Psi0^T the primal and the coefficient fixed points agree."""
  x0, a0, x1, pi1, rewards, discounts = _td_batch(n=20)
  features = rkhs.random_features(jax.random.key(3), 3, 64)
  batch = rkhs.FeatureBatch(
    rkhs.feature_map(features, x0), a0, rkhs.feature_map(features, x1), pi1, rewards, discounts
  )
  psi0 = (a0[:, :, None] * batch.phi0[:, None, :]).reshape(20, -1)
  psi1 = (pi1[:, :, None] * batch.phi1[:, None, :]).reshape(20, -1)
  alpha, eta = 0.02, 0.05
  b = rkhs.kernel_td_fixed_point(psi0 @ psi0.T, psi1 @ psi0.T, rewards, discounts, alpha, eta)
  theta = rkhs.feature_td_fixed_point(batch, alpha, eta)
  np.testing.assert_allclose(theta.reshape(-1), psi0.T @ b, rtol=2e-3, atol=2e-3)
  iterated = rkhs.feature_td_iterate(jnp.zeros_like(theta), batch, alpha, eta, 4000)
  np.testing.assert_allclose(iterated, theta, rtol=1e-3, atol=1e-3)


def test_tabular_kernel_td_recovers_q_pi_of_a_three_state_mdp():
  """One-hot state features: kernel TD on every (s, a) once is TD(0) on the table, and its fixed
  point with a vanishing ridge is Q^pi = (I - gamma P_pi)^{-1} r."""
  gamma, num_states, num_actions = 0.9, 3, 2
  next_state = np.array([[1, 2], [2, 0], [0, 1]])
  reward = np.array([[1.0, 0.0], [0.0, 2.0], [0.5, -1.0]])
  policy = np.array([[0.3, 0.7], [0.6, 0.4], [0.5, 0.5]])
  transition = np.zeros((num_states * num_actions,) * 2)  # (s, a) -> (s', a')
  for s in range(num_states):
    for a in range(num_actions):
      s1 = next_state[s, a]
      transition[s * num_actions + a, s1 * num_actions : (s1 + 1) * num_actions] = policy[s1]
  q_pi = np.linalg.solve(np.eye(6) - gamma * transition, reward.reshape(-1))
  states, actions = np.repeat(np.arange(3), 2), np.tile(np.arange(2), 3)
  batch = rkhs.FeatureBatch(
    jnp.eye(3)[states],
    jnp.eye(2)[actions],
    jnp.eye(3)[next_state[states, actions]],
    jnp.asarray(policy[next_state[states, actions]], jnp.float32),
    jnp.asarray(reward[states, actions], jnp.float32),
    jnp.full((6,), gamma),
  )
  theta = rkhs.feature_td_fixed_point(batch, alpha=1e-7, eta=1.0)
  np.testing.assert_allclose(theta.T.reshape(-1), q_pi, rtol=1e-3)


# ---------------------------------------------------------------------------------------------------
# Random features and the proximal step
# ---------------------------------------------------------------------------------------------------


def test_random_fourier_features_approximate_the_state_action_kernel():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(40, 4)), jnp.float32)
  actions = jnp.eye(3)[rng.integers(3, size=40)]
  lengthscale = jnp.array([0.5, 1.0, 2.0, 1.0])
  exact = rkhs.state_action_gram(x, actions, x, actions, lengthscale)
  errors = {}
  for num_features in (64, 16384):
    features = rkhs.random_features(jax.random.key(1), 4, num_features, lengthscale)
    phi = rkhs.feature_map(features, x)
    errors[num_features] = float(jnp.max(jnp.abs((phi @ phi.T) * (actions @ actions.T) - exact)))
  assert errors[16384] < 0.05
  assert errors[16384] < errors[64] / 4  # Monte-Carlo error ~ D^{-1/2}


def test_proximal_step_is_the_maximiser_of_the_kl_regularised_objective():
  rng = np.random.default_rng(2)
  log_pi = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(5, 4)), jnp.float32))
  critic = jnp.asarray(rng.normal(size=(5, 4)) * 3, jnp.float32)
  step = 0.7
  best = jnp.exp(rkhs.proximal_policy_update(log_pi, critic, step))
  value = rkhs.proximal_objective(best, log_pi, critic, step)
  # the maximum of Delta <f, pi> - KL(pi || pi_k) is log E_{pi_k} exp(Delta f) (Gibbs variational)
  np.testing.assert_allclose(value, jax.nn.logsumexp(log_pi + step * critic, -1), rtol=1e-5)
  others = jnp.asarray(rng.dirichlet(np.ones(4), size=(2000, 5)), jnp.float32)
  assert np.all(rkhs.proximal_objective(others, log_pi, critic, step) <= value + 1e-5)


def tiny_config(variant="default", **fields):
  config = kppo_config.get_config(variant)
  config.num_seeds = 2
  config.env_steps = 256
  config.updates_per_step = 2
  config.sampling.base = 32
  config.sampling.maximum = 64
  config.nn.hidden = (16,)
  config.nn.minibatch_size = 16
  config.kernel.num_features = 32
  config.kernel.td_iterations = 4
  config.eval.num_episodes = 2
  config.eval.throughput_repeats = 1
  config.loop.update(log_every=2, checkpoint_every=2)
  for field, value in fields.items():
    section, _, name = field.rpartition("__")
    (config[section] if section else config)[name] = value
  return config


def _seed_state(config, prob, seed=0):
  return jax.tree.map(lambda x: x[0], kernel_ppo.init_state(config, prob, jax.random.key(seed)))


def _critic_values(config, prob, agent, transitions, valid, rng, x):
  """f^(k)(x, .) of the critic this update fits, recomputed from its definition."""
  if config.algorithm == "rff_npg":
    new_agent, _ = kernel_ppo.rff_npg_update(config, prob, agent, transitions, valid, 0.0, rng)
    phi = rkhs.feature_map(agent["features"], kernel_ppo.scaled(config, prob, x))
    return rkhs.feature_values(new_agent["theta"], phi)
  x0, actions0, *rest = kernel_ppo.td_inputs(config, prob, agent, transitions, valid, rng)
  b, _ = kernel_ppo.exact_critic(config, x0, actions0, *rest, valid)
  return rkhs.rbf_gram(kernel_ppo.scaled(config, prob, x), x0) @ (b[:, None] * actions0)


@pytest.mark.parametrize(
  "variant, growth", [("rff", 0.0), pytest.param("exact", 1.0, marks=pytest.mark.slow)]
)
def test_policy_after_k_updates_is_softmax_of_the_step_weighted_critics(variant, growth):
  """pi_{k+1} = softmax(sum_j Delta_j f^(j)), checked against k sequential proximal steps from the
  uniform pi_1 with each f^(j) recomputed from that update's batch."""
  config = tiny_config(variant, sampling__growth=growth)
  prob = kernel_ppo.problem(config)
  seed_state = _seed_state(config, prob)
  x = jax.random.normal(jax.random.key(5), (7, prob.spec.obs_dim)) * 0.1
  log_pi = jnp.full((7, prob.spec.num_actions), -math.log(prob.spec.num_actions))

  @jax.jit
  def one_update(seed_state, rng):
    collect_rng, update_rng = jax.random.split(rng)
    k = seed_state["update"] + 1
    env, transitions, valid, _ = kernel_ppo.collect(config, prob, seed_state, k, collect_rng)
    delta = kernel_ppo.step_size(config, k, seed_state["power"])
    f = _critic_values(config, prob, seed_state["agent"], transitions, valid, update_rng, x)
    update = kernel_ppo.UPDATES[config.algorithm]
    agent, _ = update(config, prob, seed_state["agent"], transitions, valid, delta, update_rng)
    return {**seed_state, "agent": agent, "env": env, "update": k}, f, delta

  for j in range(4):
    seed_state, f, delta = one_update(seed_state, jax.random.key(10 + j))
    log_pi = rkhs.proximal_policy_update(log_pi, f, delta)
  logits = kernel_ppo.policy_logits(config, prob, seed_state["agent"], x)
  np.testing.assert_allclose(jax.nn.softmax(logits), jnp.exp(log_pi), atol=1e-5)
  assert float(jnp.max(jnp.abs(jnp.diff(logits, axis=-1)))) > 1e-4  # the policy did move


# ---------------------------------------------------------------------------------------------------
# GAE and schedules
# ---------------------------------------------------------------------------------------------------


def _numpy_gae(rewards, values, next_values, terminated, done, gamma, lam):
  advantages, running = np.zeros_like(rewards), np.zeros_like(rewards[0])
  for t in reversed(range(len(rewards))):
    delta = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
    running = delta + gamma * lam * (1 - done[t]) * running
    advantages[t] = running
  return advantages


def test_gae_matches_a_numpy_reference():
  rng = np.random.default_rng(4)
  shape = (37, 3)
  rewards, values, next_values = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
  terminated = rng.random(shape) < 0.1
  done = terminated | (rng.random(shape) < 0.05)
  advantages, targets = jax.jit(rl.gae, static_argnums=(5, 6))(
    rewards, values, next_values, terminated, done, 0.99, 0.95
  )
  expected = _numpy_gae(rewards, values, next_values, terminated, done, 0.99, 0.95)
  np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(targets, expected + values, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="must share a shape"):
    rl.gae(rewards, values[:-1], next_values, terminated, done, 0.99, 0.95)


def test_gae_equals_rlax_where_no_episode_is_truncated():
  import rlax

  rng = np.random.default_rng(5)
  rewards = rng.normal(size=29).astype(np.float32)
  values = rng.normal(size=30).astype(np.float32)  # V(s_0..s_T): next state = next in sequence
  terminated = rng.random(29) < 0.15
  advantages, _ = rl.gae(rewards, values[:-1], values[1:], terminated, terminated, 0.99, 0.9)
  discounts = 0.99 * (1.0 - terminated.astype(np.float32))
  expected = rlax.truncated_generalized_advantage_estimation(rewards, discounts, 0.9, values)
  np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)


def test_ppo_clip_loss_is_the_clipped_surrogate():
  rng = np.random.default_rng(6)
  logits = jnp.asarray(rng.normal(size=(4, 9, 3)), jnp.float32)
  actions = jnp.asarray(rng.integers(0, 3, size=(4, 9)))
  old_log_probs = jnp.asarray(rng.normal(size=(4, 9)) * 0.3 - 1.1, jnp.float32)
  advantages = jnp.asarray(rng.normal(size=(4, 9)), jnp.float32)

  def by_hand(logits):
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[..., None], -1)[..., 0]
    ratio = jnp.exp(log_probs - old_log_probs)
    clipped = jnp.clip(ratio, 0.8, 1.2)
    return -jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))

  loss = lambda logits: rl.ppo_clip_loss(logits, old_log_probs, actions, advantages, 0.2)
  np.testing.assert_allclose(loss(logits), by_hand(logits), rtol=1e-6)
  np.testing.assert_allclose(
    jax.grad(loss)(logits), jax.grad(by_hand)(logits), rtol=1e-5, atol=1e-7
  )


@pytest.mark.slow
def test_npg_loss_with_precomputed_old_logits_equals_the_per_minibatch_passes():
  """The update computes pi_old's outputs once (`old_logits`) and s, s' in one stacked pass; the
  loss and its gradient are those of three separate forward passes."""
  rng = np.random.default_rng(7)
  rows, obs_dim, actions = 12, 4, 2
  net = rl.DiscreteMLP(hidden=(16,), num_outputs=actions)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))
  old_params = net.init(jax.random.PRNGKey(1), jnp.zeros((1, obs_dim)))
  batch = rl.Transition(
    obs=jnp.asarray(rng.normal(size=(rows, obs_dim)), jnp.float32),
    action=jnp.asarray(rng.integers(0, actions, rows)),
    reward=jnp.asarray(rng.normal(size=rows), jnp.float32),
    next_obs=jnp.asarray(rng.normal(size=(rows, obs_dim)), jnp.float32),
    terminated=jnp.asarray(rng.random(rows) < 0.2),
    truncated=jnp.zeros(rows, bool),
    episode_return=jnp.zeros(rows),
    extras={},
  )

  def loss(params, old_logits=None):
    return rl.npg_joint_loss(
      net.apply, params, old_params, batch, 0.5, 0.99, 1.0, 0.05, old_logits=old_logits
    )[0]

  old_logits = net.apply(old_params, batch.obs)
  np.testing.assert_allclose(loss(params, old_logits), loss(params), rtol=1e-6)
  chex.assert_trees_all_close(
    jax.grad(loss)(params, old_logits), jax.grad(loss)(params), rtol=1e-5, atol=1e-7
  )


def test_step_size_and_sampling_schedules():
  ks = jnp.arange(1, 5)
  np.testing.assert_allclose(rl.npg_step_size(ks, -0.5), [1.0, 2**-0.5, 3**-0.5, 0.5], rtol=1e-6)
  np.testing.assert_allclose(rl.npg_step_size(ks, -0.5, first=20.0), [20.0, 1.0, 2**-0.5, 3**-0.5])
  assert rl.sample_sizes(5, 128, 0.0, 4096, 128) == [128] * 5
  assert rl.sample_sizes(4, 128, 1.0, 384, 128) == [128, 256, 384, 384]
  assert rl.sample_sizes(3, 100, 0.5, 1000, 50) == [100, 150, 200]  # rounded up to whole chunks
  assert rl.updates_within(1000, 128, 1.0, 4096, 128) == 3  # 128 + 256 + 384 <= 1000 < +512


# ---------------------------------------------------------------------------------------------------
# The method through the shared loop
# ---------------------------------------------------------------------------------------------------


def test_smoke_run_through_the_loop_reports_every_exponent(tmp_path):
  config = tiny_config(schedule__extra_powers=(-1.5,))
  summary = loop.run(config, str(tmp_path), devices=jax.devices()[:1])
  results = summary.results
  assert summary.step_traces == {"train": 1}
  for key in ("final_return_mean", "final_return_std", "env_steps_per_second"):
    assert math.isfinite(results[key]) and results[key] >= 0, key
  assert results["env_steps_per_second"] > 0 and results["ppo_env_steps_per_second"] > 0
  ratio = results["env_steps_per_second"] / results["ppo_env_steps_per_second"]
  assert results["throughput_ratio_vs_ppo"] == pytest.approx(ratio)
  assert results["env_steps_per_seed"] == 256 and results["num_updates"] == 8
  steps, mean, std = kernel_ppo.curve_of(results, "p-1.5/")
  np.testing.assert_array_equal(steps, [64, 128, 192, 256])
  assert np.all(mean > 0) and np.all(std >= 0)
  assert os.path.exists(tmp_path / "returns.png")


@pytest.mark.parametrize(
  "variant", [*(pytest.param(v, marks=pytest.mark.slow) for v in ("rff_growing", "exact")), "ppo"]
)
def test_every_algorithm_runs_a_few_updates(variant):
  """(The smoke run above covers nn_npg through the loop.)"""
  config = tiny_config(variant)
  prob = kernel_ppo.problem(config)
  state = kernel_ppo.init_state(config, prob, jax.random.key(0))
  step = jax.jit(functools.partial(kernel_ppo.train_step, config, prob))
  for i in range(prob.num_steps):
    state, metrics = step(state, None, jax.random.key(i))
  assert np.isfinite(float(metrics["loss"]))
  sizes = rl.sample_sizes(prob.num_updates, 32, kernel_ppo.growth_of(config), 64, 32)
  np.testing.assert_array_equal(state["env_steps"], sum(sizes))
  if variant == "exact":
    np.testing.assert_array_equal(state["agent"]["expansion"].size, sum(sizes))


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_results(tmp_path):
  config = tiny_config("rff_growing", env_steps=640)
  whole = loop.run(config, str(tmp_path / "whole"), devices=jax.devices()[:1]).results
  with pytest.raises(loop.Interrupted):
    loop.run(config, str(tmp_path / "cut"), should_stop=lambda phase, step: step == 2)
  resumed = loop.run(config, str(tmp_path / "cut"), devices=jax.devices()[:1]).results
  timings = ("env_steps_per_second", "ppo_env_steps_per_second", "throughput_ratio_vs_ppo")
  untimed = lambda results: {k: v for k, v in results.items() if k not in timings}
  assert set(timings) <= set(whole)
  chex.assert_trees_all_close(untimed(resumed), untimed(whole), rtol=1e-5)


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"algorithm": "sac"}, "config.algorithm: must be one of"),
    ({"env_name": "Pong"}, "config.env_name: must be one of"),
    ({"sampling__growth": 1.0}, "config.sampling.growth: growing n"),
    ({"nn__minibatch_size": 24}, "config.nn.minibatch_size: 24 does not divide"),
    ({"sampling__maximum": 48}, "config.sampling.maximum: must be a multiple"),
    ({"schedule__extra_powers": (-0.5,)}, "config.schedule.extra_powers: must not repeat"),
    ({"env_steps": 32}, "config.env_steps: 32 steps per seed give 1 updates"),
    ({"gamma": 1.0}, "config.gamma: must be in"),
  ],
)
def test_bad_fields_are_named(fields, message):
  with pytest.raises(ConfigError, match=message):
    kernel_ppo.validate(tiny_config(**fields))


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"kernel__solver": "cg"}, "config.kernel.solver: must be one of"),
    ({"kernel__lengthscale": 0.0}, "config.kernel.lengthscale: must be positive"),
    ({"sampling__maximum": 8192}, "config.sampling.maximum: the exact kernel"),
  ],
)
def test_bad_kernel_fields_are_named(fields, message):
  with pytest.raises(ConfigError, match=message):
    kernel_ppo.validate(tiny_config("exact", **fields))


def test_learning_curve_leaves_out_steps_before_the_first_episode_ended():
  curve = np.array([[np.nan, np.nan, -500.0, -400.0], [np.nan, -480.0, -450.0, np.nan]])
  results = kernel_ppo.group_results(curve, np.arange(1, 5) * 100, np.full((2, 3), -300.0), "")
  steps, mean, std = kernel_ppo.curve_of(results)
  np.testing.assert_array_equal(steps, [200, 300, 400])
  np.testing.assert_allclose(mean, [-480.0, -475.0, -400.0])
  np.testing.assert_allclose(std, [0.0, 25.0, 0.0])
  assert results["train_return_last_mean"] == -400.0 and results["final_return_mean"] == -300.0


def _fake_arm(final, curve, prefix="", extra=None):
  results = {
    f"{prefix}final_return_mean": final,
    f"{prefix}final_return_std": 1.0,
    f"{prefix}train_return_last_mean": curve[-1],
    "num_updates": 10.0,
    "env_steps_per_second": 1000.0,
  }
  results[f"{prefix}curve/env_steps"] = [100.0 * (i + 1) for i in range(len(curve))]
  results[f"{prefix}curve/return_mean"] = list(curve)
  results[f"{prefix}curve/return_std"] = [0.0] * len(curve)
  return {**results, **(extra or {})}


def test_study_arms_and_report():
  config = kppo_config.get_config("study")
  names = [name for name, _ in kernel_ppo.study_arms(config)]
  assert names == [
    "nn_npg_CartPole-v1",
    "nn_npg_Acrobot-v1",
    "rff_npg_CartPole-v1_fixed",
    "rff_npg_CartPole-v1_growing",
    "rff_npg_Acrobot-v1_fixed",
    "rff_npg_Acrobot-v1_growing",
    "ppo_CartPole-v1",
  ]
  results = {}
  for env_name in ("CartPole-v1", "Acrobot-v1"):
    arm = _fake_arm(400.0, [10.0, 300.0, 400.0])
    arm.update(_fake_arm(450.0, [10.0, 500.0, 450.0], "p-0.2/"))
    arm.update(_fake_arm(50.0, [10.0, 30.0, 50.0], "p-1.5/"))
    arm.update(ppo_env_steps_per_second=800.0, throughput_ratio_vs_ppo=1.25)
    results[f"nn_npg_{env_name}"] = arm
    results[f"rff_npg_{env_name}_fixed"] = _fake_arm(200.0, [10.0, 300.0, 100.0])
    results[f"rff_npg_{env_name}_growing"] = _fake_arm(250.0, [10.0, 200.0, 250.0])
  results["ppo_CartPole-v1"] = _fake_arm(300.0, [10.0, 200.0, 300.0])
  report = kernel_ppo.report(config, results)
  summary = report.summary
  assert summary["CartPole-v1_best_power"] == -0.2
  assert kernel_ppo.best_of({-0.2: -500.0, -0.5: -500.0, -1.5: -500.0}) == "tie"
  assert summary["throughput_ratio_td_npg_over_ppo"] == pytest.approx(1.25)
  assert summary["CartPole-v1_rff_fixed_late_drawdown"] == pytest.approx(200.0)
  assert summary["CartPole-v1_rff_growing_late_drawdown"] == pytest.approx(0.0)
  assert len(report.rows) == 2 * 3 + 4 + 1
  assert set(report.figures) == {"returns_vs_step_size", "fixed_vs_growing_n"}


# ---------------------------------------------------------------------------------------------------
# Policy temperature and the Acrobot mechanism study
# ---------------------------------------------------------------------------------------------------


def _npg_batch(rng, rows=16, obs_dim=4, actions=3):
  return rl.Transition(
    obs=jnp.asarray(rng.normal(size=(rows, obs_dim)), jnp.float32),
    action=jnp.asarray(rng.integers(0, actions, rows)),
    reward=jnp.asarray(rng.normal(size=rows), jnp.float32),
    next_obs=jnp.asarray(rng.normal(size=(rows, obs_dim)), jnp.float32),
    terminated=jnp.asarray(rng.random(rows) < 0.2),
    truncated=jnp.asarray(rng.random(rows) < 0.1),
    episode_return=jnp.zeros(rows),
    extras={},
  )


@pytest.mark.parametrize("tau", [1.0, 2.5])
def test_tempered_policy_term_is_softmax_of_q_over_tau(tau):
  """With c_v = c_ent = 0 the loss is -E[<softmax(f / tau), f> - KL(. || softmax(f_old / tau)) / Delta]."""
  rng = np.random.default_rng(12)
  net = rl.DiscreteMLP(hidden=(16,), num_outputs=3)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  old_params = net.init(jax.random.PRNGKey(1), jnp.zeros((1, 4)))
  batch, delta = _npg_batch(rng), 0.7
  loss, aux = rl.npg_joint_loss(
    net.apply, params, old_params, batch, delta, 0.99, 0.0, 0.0, temperature=tau
  )
  f, f_old = net.apply(params, batch.obs), net.apply(old_params, batch.obs)
  pi, log_pi, log_old = (
    jax.nn.softmax(f / tau),
    jax.nn.log_softmax(f / tau),
    jax.nn.log_softmax(f_old / tau),
  )
  kl = jnp.sum(pi * (log_pi - log_old), -1)
  np.testing.assert_allclose(loss, -jnp.mean(jnp.sum(pi * f, -1) - kl / delta), rtol=1e-5)
  np.testing.assert_allclose(aux["entropy"], jnp.mean(-jnp.sum(pi * log_pi, -1)), rtol=1e-5)


def test_policy_temperature_one_is_the_papers_policy_and_entropy_rises_with_tau():
  config = tiny_config(env_name="Acrobot-v1")
  prob = kernel_ppo.problem(config)
  params = kernel_ppo.network(config, prob).init(jax.random.key(0), jnp.zeros((prob.spec.obs_dim,)))
  agent = {"params": jax.tree.map(lambda w: 3.0 * w, params)}  # a peaked head
  obs = jax.random.normal(jax.random.key(3), (64, prob.spec.obs_dim))
  q = kernel_ppo.network(config, prob).apply(agent["params"], obs)
  np.testing.assert_array_equal(kernel_ppo.policy_logits(config, prob, agent, obs), q)
  entropies = []
  for tau in (0.5, 1.0, 2.0, 5.0, 1000.0):
    logits = kernel_ppo.policy_logits(
      with_changes(config, nn__policy_temperature=tau), prob, agent, obs
    )
    entropies.append(float(jnp.mean(rl.categorical_entropy(logits))))
  assert np.all(np.diff(entropies) > 0), entropies
  assert entropies[-1] == pytest.approx(math.log(3), rel=1e-2)
  assert float(rl.q_gap(q)) == pytest.approx(float(jnp.mean(q.max(-1) - q.min(-1))))


@pytest.mark.slow
def test_nn_npg_update_at_tau_one_is_the_released_update():
  """The update (pi_old's logits once per update, the config's tau = 1) gives the parameters that
  minibatch epochs of the released loss give."""
  config = tiny_config()
  prob = kernel_ppo.problem(config)
  seed_state = _seed_state(config, prob)
  _, transitions, valid, _ = kernel_ppo.collect(config, prob, seed_state, 1, jax.random.key(1))
  agent, apply_fn = seed_state["agent"], kernel_ppo.network(config, prob).apply
  new_agent, info = jax.jit(
    lambda a: kernel_ppo.nn_npg_update(config, prob, a, transitions, valid, 0.5, jax.random.key(2))
  )(agent)

  def released_loss(params, indices):
    batch = jax.tree.map(lambda x: x[indices], transitions)
    return rl.npg_joint_loss(apply_fn, params, agent["old_params"], batch, 0.5, 0.99, 1.0, 0.05)

  params, *_ = jax.jit(
    lambda a: kernel_ppo.epochs_of_minibatches(
      config, released_loss, a["params"], a["opt_state"], 32, jax.random.key(2)
    )
  )(agent)
  chex.assert_trees_all_equal(new_agent["params"], params)
  q = apply_fn(agent["params"], transitions.obs)
  np.testing.assert_allclose(info["q_gap"], rl.q_gap(q), rtol=1e-6)
  np.testing.assert_allclose(info["policy_entropy"], jnp.mean(rl.categorical_entropy(q)), rtol=1e-6)


def test_windowed_returns_average_the_last_window_of_episodes():
  return_sum = np.array([0.0, -10.0, -30.0, 0.0, -20.0])  # per update
  episodes = np.array([0, 1, 2, 0, 1])
  out = kernel_ppo.windowed_returns(return_sum, episodes, 2)
  np.testing.assert_allclose(out, [-np.inf, -np.inf, -15.0, -15.0, -50 / 3])  # whole updates
  assert np.all(kernel_ppo.windowed_returns(return_sum, episodes, 5) == -np.inf)


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"nn__policy_temperature": 0.0}, "config.nn.policy_temperature: must be a positive"),
    ({"nn__policy_temperature": 2.0, "algorithm": "ppo"}, "config.nn.policy_temperature: tempers"),
    ({"study__experiment": "tau"}, "config.study.experiment: must be one of"),
    ({"eval__return_window": 0}, "config.eval.return_window"),
  ],
)
def test_bad_temperature_fields_are_named(fields, message):
  with pytest.raises(ConfigError, match=message):
    kernel_ppo.validate(tiny_config(**fields))


def _fake_mechanism_arm(final, entropy, q_gap=None):
  arm = _fake_arm(final, [final - 50.0, final])
  arm.update(
    {
      "window_return_best_per_seed": [final + 10.0, final + 20.0],
      "window_return_last_mean": final,
      "final_policy_entropy": entropy,
      "final_policy_entropy_per_seed": [entropy / 2, entropy * 1.5],
      "diag/env_steps": [100.0, 200.0],
      "diag/policy_entropy_mean": [1.0, entropy],
      "diag/policy_entropy_std": [0.0, 0.0],
    }
  )
  if q_gap is not None:
    arm.update(
      {"final_q_gap": q_gap, "diag/q_gap_mean": [1.0, q_gap], "diag/q_gap_std": [0.0, 0.0]}
    )
  return arm


def test_acrobot_mechanism_arms_and_report():
  config = kppo_config.get_config("acrobot_mechanism")
  arms = kernel_ppo.study_arms(config)
  names = [name for name, _ in arms]
  taus = [f"nn_npg_Acrobot-v1_tau{t:g}" for t in (1.0, *config.study.temperatures)]
  assert names == taus + [
    "nn_npg_Acrobot-v1_tau1_ent1",
    "nn_released_Acrobot-v1_tau1",
    "ppo_Acrobot-v1",
    "nn_npg_CartPole-v1_tau1",
    "nn_npg_CartPole-v1_tau2",
  ]
  by_name = dict(arms)
  assert by_name["nn_npg_Acrobot-v1_tau10"].nn.policy_temperature == 10.0
  assert by_name["nn_released_Acrobot-v1_tau1"].nn.quirk_bootstrap_current_state
  assert by_name["nn_npg_Acrobot-v1_tau1_ent1"].nn.entropy_coef == 1.0
  assert all(c.schedule.power == -0.5 and c.num_seeds == 3 for c in by_name.values())
  results = {name: _fake_mechanism_arm(-500.0, 0.01, 50.0) for name in names}
  results["ppo_Acrobot-v1"] = _fake_mechanism_arm(-90.0, 0.3)
  report = kernel_ppo.report(config, results)
  rows = {row["arm"]: row for row in report.rows}
  assert rows["ppo_Acrobot-v1"]["final_q_gap"] is None and rows["ppo_Acrobot-v1"]["tau"] is None
  assert rows["nn_npg_Acrobot-v1_tau1"]["best_window_return_per_seed"] == "-490 / -480"
  assert rows["nn_npg_Acrobot-v1_tau1"]["final_policy_entropy_min_seed"] == pytest.approx(0.005)
  assert report.summary["ppo_Acrobot-v1_final_return_mean"] == -90.0
  assert "ppo_Acrobot-v1_final_q_gap" not in report.summary
  assert set(report.figures) == {"acrobot"}
