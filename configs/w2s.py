r"""W2S: "Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (ICLR 2026).

arXiv 2509.24005; method page docs/methods/w2s.md.

Claim: W2S always helps when the unlabelled minority fraction eta_u equals the labelled one eta_l, its
gain falls as (eta_u - eta_l)^2 grows and can turn negative, and retraining the student on its own
low-entropy subset with generalised cross-entropy (Enhanced-W2S) helps most in the mismatched settings.
Method: the package `methods/w2s/`.

Variants:
  default     E2: Gaussian classification with a spurious attribute, mismatched
              (eta_l, eta_u) = (0.5, 0.05), 10 seeds vmapped; teacher -> pseudolabels -> W2S student ->
              Enhanced-W2S over a 4 x 4 (p, q) grid. About a minute on 2 CPU cores.
  regression  E1: the paper's ridgeless-regression setting, the whole theory-vs-simulation grid in
              one run (closed-form phases).
  digits      the image variant: scikit-learn digits 5-9 (label = odd) with an injected stripe, a small
              MLP teacher on 2x2-pooled pixels, a strong student whose CNN backbone is pre-trained here
              by SimCLR on the 1500 training digits without labels and without stripes; linear heads
              on its z-scored features. About 100 s of CPU.
  digits_transfer
              the first image setup, kept for comparison: the same splits and teacher, the backbone an
              MLP pre-trained (supervised) on digits 0-4; its best heads do not beat the teacher.
  study       E1 + E2 + both digits setups over (eta_l, eta_u) in {(0.5, 0.05), (0.05, 0.5),
              (0.05, 0.05), (0.5, 0.5)}; writes the gain-vs-shift, simulated-vs-predicted,
              failure-region and digits figures and the teacher / ceiling / W2S / Enhanced-W2S table.
  digits_study
              both digits setups over the four settings only (8 arms), with the digits figure.
  gpu         the paper's benchmark setting through tfds: CelebA (label Blond_Hair, spurious Male) read
              from a prepared --config.tfds.data_dir (never downloaded); a Waterbirds-style builder
              works with --config.tfds.name=<builder> --config.tfds.label_key=label
              --config.tfds.attribute_key=place. MLP backbones on 64x64 images, one GPU.

  python experiments/train.py --config=configs/w2s.py --workdir=runs/w2s
  python experiments/train.py --config=configs/w2s.py:regression --workdir=runs/w2s_e1
  python experiments/study.py --config=configs/w2s.py:study --workdir=runs/w2s_study
  python experiments/study.py --config=configs/w2s.py:digits_study --workdir=runs/w2s_digits_study
"""

import ml_collections
import numpy as np

from configs import common

VARIANTS = ("default", "regression", "digits", "digits_transfer", "study", "digits_study", "gpu")


def _regression(config: ml_collections.ConfigDict) -> None:
  """E1: d_z = 64, p = 8, p_T = 5, p_S = 3, n = 3200, N = 9600."""
  r = config.regression = ml_collections.ConfigDict()
  r.d_z = 64  # core dimension
  r.group_dim = 8  # p, dimension of the group feature xi
  r.teacher_group_dim = 5  # p_T (d_T = p_T d_z = 320)
  r.student_group_dim = 3  # p_S (d_S = 192)
  r.sigma_y = 1.0  # label noise
  r.sigma_xi = 1.0  # within-group spread of xi
  r.separations = (2.0, 8.0, 64.0)  # s = ||mu||^2 / sigma_xi^2
  r.similarities = (0.0, 1.0, 2.0)  # ||Xi||_F^2 = ||T^T S||_F^2 in [0, p_S - 1]
  r.eta_labelled = (0.02, 0.1, 0.3, 0.5)
  # linspace(0, 0.5, 11) plus 0.02, so that every eta_l has its matched eta_u
  r.eta_unlabelled = tuple(sorted({*np.round(np.linspace(0, 0.5, 11), 6).tolist(), 0.02}))
  r.num_labelled = 3200  # n (d_T / n = 0.1)
  r.num_unlabelled = 9600  # N


