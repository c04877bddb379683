r"""Kernel PPO: "Sampling Complexity of TD and PPO in RKHS" (Zou et al., ICLR 2026).

Claim: NPG in an RKHS (kernel TD critic + KL-proximal exponentiated policy step) converges at
O(k^{-1/2}) with step sizes Delta_k = k^{-1/2} and a growing sampling rule n(k); empirically k^{-0.5}
beats k^{-0.2} (unstable) and k^{-1.5} (stalls) on CartPole-v1 and Acrobot-v1, and TD-NPG has a
higher throughput than clip-PPO with GAE.

Variants (all on gymnax environments, the whole rollout + update loop jitted and vmapped over seeds):
  default      (A) NN-NPG, the released code's learner with the s' fix, CartPole-v1, 5 seeds,
               200k env steps per seed; about a minute on 2 CPU cores.
  nn_released  (A) with the released code's quirks: TD target weighted by pi(.|s) instead of
               pi(.|s'), time limit as terminal, first KL against a separately initialised network.
  rff          (B) RFF-kernel NPG (D = 256 features per action block, 32 kernel-TD iterations).
  rff_growing  (B) with the growing sampling rule n(k) = min(128 k, 4096).
  exact        (C) exact kernel TD on each batch of 128 (dense Gram, closed-form fixed point),
               the policy one kernel expansion over every batch; 25k env steps per seed.
  ppo          clip-PPO with GAE, same network, batch and epochs (the baseline).
  study        experiments/study.py: p in {-0.2, -0.5, -1.5} on CartPole-v1 and Acrobot-v1 (NN-NPG),
               fixed vs growing n(k) for RFF-kernel NPG on both, throughput against clip-PPO;
               about 10 minutes on 2 CPU cores.
  acrobot_mechanism  experiments/study.py: why NN-NPG's policy collapses on Acrobot-v1. NN-NPG
               p = -0.5 with the paper's policy softmax(Q) (tau = 1) and softmax(Q / tau) for each
               of `study.temperatures`, the released code's quirks, clip-PPO, and tau = 1 on
               CartPole-v1; 3 seeds, 200k env steps each, Q-gap and policy entropy logged per update.
  gpu          paper scale on one accelerator: 10 seeds (the paper's count), 1M env steps per seed
               (~1000 episodes of the released code's runs are 300k), n_max = 4096, D = 1024.

  python experiments/train.py --config=configs/kernel_ppo.py
  python experiments/train.py --config=configs/kernel_ppo.py:rff_growing
  python experiments/study.py --config=configs/kernel_ppo.py:study --workdir=runs/kernel_ppo_study
  python experiments/study.py --config=configs/kernel_ppo.py:acrobot_mechanism \
    --workdir=runs/kernel_ppo_acrobot
"""

import ml_collections

from configs import common

