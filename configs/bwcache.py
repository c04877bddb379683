r"""BWCache: "Accelerating Video Diffusion Transformers through Block-Wise Caching" (ICLR 2026).

Claim: reusing all DiT block outputs while their mean relative L1 change stays below delta (for R steps,
with periodic recomputation and a protected tail) speeds up video diffusion sampling at high fidelity to
the uncached output, far above taking fewer steps at the same compute.

Variants:
  default   trains a 6-block video DiT (8 frames of 16x16, ~0.3M parameters) with rectified flow on
            moving-shape videos for a few CPU minutes, then runs the cache arms (30 Euler steps).
  study     the same model; the cache phase sweeps delta x R and writes the table and figures.
  gpu       a larger DiT restored from --config.model.checkpoint (an orbax checkpoint of this DiT's
            parameters; with a checkpoint the train phase runs 0 steps), 32 videos of 16 frames at
            64x64, 50 sampling steps. Not run here.

  python experiments/train.py --config=configs/bwcache.py
  python experiments/study.py --config=configs/bwcache.py:study --workdir=runs/bwcache_study
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")


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
  config.model.checkpoint = ""  # orbax checkpoint of the DiT parameters to start from

  config.batch_size = 16
  config.steps = 1500
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 100
  config.optim.grad_clip = 1.0
  config.optim.ema_decay = 0.999

  config.cache = ml_collections.ConfigDict()
  config.cache.num_steps = 30  # Euler steps of every sampler (Open-Sora's default)
  config.cache.time_shift = 1.0  # rectified-flow time-grid shift (1 = uniform)
  config.cache.num_videos = 16  # fixed-noise videos sampled by every arm
  # Headline threshold. The paper's default is 0.15 on large video DiTs; this small DiT's mean block
  # change is 0.03-0.09 per step, so 0.15 would reuse at every chance. The study sweeps both ranges.
  config.cache.delta = 0.05
  config.cache.reuse = 3  # headline R (10% of 30 steps)
  config.cache.protect_tail = True
  config.cache.reevaluate = True
  config.cache.indicator_blocks = ()  # () = all blocks
  config.cache.reuse_mode = "output"  # "output" (paper) | "residual" (TeaCache-like)
  config.cache.teacache_threshold = 0.3  # accumulated relative change of block 0's modulated input
  config.cache.deltas = (0.05,)  # grid of delta x R reported besides the headline arm
  config.cache.reuse_steps = (3,)
  config.cache.timing_repeats = 5  # rounds of back-to-back (reference, arm) timings

  config.loop = common.loop_config(log_every=100, checkpoint_every=500)
  common.add_parallelism(config)

  if variant == "study":
    config.cache.deltas = (0.02, 0.03, 0.04, 0.05, 0.07, 0.1, 0.15)
    config.cache.reuse_steps = (1, 3, 6)
  if variant == "gpu":
    config.data.frames, config.data.size, config.data.channels = 16, 64, 3
    config.model.update(hidden=384, depth=12, heads=6, patch=(1, 4, 4), attention="alternating")
    config.model.checkpoint = "/path/to/dit_params"  # required: the train phase then runs 0 steps
    config.batch_size = 32
    config.cache.update(num_steps=50, num_videos=32, reuse=5)
  return config