def _classification(config: ml_collections.ConfigDict) -> None:
  """E2 (Gaussian blocks; weak = random 6-dim projection, core amplitude x0.3)."""
  c = config.classification = ml_collections.ConfigDict()
  c.core_dim = 16
  c.spurious_dim = 8
  c.noise_dim = 16
  c.core_norm = 4.0  # ||mu_c||
  c.spurious_norm = 2.0  # ||mu_s||
  c.weak_dim = 6  # teacher's random projection
  c.weak_core_scale = 0.3  # core amplitude kept by the teacher's view
  c.strong_spurious_dim = 4  # the student sees half the spurious block


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "w2s"
  config.variant = variant
  config.task = "classification"  # regression (E1) | classification (E2) | digits | tfds
  config.seed = 0
  config.num_seeds = 10  # independent replicates, one vmapped axis

  _regression(config)
  _classification(config)

  config.groups = ml_collections.ConfigDict()
  config.groups.eta_labelled = 0.5  # eta_l, minority fraction of the teacher's labelled set
  config.groups.eta_unlabelled = 0.05  # eta_u, of the unlabelled (and held-out) set
  config.groups.num_labelled = 200  # n
  config.groups.num_unlabelled = 5000  # N
  config.groups.num_heldout = 1000  # pseudolabelled held-out split for choosing (p, q)
  config.groups.num_test = (
    4000  # group-balanced test set (digits: every test digit with both stripes)
  )

  config.pseudolabels = "hard"  # hard (argmax) | soft (teacher probabilities)
  config.head_batch_size = 0  # 0: full batch; else minibatches of this size
  config.teacher = ml_collections.ConfigDict()
  config.teacher.hidden = ()  # () = softmax regression (E2); (k,) = a small MLP (images)
  config.teacher.learning_rate = 0.05
  config.teacher.steps = 300
  config.student = ml_collections.ConfigDict()
  config.student.learning_rate = 0.05
  config.student.steps = 300
  config.enhanced = ml_collections.ConfigDict()
  config.enhanced.p_grid = (0.3, 0.5, 0.7, 0.9)  # fraction kept, lowest student entropy first
  config.enhanced.q_grid = (0.3, 0.5, 0.7, 1.0)  # GCE exponent
  config.enhanced.init = "fresh"  # fresh head | continued from the W2S student
  config.enhanced.learning_rate = 0.05
  config.enhanced.steps = 300

  config.model = ml_collections.ConfigDict()
  # compute dtype of the strong backbone (pre-training and its frozen features): "float32" |
  # "bfloat16"; parameters and Adam state stay float32, and the teacher and the heads are float32
  # always (small, and their probabilities and entropies are what the paper measures)
  config.model.dtype = "float32"

  config.pretrain = ml_collections.ConfigDict()  # the strong backbone (digits, tfds)
  # supervised: cross-entropy on the backbone's own classes (digits 0-4, other CelebA attributes);
  # contrastive: SimCLR on two augmented views, no labels (digits only)
  config.pretrain.objective = "supervised"
  config.pretrain.network = "mlp"  # mlp (widths `hidden`) | cnn (digits: 3x3 convs `channels`)
  config.pretrain.hidden = (128, 128)
  config.pretrain.channels = (32, 64, 128)
  config.pretrain.projection_dim = 64  # contrastive: width of the projection head's output
  config.pretrain.temperature = 0.2  # contrastive: NT-Xent temperature
  config.pretrain.augment = ml_collections.ConfigDict(
    {"shift": 1, "keep": 0.8, "contrast": (0.6, 1.2), "noise": 0.1}
  )
  # z-score the frozen features with the unlabelled split's mean and std (per seed) before the heads
  config.pretrain.standardize_features = False
  config.pretrain.learning_rate = 1e-3
  config.pretrain.steps = 800
  config.pretrain.batch_size = 128

  config.digits = ml_collections.ConfigDict()
  config.digits.task_digits = (5, 6, 7, 8, 9)  # downstream task: is the digit odd?
  config.digits.pretrain_digits = (0, 1, 2, 3, 4)  # the backbone's different task (5-way)
  config.digits.stripe_intensity = 16.0  # the spurious row's value (pixels are 0..16)
  config.digits.teacher_pool = 2  # the weak network sees 2x2-average-pooled (4x4) images

  config.tfds = ml_collections.ConfigDict()
  config.tfds.name = "celeb_a"
  config.tfds.data_dir = ""  # prepared tfds data_dir; never downloaded
  config.tfds.train_split = "train"
  config.tfds.test_split = "test"
  config.tfds.label_key = "attributes/Blond_Hair"
  config.tfds.attribute_key = "attributes/Male"
  config.tfds.flip_attribute = True  # majority = blond women and dark-haired men (a := 1 - Male)
  config.tfds.pretrain_keys = ("attributes/Smiling", "attributes/Young", "attributes/Eyeglasses")
  config.tfds.image_size = 64
  config.tfds.max_train_examples = 60000  # pool read into memory (pre-training and splits)
  config.tfds.max_test_examples = 19962  # test pool, subsampled to balanced groups

  config.loop = common.loop_config(log_every=100, checkpoint_every=1000)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.regression = False  # run E1 as an arm
  config.study.tasks = ()  # classification tasks run per setting
  config.study.settings = ((0.5, 0.05), (0.05, 0.5), (0.05, 0.05), (0.5, 0.5))  # (eta_l, eta_u)
  config.study.overrides = ml_collections.ConfigDict(
    {"digits": _digits_overrides(), "digits_transfer": _digits_transfer_overrides()}
  )  # per task of study.tasks (each may set config.task)

  if variant == "regression":
    config.task = "regression"
  if variant == "digits":
    config.update(_digits_overrides())
  if variant == "digits_transfer":
    config.update(_digits_transfer_overrides())
  if variant == "study":
    config.study.regression = True
    config.study.tasks = ("classification", "digits", "digits_transfer")
  if variant == "digits_study":
    config.study.tasks = ("digits", "digits_transfer")
  if variant == "gpu":
    _gpu(config)
  return config


