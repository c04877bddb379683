r"""QDPM: "Quantization-Aware Diffusion Models for Maximum Likelihood Training" (ICLR 2026,
OpenReview 5ekhMkawuT; method page docs/methods/quant_diffusion.md).

Claim: parameterising the denoiser as softround(x_t, t) + exp(-1/t^2) * delta-hat makes the reverse SDE
end exactly on the data's quantization grid and gives a likelihood bound on the discrete data with no
dequantization and no truncation, below a VDM-style discrete model and a dequantized model.

Variants:
  default   scikit-learn digits (8x8, 17 levels), MLP backbone, ~2 min on 2 CPU cores.
  study     default data; experiments/study.py trains QDPM, the VDM-style discrete baseline and the
            dequantized baseline on the same backbone and compares test bpd and on-grid fractions.
  study_entropy  the same three models on generated images of known entropy (i.i.d. levels, a
            Markov chain between neighbouring pixels): every bound estimate against the entropy.
  cifar10   paper scale: tfds cifar10 (K=256) read from a prepared --config.data.data_dir, 1 GPU/TPU host.
  gpu       alias of cifar10 with the paper's batch size for one 8-GPU node.
  tpu_pod   cifar10 at pod batch size.

  python experiments/train.py --config=configs/quant_diffusion.py
  python experiments/study.py --config=configs/quant_diffusion.py:study --workdir=runs/qdpm_study
  python experiments/study.py --config=configs/quant_diffusion.py:study_entropy \
    --workdir=runs/qdpm_entropy
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "study_entropy", "cifar10", "gpu", "tpu_pod")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "quant_diffusion"
  config.variant = variant
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  # "digits" (shipped with scikit-learn), "iid_levels" / "markov_levels" (generated images of known
  # entropy, core/data/entropy_sources.py) or a tfds image dataset name
  config.data.name = "digits"
  config.data.num_levels = 17  # K; digits are requantized to K levels (2..17)
  config.data.split_seed = 0  # fixed 1500/297 digits split; seed of the known-entropy draws
  config.data.data_dir = ""  # tfds data_dir for prepared datasets (never downloaded)
  config.data.num_eval_examples = 297  # test images (and train subset) used for bpd
  # known-entropy sources only: side of the square images, training draws, the std (in levels) of
  # the i.i.d. level distribution / of the Markov chain's jump kernel, the chain's stay probability
  config.data.image_size = 8
  config.data.num_train = 20000
  config.data.level_std = 2.0
  config.data.markov_stay = 0.5

  config.model = ml_collections.ConfigDict()
  config.model.kind = "qdpm"  # "qdpm" | "vdm" (discrete, categorical decoder) | "dequantized"
  config.model.width = 512
  config.model.depth = 3
  config.model.time_features = 64
  config.model.sigma_data = 5.0  # input scale x_t / sqrt(sigma_data^2 + t^2), output scale
  config.model.t_min = 0.2  # baselines only: truncation of the continuous-time bound
  config.model.t_max = 100.0  # baselines only: prior scale; QDPM integrates t over (0, inf)
  # compute dtype of the backbone: "float32" | "bfloat16" (parameters, Adam state and EMA stay
  # float32; the softround, the bound's integrand and the loss are float32 either way)
  config.model.dtype = "float32"

  config.batch_size = 128
  config.steps = 3000
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 2e-3
  config.optim.warmup_steps = 100
  config.optim.weight_decay = 1e-4
  config.optim.grad_clip = 1.0
  config.optim.ema_decay = 0.999  # evaluation and sampling use the EMA parameters

  config.eval = ml_collections.ConfigDict()
  config.eval.num_u_samples = 128  # Monte-Carlo samples of u (or t) per image for the bound
  config.eval.chunk = 32  # images per jitted evaluation call
  config.eval.num_samples = 64  # images sampled for on-grid fraction and the sample grid
  config.eval.sampler_steps = 64  # QDPM-Solver / ancestral steps
  # u-samples per image of the plain Monte-Carlo estimate of C (the pitfall: infinite variance,
  # typically low, erratic between evaluations)
  config.eval.mc_c_samples = 1024
  # known-entropy sources only: draws of ln t per image for the bound sampled in log t (trained
  # model and closed-form denoiser), and independent repeats of the plain Monte-Carlo C
  config.eval.log_t_samples = 128
  config.eval.mc_c_repeats = 1

  config.loop = common.loop_config(log_every=100, checkpoint_every=500)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.vdm_t_mins = ()  # extra VDM-style arms at these truncation times (sensitivity)
  # known-entropy sources for the study_entropy variant: every model kind on each of them
  config.study.sources = ()

  if variant == "study":
    config.steps = 4000
    config.eval.num_u_samples = 256
    config.study.vdm_t_mins = (0.1, 0.5)

  if variant == "study_entropy":
    config.study.sources = ("iid_levels", "markov_levels")
    config.data.num_eval_examples = 1000
    config.eval.mc_c_repeats = 16

  if variant in ("cifar10", "gpu", "tpu_pod"):
    config.data.name = "cifar10"
    config.data.num_levels = 256
    config.data.num_eval_examples = 10000
    config.model.width = 2048
    config.model.depth = 4
    config.model.sigma_data = 64.0
    config.model.t_max = 2000.0
    # bf16 mixed precision on the accelerators, as diffusion models are trained at this scale
    # (guided-diffusion's --use_fp16, bf16 in JAX codebases): the width-2048 MLP's matmuls run on the
    # bf16 matrix units; its output, the bound and the loss stay float32. Memory is not the gain:
    # the bf16 copies of the 29.5M weights offset the halved activations below a batch of ~1000 per
    # device (experiments/bench_precision.py: f32 / bf16 bytes kept for the backward pass 0.38 /
    # 0.89 / 1.36 at batch 128 / 512 / 2048 on one device)
    config.model.dtype = "bfloat16"
    config.batch_size = {"cifar10": 128, "gpu": 512, "tpu_pod": 2048}[variant]
    config.steps = 2_000_000 // (config.batch_size // 128)
    config.optim.learning_rate = 2e-4
    config.eval.num_u_samples = 1024
    config.eval.chunk = 256
    config.loop = common.loop_config(log_every=1000, checkpoint_every=10000, max_to_keep=3)
    config.sharding = "fsdp" if variant == "tpu_pod" else "replicate"
  return config
