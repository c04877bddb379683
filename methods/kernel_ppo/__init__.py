"""Kernel PPO: "Sampling Complexity of TD and PPO in RKHS" (Zou, Ren, Zhang, Ding, Li; ICLR 2026).

Claim: NPG in an RKHS -- kernel TD for the critic f^(k) ~ Q^{pi_k}, then the KL-proximal step
pi_{k+1} ∝ pi_k exp(Delta_k f^(k)) -- improves at rate O(k^{-1/2}) with Delta_k = k^{-1/2} and a
sampling rule n(k) that grows with k (Thm 13, Cor. 14); in the released code's experiments
Delta_k = k^{-0.5} reaches the optimum of CartPole-v1 while k^{-0.2} is unstable and k^{-1.5}
stalls, and one-step TD NPG runs faster than clip-PPO with GAE (7210 vs 5406 env steps/s).

One phase, `train`. Each step of the shared loop runs `updates_per_step` outer iterations k
(rollout of n(k) environment steps with pi_k, critic, policy step) for every seed at once: the
rollout-and-update loop is one jitted function `vmap`ped over `num_seeds` seeds. `config.algorithm`:

  nn_npg     (A) port of the released code (conniemessi/TD-and-PPO-in-RKHS, `main_discrete.py`): one
             MLP f_theta gives logits and Q; per update T epochs of Adam on -E[<pi_theta, Qbar>]
             + (1/Delta_k) KL(pi_theta || pi_old) + c_v TD-MSE - c_ent H (`core.rl.npg_joint_loss`).
             The TD target weights Q(s', .) with pi(.|s'); `nn.quirk_bootstrap_current_state`
             restores the released code's pi(.|s). `nn.policy_temperature` tau != 1 (an option,
             off by default) makes the policy softmax(Q / tau) (`temperature` of `core.rl.npg_joint_loss`);
             each update logs the Q-gap max_a Q - min_a Q and the policy entropy on its batch.
  rff_npg    (B) the RKHS algorithm (Alg. 1) with random Fourier features of
             K((s,a),(s',a')) = k_RBF(s,s') 1[a=a']: T kernel-TD iterations on theta (primal form of
             the paper's RKHS functional-gradient iteration, Alg. 1 (ii); `core.rkhs.feature_td_critic`),
             then the exact exponentiated step Theta_k = Theta_{k-1} + Delta_k theta^(k), logits
             phi(s)^T Theta_k (Alg. 1 (iii)). Fixed n or growing n(k) = min(n0 k^rho, n_max).
  exact_npg  (C) the same with the exact kernel on each batch (dense n x n Gram): coefficients b^(k)
             by the closed-form fixed point (K + (alpha/eta) I - gamma C)^{-1} r or by the
             coefficient iteration (`core.rkhs.exact_td_critic`); the policy is one kernel expansion
             over every batch seen, its coefficients Delta_k b^(k) accumulated
             (`core.rkhs.KernelExpansion`).
  ppo        clip-PPO with GAE (lambda 0.95, clip 0.2), same MLP torso, batch, epochs and
             minibatches: the throughput and return baseline.

Layout: `phases.py` (problem sizes, policies, the four updates, the vmapped unit, evaluation),
`study.py` (arms, report, figures), `mechanism.py` (the Acrobot study of the policy's collapse and
the policy temperature); environment and agent maths in `core/rl.py`, kernels and kernel TD in
`core/rkhs.py`; this file validates the config.

Choices where the paper is open (each a config field):
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

import ml_collections

from core import rkhs, rl
from methods.base import Method, require, require_choice, require_positive_int
from methods.kernel_ppo.phases import (
  ALGORITHMS,
  KERNEL_ALGORITHMS,
  UPDATES,
  Problem,
  baseline_config,
  collect,
  curve_of,
  epochs_of_minibatches,
  evaluate,
  exact_critic,
  exact_npg_update,
  group_results,
  growth_of,
  init_state,
  network,
  nn_npg_update,
  phases,
  policy_logits,
  powers,
  ppo_update,
  problem,
  rff_npg_update,
  scaled,
  step_size,
  td_inputs,
  train_step,
  windowed_returns,
)
from methods.kernel_ppo.study import EXPERIMENTS, best_of, late_drawdown, report, study_arms

__all__ = [
  "ALGORITHMS",
  "KERNEL_ALGORITHMS",
  "MAX_EXACT_BATCH",
  "MAX_EXACT_SUPPORT",
  "METHOD",
  "UPDATES",
  "Problem",
  "baseline_config",
  "best_of",
  "collect",
  "curve_of",
  "epochs_of_minibatches",
  "evaluate",
  "exact_critic",
  "exact_npg_update",
  "group_results",
  "growth_of",
  "init_state",
  "late_drawdown",
  "network",
  "nn_npg_update",
  "phases",
  "policy_logits",
  "powers",
  "ppo_update",
  "problem",
  "report",
  "rff_npg_update",
  "scaled",
  "step_size",
  "study_arms",
  "td_inputs",
  "train_step",
  "validate",
  "windowed_returns",
]

MAX_EXACT_BATCH = 4096  # dense n x n Gram per update
MAX_EXACT_SUPPORT = 262_144  # kernel-expansion rows the exact policy may hold


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "algorithm", ALGORITHMS)
  require_choice(config, "study.experiment", EXPERIMENTS)
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
    "eval.return_window",
  ):
    require_positive_int(config, field)
  require(0.0 < config.gamma < 1.0, "gamma", f"must be in (0, 1), got {config.gamma}")
  _validate_temperature(config)
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


def _validate_temperature(config) -> None:
  tau = config.nn.policy_temperature
  require(
    isinstance(tau, int | float) and tau > 0,
    "nn.policy_temperature",
    f"must be a positive number, got {tau!r}",
  )
  require(
    tau == 1.0 or config.algorithm == "nn_npg",
    "nn.policy_temperature",
    f"tempers NN-NPG's policy softmax(Q / tau) only; set it to 1 for {config.algorithm!r}",
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
  require_choice(config, "kernel.solver", rkhs.TD_SOLVERS)
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


METHOD = Method(
  name="kernel_ppo", phases=phases, validate=validate, study_arms=study_arms, report=report
)