def _digits_transfer_overrides() -> dict:
  """The first image setup: the image variant's sizes (766 training digits 5-9 to split), its weak
  network, and a backbone pre-trained (supervised) on the other digits 0-4."""
  return {
    "task": "digits",
    "groups": {"num_labelled": 100, "num_unlabelled": 480, "num_heldout": 100},
    "teacher": {"hidden": (8,), "learning_rate": 0.01},  # the weak network: one layer of 8 units
    # heads on the backbone's unnormalised ReLU features need a smaller step than E2's
    "student": {"learning_rate": 0.005},
    "enhanced": {"learning_rate": 0.005},
  }


def _digits_overrides() -> dict:
  """The strong student: the same splits and teacher, but a CNN pre-trained by SimCLR on all 1500
  training digits 0-9 without labels and without stripes (the test digits are never seen)."""
  out = _digits_transfer_overrides()
  out["digits"] = {"pretrain_digits": tuple(range(10))}
  out["pretrain"] = {
    "objective": "contrastive",
    "network": "cnn",
    "steps": 1500,
    "batch_size": 256,
    "standardize_features": True,
  }
  # on z-scored features the heads take E2's step size
  out["student"] = {"learning_rate": 0.05}
  out["enhanced"] = {"learning_rate": 0.05}
  return out


def _gpu(config: ml_collections.ConfigDict) -> None:
  config.task = "tfds"
  config.groups.eta_labelled, config.groups.eta_unlabelled = 0.5, 0.05
  config.groups.num_labelled = 2000
  config.groups.num_unlabelled = 40000
  config.groups.num_heldout = 4000
  config.groups.num_test = 2000
  config.teacher.hidden = (64,)
  config.teacher.learning_rate = 1e-3
  config.teacher.steps = 2000
  config.student.steps = 2000
  config.enhanced.steps = 2000
  config.head_batch_size = 4096
  config.pretrain.hidden = (2048, 2048, 1024)
  # model.dtype stays float32: the backbone's 31.5M weights dwarf its activations at batch 512, so
  # bf16 would add 63 MB of bf16 weight copies to save ~10 MB of activations
  # (experiments/bench_precision.py --cases=w2s_gpu)
  config.pretrain.steps = 20000
  config.pretrain.batch_size = 512
  config.loop = common.loop_config(log_every=200, checkpoint_every=2000)
