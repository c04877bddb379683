r"""BWCache: "Accelerating Video Diffusion Transformers through Block-Wise Caching" (ICLR 2026).

Claim: reusing all DiT block outputs while their mean relative L1 change stays below delta (for R steps,
with periodic recomputation and a protected tail) speeds up video diffusion sampling at high fidelity to
the uncached output, far above taking fewer steps at the same compute.

Variants:
  default   trains a 6-block video DiT (8 frames of 16x16, ~0.3M parameters) with rectified flow on
            moving-shape videos for a few CPU minutes, then runs the cache arms (30 Euler steps).
  study     the same model; the cache phase sweeps delta x R x warm-up W (0, 6), uniform step
            reduction at every step count from 12 to 29 and the open readings of the rule at delta
            0.25, R 3, each over 4 noise batches of 16 videos, and writes the frontier table and
            figures (PSNR / SSIM against computed steps and against measured wall time).
  study_ddim  the study on the same DiT trained as a DDPM (eps prediction, linear betas) and sampled
            with deterministic DDIM over 30 steps: the Latte setting at CPU scale.
  gpu       Latte-XL/2 (Latte's alternating spatial/temporal DiT: hidden 1152, 28 blocks, 16 heads,
            patch 2, learned sigma) restored from --config.model.checkpoint, a Latte state dict saved
            as .safetensors (see methods/bwcache/phases.py:load_pretrained; the train phase then runs 0
            steps), sampling 16-frame 32x32x4 VAE latents with DDPM/DDIM over 50 steps, as Latte does.
            Fidelity is measured on the latents (no VAE decoding). Not run here.
            For the class-conditional UCF-101 model add --config.model.num_classes=101.

  python experiments/train.py --config=configs/bwcache.py
  python experiments/study.py --config=configs/bwcache.py:study --workdir=runs/bwcache_study
  python experiments/study.py --config=configs/bwcache.py:study_ddim --workdir=runs/bwcache_ddim
  python experiments/train.py --config=configs/bwcache.py:gpu \
    --config.model.checkpoint=/data/latte_ffs.safetensors --workdir=runs/bwcache_latte
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "study_ddim", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "bwcache"
  config.variant = variant
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.frames = 8
  config.data.size = 16
  config.data.channels = 1
  config.data.max_shapes = 2

  config.model = ml_collections.ConfigDict()
  config.model.patch = (1, 4, 4)  # (frames, height, width) per token
  config.model.hidden = 64
  config.model.depth = 6
  config.model.heads = 4
  config.model.mlp_ratio = 4
  config.model.attention = "full"  # "full" spatio-temporal | "alternating" spatial/temporal blocks
  config.model.positions = "sincos3d"  # "sincos3d" | "latte" (2D per frame + 1D over frames)
  config.model.learn_sigma = False  # also predict the variance half (dropped when sampling)
  config.model.num_classes = 0  # > 0: class-conditional (label table of num_classes + 1 rows)
  config.model.time_frequencies = 0  # sinusoid width of the timestep embedding; 0 = hidden
  config.model.checkpoint = ""  # DiT parameters to start from (then 0 training steps)
  config.model.checkpoint_format = "orbax"  # "orbax" (this DiT's params) | "latte" (.safetensors)
  # compute dtype of the DiT: "float32" | "bfloat16" (parameters, Adam state and EMA stay float32;
  # the time/position tables, LayerNorm statistics, attention softmax and the sampler's state are
  # float32 either way)
  config.model.dtype = "float32"

  config.diffusion = ml_collections.ConfigDict()
  config.diffusion.kind = "rectified_flow"  # "rectified_flow" (velocity) | "ddpm" (eps prediction)
  config.diffusion.train_steps = 1000  # DDPM: discrete steps; the network's time input is the step
  config.diffusion.beta_start = 1e-4  # DDPM: linear betas (DiT, Latte, Open-Sora 1.0)
  config.diffusion.beta_end = 2e-2

  config.batch_size = 16
  config.steps = 1500
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 100
  config.optim.grad_clip = 1.0
  config.optim.ema_decay = 0.999

  config.cache = ml_collections.ConfigDict()
  config.cache.num_steps = 30  # sampling steps of every sampler (Open-Sora's default)
  config.cache.sampler = "euler"  # "euler" (rectified flow) | "ddim" (ddpm, deterministic, eta = 0)
  config.cache.time_shift = 1.0  # rectified-flow time-grid shift (1 = uniform)
  config.cache.ddim_spacing = "linspace"  # "linspace" (Latte, DiT) | "leading" | "trailing"
  config.cache.clip_denoised = (
    True  # DDIM: clip x0_hat to the pixel range [-1, 1] (not for latents)
  )
  config.cache.class_label = -1  # label sampled with num_classes > 0; -1 = unconditional
  config.cache.num_videos = 16  # fixed-noise videos sampled by every arm
  # Headline threshold. The paper's default is 0.15 on large video DiTs; this small DiT's mean block
  # change is 0.03-0.09 per step, so 0.15 would reuse at every chance. The study sweeps both ranges.
  config.cache.delta = 0.05
  config.cache.reuse = 3  # headline R (10% of 30 steps)
  config.cache.protect_tail = True
  # Readings the paper leaves open (core/block_cache.py); the defaults are the paper's text as written.
  config.cache.tail_of = "remaining"  # "remaining" (after the 1st trigger) | "all" | "each_trigger"
  config.cache.tail_fraction = 0.5  # share of those steps always computed ("the second half")
  config.cache.warmup = 0  # W: no reuse before step W
  config.cache.indicator_reference = "last_computed"  # or "adjacent" (Eq. 6 literally)
  config.cache.reevaluate = True
  config.cache.indicator_blocks = ()  # () = all blocks
  config.cache.reuse_mode = "output"  # "output" (paper) | "residual" (TeaCache-like)
  config.cache.teacache_threshold = 0.3  # accumulated relative change of block 0's modulated input
  config.cache.deltas = (0.05,)  # grid of delta x R reported besides the headline arm
  config.cache.reuse_steps = (3,)
  config.cache.warmups = (0,)  # the grid's warm-ups W (the headline uses cache.warmup)
  config.cache.frontier_steps = ()  # uniform step reduction at these step counts (the frontier)
  config.cache.seeds = 1  # noise batches of num_videos each; intervals are over them
  config.cache.compare_readings = False  # run every reading of the rule (phases.READINGS) ...
  config.cache.reading_delta = 0.25  # ... at the paper's most aggressive ablation threshold
  config.cache.reading_reuse = 3  # ... and R = 10% of the steps, where the paper reports 59% reuse
  config.cache.timing_repeats = 5  # rounds of back-to-back (reference, arm) timings

  config.loop = common.loop_config(log_every=100, checkpoint_every=500)
  common.add_parallelism(config)

  if variant == "study_ddim":
    config.diffusion.kind = "ddpm"
    config.cache.sampler = "ddim"
  if variant in ("study", "study_ddim"):
    config.cache.deltas = (0.02, 0.03, 0.04, 0.05, 0.07, 0.1, 0.15)
    config.cache.reuse_steps = (1, 3, 6)
  if variant == "study":
    # the frontiers: uniform step reduction at every step count from 12 to 29 against BWCache with
    # and without a warm-up, over 4 noise batches; wall time from 3 back-to-back rounds per arm
    config.cache.frontier_steps = tuple(range(12, config.cache.num_steps))
    config.cache.warmups = (0, 6)
    config.cache.seeds = 4
    config.cache.compare_readings = True
    config.cache.timing_repeats = 3
  if variant == "gpu":
    # latents of 16 frames of 256x256 video (VAE factor 8); data.* only shapes the inputs here
    config.data.frames, config.data.size, config.data.channels = 16, 32, 4
    config.model.update(
      hidden=1152,
      depth=28,
      heads=16,
      mlp_ratio=4,
      patch=(1, 2, 2),
      attention="alternating",
      positions="latte",
      learn_sigma=True,
      time_frequencies=256,
      checkpoint_format="latte",
      # half-precision sampling, as Latte's sample/sample.py does with use_fp16 (Open-Sora-Plan
      # samples Latte with --mixed-precision bf16): dense layers and attention products in bf16; the
      # residual stream (so the cached block outputs), softmax, LayerNorm statistics and the
      # sampler's state stay float32 (core/nn/dit.py); 1.7x fewer activation bytes per step
      # (experiments/bench_precision.py --cases=latte_gpu)
      dtype="bfloat16",
    )
    config.model.checkpoint = ""  # required: a Latte state dict as .safetensors
    config.diffusion.kind = "ddpm"
    config.batch_size = 32
    # 28 blocks x 8 videos x 4096 tokens x 1152 floats of previous block outputs: about 4 GiB
    config.cache.update(
      sampler="ddim",
      num_steps=50,
      num_videos=8,
      reuse=5,
      clip_denoised=False,  # latents
    )
  return config