VARIANTS = (
  "default",
  "nn_released",
  "rff",
  "rff_growing",
  "exact",
  "ppo",
  "study",
  "acrobot_mechanism",
  "gpu",
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "kernel_ppo"
  config.variant = variant
  config.seed = 0

  config.algorithm = "nn_npg"  # "nn_npg" (A) | "rff_npg" (B) | "exact_npg" (C) | "ppo" (baseline)
  config.env_name = "CartPole-v1"  # or "Acrobot-v1"
  config.num_seeds = 5  # vmapped; one environment per seed
  config.env_steps = 200_000  # budget per seed; updates = the most whose n(1) + ... + n(K) fit
  config.updates_per_step = 16  # outer iterations k per step of the shared loop
  config.gamma = 0.99

  config.schedule = ml_collections.ConfigDict()
  config.schedule.power = -0.5  # Delta_k = k^power (Cor. 14: -1/2); NN-NPG's KL weight is 1/Delta_k
  config.schedule.extra_powers = ()  # more exponents in the same run, vmapped with the seeds
  config.schedule.scale = (
    1.0  # c of Delta_k = c k^power (Thm 13 holds for any c; 1 in the released code)
  )
  config.schedule.released_convention = True  # Delta_1 = first_step_size, then (k-1)^power
  config.schedule.first_step_size = 20.0  # the released code's initial beta

  config.sampling = ml_collections.ConfigDict()
  config.sampling.base = 128  # n(1): env steps per update (the released code's n_update)
  config.sampling.growth = 0.0  # rho of n(k) = min(base k^rho, maximum); 0 = fixed n (kernel only)
  config.sampling.maximum = 4096  # n_max; a multiple of base

  config.nn = ml_collections.ConfigDict()  # (A) NN-NPG and the PPO baseline
  config.nn.hidden = (64, 64)
  config.nn.learning_rate = 1e-3  # Adam
  config.nn.epochs = 4  # T: passes over each batch
  config.nn.minibatch_size = 32
  config.nn.shuffle = False  # the released code iterates minibatches in order
  config.nn.value_coef = 1.0  # c_v
  config.nn.entropy_coef = 0.05  # c_ent
  config.nn.policy_temperature = (
    1.0  # tau of pi = softmax(Q / tau); 1 = the paper's pi = softmax(Q)
  )
  config.nn.quirk_bootstrap_current_state = False  # released code: weights Q(s', .) by pi(.|s)
  config.nn.quirk_time_limit_terminal = False  # released code: done = terminated or truncated
  config.nn.quirk_separate_old_init = False  # released code: first KL against a fresh network

  config.kernel = ml_collections.ConfigDict()  # (B) RFF and (C) exact kernel NPG
  config.kernel.lengthscale = 0.2  # RBF length scale, in units of core.rl.OBS_SCALES
  config.kernel.num_features = 256  # D random Fourier features per action block (B)
  config.kernel.solver = (
    "iterate"  # "iterate" (T functional-gradient steps) | "solve" (fixed point)
  )
  config.kernel.td_iterations = 32  # T per update
  config.kernel.td_step_size = 1.0  # eta * n: the step on the mean TD residual
  config.kernel.td_decay = 1e-3  # alpha; the ridge is lambda = alpha / (eta n)
  config.kernel.warm_start = True  # (B) iterate from theta^(k-1)
  config.kernel.next_action = "expected"  # a1 at s1: "expected" under pi_k or "sampled" from it

  config.ppo = ml_collections.ConfigDict()  # clip-PPO with GAE (network, lr, epochs from config.nn)
  config.ppo.clip = 0.2
  config.ppo.gae_lambda = 0.95
  config.ppo.value_coef = 0.5
  config.ppo.entropy_coef = 0.01
  config.ppo.normalize_advantages = True

  config.eval = ml_collections.ConfigDict()
  config.eval.num_episodes = 10  # fresh episodes per seed for final_return
  config.eval.return_window = 20  # training episodes per running mean (the released code's log)
  config.eval.throughput_repeats = 10  # timed calls of the jitted unit; the best counts
  config.eval.compare_with_ppo = True  # also time clip-PPO's unit, interleaved (same process)

  config.loop = common.loop_config(log_every=10, checkpoint_every=50)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.experiment = "schedules"  # or "acrobot_mechanism" (the policy temperature study)
  config.study.envs = ("CartPole-v1", "Acrobot-v1")
  config.study.powers = (-0.2, -0.5, -1.5)
  config.study.main_power = -0.5  # the exponent of the rff arms and of the throughput comparison
  config.study.kernel_step_scale = 0.05  # schedule.scale of the rff arms
  config.study.sampling_envs = ("CartPole-v1", "Acrobot-v1")
  config.study.sampling_growth = 1.0  # Gaussian-kernel reading of the rule: n(k) ~ k
  config.study.growing_updates_per_step = 2  # growing n(k) makes ~16x fewer updates: finer curve
  config.study.throughput_env = "CartPole-v1"
  config.study.late_fraction = 0.33  # the "late" part of training for the drawdown measure
  config.study.mechanism_env = "Acrobot-v1"  # acrobot_mechanism: where the policy collapses
  config.study.temperatures = (1.5, 2.0, 3.0, 10.0)  # tau of pi = softmax(Q / tau), besides 1
  config.study.entropy_coefs = (1.0,)  # c_ent at tau = 1 (c_ent = tau: no gap-widening force)
  config.study.reference_env = "CartPole-v1"  # where tau = 1 learns ("" to leave out)
  config.study.reference_temperatures = (1.0, 2.0)  # tau of the reference_env arms

  if variant == "nn_released":
    config.nn.quirk_bootstrap_current_state = True
    config.nn.quirk_time_limit_terminal = True
    config.nn.quirk_separate_old_init = True
  if variant in ("rff", "rff_growing", "exact"):
    config.algorithm = "rff_npg" if variant != "exact" else "exact_npg"
    config.schedule.released_convention = False
    config.schedule.scale = 0.05  # Delta_k multiplies Q-values of size ~1/(1-gamma) directly
  if variant == "rff_growing":
    config.sampling.growth = 1.0
    config.updates_per_step = 2  # n(k) reaches n_max by k = 32: ~16x fewer updates than fixed n
  if variant == "exact":
    config.kernel.solver = "solve"
    config.env_steps = 25_000
  if variant == "ppo":
    config.algorithm = "ppo"
  if variant == "study":
    config.loop = common.loop_config(log_every=25, checkpoint_every=1000)
  if variant == "acrobot_mechanism":
    config.study.experiment = "acrobot_mechanism"
    config.env_name = "Acrobot-v1"
    config.num_seeds = 3
    config.eval.compare_with_ppo = False
    config.eval.throughput_repeats = 2
    config.loop = common.loop_config(log_every=25, checkpoint_every=1000)
  if variant == "gpu":
    config.num_seeds = 10
    config.env_steps = 1_000_000
    config.updates_per_step = 64
    config.kernel.num_features = 1024
    config.loop = common.loop_config(log_every=10, checkpoint_every=20)
  return config
