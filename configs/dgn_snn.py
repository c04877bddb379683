r"""DGN: "A Brain-Inspired Gating Mechanism Unlocks Robust Computation in Spiking Neural Networks"
(Bai, Wang, Yu; ICLR 2026), the Dynamic Gated Neuron.

Claim: a spiking neuron whose inputs also drive a conductance (an activity-dependent leak, Eq. 4-7)
matches LIF on clean data and degrades far less under spike perturbations never seen in training
(insertion, deletion, both, gradient attacks), because the gate raises the leak and cancels part of
the input noise (Eq. 13-14).

Variants:
  default       temporal-order spike digits (64 channels, 100 steps, 10 classes in time-reversed pairs),
                a 64-128-10 feed-forward DGN and the same network with LIF neurons, one seed each, 600
                Adam steps, both tested on every perturbation and FGSM / BIM / PGD at eps 0.01; the variance
                check. 5.1 min wall at load ~12 (49 s user CPU) with PGD alone.
  study         experiments/study.py: LIF, DGN, s-DGN and a parameter-matched LIF (128 -> 256 hidden)
                with 3 vmapped seeds each, the phi = sigmoid ablation, LIF and DGN on MNIST-1D-style
                population-coded spikes, FGSM / BIM / PGD, spike counts; the variance check. 7 arms; 59 min
                wall at load ~13 (9.4 min user CPU) with PGD alone; BIM adds about as much again.
  gpu           paper scale: Spiking Heidelberg Digits (700 channels, 20 classes; shd_train.h5 and
                shd_test.h5 under --config.data.data_dir), a recurrent 700-128-128-20 network, 250 steps,
                3 seeds, 100 epochs; stops at validation naming config.data.data_dir when the files are
                missing.
  gpu_tidigits  TIDIGITS (11 classes) as spike events in the SHD layout (tidigits_train.h5,
                tidigits_test.h5 under --config.data.data_dir), a 100-unit feed-forward DGN.

  python experiments/train.py --config=configs/dgn_snn.py --workdir=runs/dgn_snn
  python experiments/study.py --config=configs/dgn_snn.py:study --workdir=runs/dgn_snn_study
  python experiments/study.py --config=configs/dgn_snn.py:gpu --config.data.data_dir=/data/shd
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu", "gpu_tidigits")


def _data(variant: str) -> ml_collections.ConfigDict:
  data = ml_collections.ConfigDict()
  data.name = "temporal_digits"  # temporal_digits | mnist1d (generated) | shd | tidigits (files)
  data.data_dir = ""  # shd / tidigits: folder with <name>_train.h5 and <name>_test.h5
  data.seed = 0  # draws the samples (train: 2 seed, test: 2 seed + 1)
  data.prototype_seed = 0  # temporal_digits: the class prototypes
  data.num_steps = 100  # T
  data.channels = 64  # input neurons
  data.num_classes = 10
  data.train_per_class = 400
  data.test_per_class = 100
  data.background_rate = 0.002  # temporal_digits: spontaneous spikes per bin
  data.max_time = 1.4  # shd / tidigits: seconds binned into num_steps
  data.max_test_examples = 100_000  # shd / tidigits: test examples read
  if variant == "gpu":
    data.name = "shd"
    data.num_steps = 250
    data.channels = 700
    data.num_classes = 20
  if variant == "gpu_tidigits":
    data.name = "tidigits"
    data.num_steps = 250
    data.channels = 700
    data.num_classes = 11
  return data


def _model(variant: str) -> ml_collections.ConfigDict:
  model = ml_collections.ConfigDict()
  model.kind = "dgn"  # lif | dgn | sdgn
  model.hidden_sizes = (128,)
  model.recurrent = False  # recurrent hidden layers (own spike trace through W_rec, C_rec)
  model.dt = 1.0  # Euler step (Eq. 5-8)
  model.tau_s = 5.0  # synaptic trace time constant: decay exp(-dt / tau_s)
  model.g_l = 0.1  # leak: LIF decay 1 - g_l dt = 0.9
  model.threshold = 1.0
  model.phi = "clip"  # truncation of Eq. 6: clip to [0, 1] (C = 0 is LIF) | sigmoid
  model.surrogate = "rectangle"  # rectangle | atan | fast_sigmoid
  model.surrogate_width = 1.0  # a: peak 1/a, unit integral
  model.detach_reset = False  # stop the gradient through the soft reset
  model.w_scale = 2.0  # W ~ N(0, (w_scale / sqrt(n_in))^2)
  model.readout_scale = 0.2  # the readout's w_scale: initial logits of order 1
  model.c_scale = 0.1  # C ~ |N(0, (c_scale / sqrt(n_in))^2)|
  model.reversal_init = 2.0  # s-DGN: E at init (W = E C)
  # traces and readout (kernels.ssm_scan): sequential (lax.scan: on CPU it compiles 2x faster than the
  # associative scan and runs as fast) | xla | pallas | auto (Pallas on GPU/TPU, xla on CPU)
  model.scan_implementation = "sequential"
  if variant == "gpu":
    model.hidden_sizes = (128, 128)
    model.recurrent = True
  if variant == "gpu_tidigits":
    model.hidden_sizes = (100,)
  if variant in ("gpu", "gpu_tidigits"):
    model.scan_implementation = "auto"
  return model


def _eval(variant: str) -> ml_collections.ConfigDict:
  e = ml_collections.ConfigDict()
  e.additive_probs = (0.005, 0.01, 0.02, 0.05, 0.1)  # each silent bin spikes w.p. p
  e.subtractive_probs = (0.1, 0.2, 0.3, 0.5, 0.7)  # each spike deleted w.p. p
  e.mixed_probs = ((0.01, 0.1), (0.02, 0.2), (0.05, 0.3))  # (p_add, p_delete)
  e.jitter_sigmas = (1.0, 2.0, 4.0)  # spikes moved by round(N(0, sigma^2)) steps
  # L-inf gradient attacks (core.attacks) on inputs relaxed to [0, 1], through the surrogate
  # gradients; () = none. Every bin may move by eps, so eps = 0.05 over 100 x 64 bins already breaks
  # LIF and DGN alike.
  e.attacks = ("fgsm", "bim", "pgd")  # PGD = BIM from a random start in the eps-ball
  e.attack_epsilons = (0.01,)
  e.attack_steps = 10  # BIM and PGD iterations (FGSM: one step of eps)
  e.attack_step_scale = 2.5  # BIM / PGD step size = scale * eps / steps
  e.attack_examples = 250  # the first test examples attacked (BIM / PGD: steps backward passes)
  e.chunk = 250  # test examples per jitted evaluation call
  e.num_train_examples = 1000  # train subset for train_accuracy
  if variant in ("study", "gpu", "gpu_tidigits"):
    e.attack_epsilons = (0.005, 0.01, 0.02)
  if variant in ("gpu", "gpu_tidigits"):
    e.chunk = 256
    e.attack_examples = 2048
  return e


def _stability() -> ml_collections.ConfigDict:
  """The Eq. 13-14 check: one neuron, three inputs sharing one white noise."""
  s = ml_collections.ConfigDict()
  s.enabled = True
  s.weights = (0.8, 0.5, -0.3)  # W_i
  s.conductances = (0.5, 0.3, 0.2)  # C_i at scale 1 (same sign as W_i for the first two)
  s.means = (1.0, 0.8, 0.5)  # mu_i
  s.stds = (0.3, 0.2, 0.1)  # sigma_i
  s.g_l = 1.0
  s.conductance_scales = (0.0, 0.5, 1.0, 2.0, 4.0)  # C = scale * conductances; 0 is LIF
  # steps of the neuron's update: at 1e-3 the clip of phi binds in ~40% of the steps (the neuron leaves
  # the SDE); at 0.2 it never binds for scales <= 1, and the update's exact variance is known
  s.dts = (1e-3, 0.05, 0.2)
  s.unclipped_tolerance = 1e-3  # cells with at most this clipped fraction count as "theory applies"
  s.num_steps = 20_000
  s.burn_in = 5_000
  s.num_chains = 256
  return s


def _study() -> ml_collections.ConfigDict:
  study = ml_collections.ConfigDict()
  # (arm name, model kind, hidden width multiplier): with one hidden layer, LIF at twice the width has
  # exactly the DGN's parameter count (n_in 2n + 2n n_out = 2 (n_in n + n n_out))
  study.models = (("lif", "lif", 1), ("dgn", "dgn", 1), ("sdgn", "sdgn", 1))
  study.models += (("lif_matched", "lif", 2),)
  study.phi_ablation = True  # a DGN arm with phi = sigmoid
  study.second_dataset = "mnist1d"  # LIF and DGN again on this data; "" = none
  return study


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "dgn_snn"
  config.variant = variant
  config.seed = 0
  config.num_seeds = 1  # independent networks trained side by side (a vmapped axis)
  config.compare_lif = True  # also train the same network with LIF neurons (results *_lif)
  config.data = _data(variant)
  config.model = _model(variant)
  config.batch_size = 128
  config.steps = 600
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 50
  config.optim.grad_clip = 1.0
  config.eval = _eval(variant)
  config.stability = _stability()
  config.study = _study()
  config.loop = common.loop_config(log_every=100, checkpoint_every=300)
  common.add_parallelism(config)
  if variant == "study":
    config.num_seeds = 3
    config.compare_lif = False  # the study's LIF arms are the comparison
  if variant in ("gpu", "gpu_tidigits"):
    config.num_seeds = 3
    config.batch_size = 256
    config.steps = 3200  # ~100 epochs of SHD's 8156 training examples
    config.loop = common.loop_config(log_every=100, checkpoint_every=1000)
  return config
