r"""SGD as diffusion on porous media: "Almost Bayesian: Dynamics of SGD Through Singular Learning Theory"
(Hennick & De Baerdemacker, ICLR 2026).

Claim: late-stage SGD is a sub-diffusive walk on the porous low-loss set (`R(t) ∝ t^s`, s < 1/2,
`d_s = 2 lambda s <= lambda`) whose local steady state is a tempered Bayesian posterior restricted to the
region SGD can reach; singular (low-LLC) regions shape where SGD goes.

Experiments (`config.experiments`):
  toys    D1: SGD/SGLD chains on four 2-D toys (regular R, singular A, A0, B) against exact grid
          posteriors at every temperature; per-valley temperatures, accessibility, displacement.
  llc     the localised-SGLD LLC estimator on the toys against their known coefficients.
  digits  D2: Adam pre-training, then late-stage SGD (or Adam) of a 64-64-64-10 MLP on scikit-learn
          digits at several learning rates with R(t) and LLC tracking.
  moons   D3: an SGD ensemble of 2-16-16-1 nets on two moons against local-posterior masses.

Variants:
  default  toys + llc + digits at CPU size: ~3 minutes on 2 CPU cores.
  study    experiments/study.py runs four arms (toys + llc at full CPU size, digits with SGD at three
           learning rates, digits with Adam, moons); ~15 minutes on an idle 2-core machine.
  sweep    the study's toys arm and the late-stage exponent sweep: toys A and B at every learning
           rate x batch size x label noise of `config.study.sweep_*` (s < 1/2 sought).
  gpu      paper scale on one accelerator: 65536 chains per group and 20k steps on the toys (the study
           sweeps n in {1e2, 1e3, 1e4}), the paper's MNIST fully connected nets from a prepared tfds
           `--config.digits.data_dir` (never downloaded), 1024 moons nets.

  python experiments/train.py --config=configs/sgd_porous.py --workdir=runs/sgd_porous
  python experiments/study.py --config=configs/sgd_porous.py:study --workdir=runs/sgd_porous_study
  python experiments/study.py --config=configs/sgd_porous.py:sweep --workdir=runs/sgd_porous_sweep
  python experiments/bench_chains.py --config=configs/sgd_porous.py
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "sweep", "gpu")


def toys_config() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.models = ("R", "A", "A0", "B")
  t.n = 1000  # samples of y = x c + noise_std eps
  t.noise_std = 1.0  # label noise: scales every per-sample gradient's noise (and n L_n)
  t.data_seed = 0
  t.orthogonal_noise = True  # eps projected off x: the empirical minimum set is the population's
  t.box = 3.0  # prior Uniform[-box, box]^2; chains are clipped to it
  t.chains = 1024  # chains per group (SGD per learning rate, SGLD per initialisation)
  t.blocks = 8  # equal chain blocks per group: intervals (95%, Student t) over independent blocks
  t.steps = 6000  # iterations per chain
  t.burn_in = 2000  # iterations before histograms and displacements start
  t.thin = 10  # iterations between histogram records
  t.records_per_call = (
    100  # records per loop step (a loop step = records_per_call * thin iterations)
  )
  t.learning_rates = (0.02,)  # SGD learning rates (the first is the headline group)
  t.batch_sizes = (8,)  # SGD batch sizes (the first is the headline group)
  t.sgld_learning_rate = 3e-3  # SGLD control: relaxes from the prior in ~1500 steps; T_M = 0.023
  t.sgld_batch_size = 64
  t.sgld_temperature = 1.0
  t.sgld_inits = ("posterior",)  # "posterior": exact draws from p_1 (stationarity); "prior": mixing
  t.bins = 64  # histogram bins per axis (the coarse-graining scale of every comparison)
  t.subdivisions = 8  # midpoint-rule points per bin and axis for the exact posterior masses
  t.coarse = 401  # grid over the whole box for the mass outside R's window
  t.regular_half_width = 0.15  # R's window around c (its posterior is a narrow Gaussian)
  t.temperatures = (1e-3, 1e3, 121)  # (lo, hi, odd count) log-spaced grid for T* fits (12% steps)
  t.refine_points = 81  # T* refined on this many points over 2 grid steps either side (0.6% steps)
  t.xi = 0.5  # coarse-graining scale of D_xi = xi^(2 - 1/s) (the paper's moons choice)
  t.num_lags = 24  # geometric displacement lags
  t.init_resolution = 1201  # grid of the exact draws that start "posterior" SGLD chains
  return t


def llc_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.models = (
    "R",
    "A",
    "A0",
    "B",
  )  # llc_errors lists R, A, B (A0 is reported apart: multiplicity 2)
  c.step_size = 2e-4  # eps of localised SGLD (discretisation bias ~ eps n beta H / 4 ~ 1.5% for A)
  c.localization = 1.0  # gamma
  c.chains = 32
  c.steps = 4000
  c.burn_in = 800
  c.batch_size = 64
  return c


def digits_config() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.dataset = "digits"  # "digits" (scikit-learn) or a tfds image set name read from data_dir
  d.data_dir = ""  # prepared tfds data_dir (never downloaded)
  d.num_classes = 10
  d.hidden = (64, 64)  # 64-64-64-10 MLP
  d.seeds = 1  # nets per learning rate
  d.batch_size = 128
  d.pretrain_learning_rate = 1e-3  # Adam, phase 1
  d.pretrain_steps = 1500
  d.pretrain_steps_per_call = 100
  d.optimizer = "sgd"  # late stage: "sgd" (vanilla, the theory's setting) or "adam" (contrast)
  d.learning_rates = (1e-2,)  # late-stage rates, one chain group each (the first is the headline)
  d.steps = 4000  # late-stage steps
  d.record_every = 100  # R(t) interval
  d.llc_every = 1000  # LLC interval (one loop step)
  d.llc = ml_collections.ConfigDict()
  d.llc.step_size = 1e-4  # the loss trace plateaus after ~50 steps here (1e-5 has not by 1000)
  d.llc.localization = 100.0
  d.llc.chains = 2
  d.llc.steps = 400
  d.llc.burn_in = 100
  d.llc.batch_size = 128
  return d


def moons_config() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.n = 200  # make_moons samples
  m.noise = 0.1
  m.data_seed = 0
  m.nets = 256  # ensemble size
  m.hidden = (16, 16)  # 2-16-16-1
  m.learning_rate = 0.1
  m.batch_size = 20
  m.steps = 6000
  m.steps_per_call = 1000
  m.late_start = 3000  # displacement measured from here
  m.record_every = 50
  m.grid = 20  # signature grid: grid x grid points
  m.cluster_radius = 8  # Hamming radius (grid points) of a function cluster
  m.xi = 0.5  # coarse-graining scale of D_xi (the paper's choice)
  # SGLD ensembles from the same initial nets: the local posterior at these temperatures (their
  # minibatch noise adds about T_M ~ 0.025, SGD's own Mandt temperature here)
  m.sgld_temperatures = (1.0, 0.1, 0.03)
  m.llc = ml_collections.ConfigDict()
  m.llc.step_size = 1e-3  # estimates agree for eps in 1e-4..1e-3 (0.25); 3e-3 starts to bias up
  m.llc.localization = 100.0
  m.llc.chains = 2
  m.llc.steps = 300
  m.llc.burn_in = 75
  m.llc.batch_size = 50
  return m


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "sgd_porous"
  config.variant = variant
  config.seed = 0
  config.experiments = ("toys", "llc", "digits")
  config.toys = toys_config()
  config.llc = llc_config()
  config.digits = digits_config()
  config.moons = moons_config()
  config.study = ml_collections.ConfigDict()
  config.study.toy_sizes = ()  # extra toys arms at these n (occupancy scaling n^(1/2 - 1/4))
  config.study.adam_learning_rates = (1e-4, 1e-3)  # the digits_adam arm's late-stage rates
  # arms of the study, a subset of methods.sgd_porous.study.ARM_SETS
  config.study.arms = ("toys", "toy_sizes", "digits_sgd", "digits_adam", "moons")
  # the "sweep" arms: one per label-noise std, each every toy x learning rate x batch size below
  config.study.sweep_models = ("A", "B")
  config.study.sweep_learning_rates = (0.005, 0.01, 0.02, 0.04)
  config.study.sweep_batch_sizes = (8, 64)
  config.study.sweep_noise_stds = (1.0, 3.0)
  config.study.sweep_chains = 1024
  config.loop = common.loop_config(log_every=1, checkpoint_every=5)
  # Chains are state, not batch: "fsdp" splits every leaf of >= fsdp_min_size elements along its
  # largest axis divisible by the device count, which is the chain axis of the chain arrays.
  common.add_parallelism(config, sharding="fsdp")
  config.fsdp_min_size = 512

  if variant in ("study", "sweep"):
    config.toys.chains = 2048
    config.toys.steps = 10_000
    config.toys.learning_rates = (0.02, 0.005)
    config.toys.batch_sizes = (8, 64)
    config.toys.sgld_inits = ("posterior", "prior")
    config.digits.learning_rates = (1e-3, 3e-3, 1e-2)
    config.digits.seeds = 2
    config.digits.steps = 10_000
    config.digits.llc_every = 2000
  if variant == "sweep":  # the D1 toys arm and the exponent sweep only (no digits, no moons)
    config.study.arms = ("toys", "sweep")

  if variant == "gpu":
    config.experiments = ("toys", "llc", "digits", "moons")
    config.toys.chains = 65_536
    config.toys.steps = 20_000
    config.toys.burn_in = 5000
    config.toys.records_per_call = 500
    config.toys.learning_rates = (0.02, 0.005)
    config.toys.batch_sizes = (8, 64)
    config.toys.sgld_inits = ("posterior", "prior")
    config.toys.bins = 128
    config.study.toy_sizes = (100, 10_000)
    config.llc.chains = 256
    config.digits.dataset = "mnist"  # the paper's MNIST fully connected nets
    config.digits.hidden = (256, 256)
    config.digits.seeds = 8
    config.digits.learning_rates = (1e-3, 3e-3, 1e-2, 3e-2)
    config.digits.pretrain_steps = 10_000
    config.digits.steps = 50_000
    config.digits.llc_every = 5000
    config.digits.llc.chains = 4
    config.digits.llc.steps = 1000
    config.digits.llc.burn_in = 200
    config.moons.nets = 1024
    config.moons.steps = 20_000
    config.moons.late_start = 10_000
    config.moons.sgld_temperatures = (1.0, 0.3, 0.1, 0.03)
    config.fsdp_min_size = 2**14
  return config
