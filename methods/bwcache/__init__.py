"""BWCache: "Accelerating Video Diffusion Transformers through Block-Wise Caching" (ICLR 2026).

Claim: the per-block relative L1 change of a video DiT's block outputs between sampling steps is small
in the middle of the trajectory; caching all block outputs when their mean change falls below delta and
reusing them for R steps (with periodic recomputation and a protected tail; Sec. 3, Eqs. 6-8) speeds
sampling up with little loss of fidelity -- far less than taking fewer steps at the same compute.

Phases (`phases.py`):
  train  training of a small video DiT (`core/nn/dit.py`) on moving-shape videos
         (`core/data/videos.py`): rectified flow (velocity target, the objective of most of the video
         DiTs the paper accelerates) or DDPM with eps prediction (`config.diffusion.kind = "ddpm"`,
         the Latte setting). With `config.model.checkpoint` the phase restores the DiT instead and
         trains 0 steps: an orbax checkpoint of this DiT's parameters, or a Latte state dict in a
         `.safetensors` file (`config.model.checkpoint_format = "latte"`, converted by
         `core/nn/dit_convert.py`).
  cache  training-free (0 steps): samples fixed noise with the uncached sampler (the reference)
         and with every caching arm of `core/block_cache.py` -- BWCache over `config.cache.deltas` x
         `config.cache.reuse_steps` x `config.cache.warmups`, uniform step reduction at BWCache's
         number of computed steps and at every `config.cache.frontier_steps`, fixed-interval reuse, a
         TeaCache-style indicator, the rule's open readings (`config.cache.compare_readings`), each
         over `config.cache.seeds` noise batches -- and reports fidelity against the reference
         (PSNR/SSIM/MSE), reuse rate, block evaluations, FLOP ratio from XLA's cost analysis, measured
         wall-clock speedup of the jitted samplers, indicator overhead, the ARL1(t) curve and the
         step x block heat-map. The sampler is Euler for rectified flow and deterministic DDIM for
         DDPM (`config.cache.sampler`); the caching code is the same for both.

The headline arm (`config.cache.delta`, `config.cache.reuse`) gives `results.json`'s `speedup_wall`,
`speedup_flops`, `psnr_vs_uncached` and `reuse_rate`. Training is step-budgeted (not wall-time) so that
a resumed run ends where an uninterrupted one does; the default step count fits a few CPU minutes.
The study (`study.py`) is one run whose cache phase sweeps delta x R x warm-up, uniform step reduction
at every step count of `config.cache.frontier_steps` and the open readings of the rule, each over
`config.cache.seeds` noise batches; its report compares the two frontiers (PSNR / SSIM against computed
steps and against measured wall time) per region of computed steps.
"""

from __future__ import annotations

import ml_collections

from core import block_cache, diffusion
from core.nn import precision
from methods.base import Method, require, require_choice, require_file, require_positive_int
from methods.bwcache.phases import (
  DATA_RANGE,
  blockwise,
  cache_evaluation,
  dit,
  init_train_state,
  load_pretrained,
  phases,
  sampler,
  validation_key,
  video_shape,
)
from methods.bwcache.study import report, study_arms

__all__ = [
  "DATA_RANGE",
  "METHOD",
  "blockwise",
  "cache_evaluation",
  "dit",
  "init_train_state",
  "load_pretrained",
  "phases",
  "report",
  "sampler",
  "study_arms",
  "validate",
  "validation_key",
  "video_shape",
]


def validate(config: ml_collections.ConfigDict) -> None:
  for field in (
    "data.frames",
    "data.size",
    "data.channels",
    "model.hidden",
    "model.depth",
    "model.heads",
  ):
    require_positive_int(config, field)
  require_choice(config, "model.attention", ("full", "alternating"))
  require_choice(config, "model.dtype", precision.DTYPE_NAMES)
  require_choice(config, "cache.reuse_mode", ("output", "residual"))
  f, s = config.data.frames, config.data.size
  pt, ph, pw = config.model.patch
  require(
    f % pt == 0 and s % ph == 0 and s % pw == 0,
    "model.patch",
    f"{tuple(config.model.patch)} must divide (F, H, W) = ({f}, {s}, {s})",
  )
  require(config.model.hidden % config.model.heads == 0, "model.heads", "must divide model.hidden")
  require(s >= 7, "data.size", "frames must be at least 7x7 (SSIM window)")
  for field in ("cache.num_steps", "cache.num_videos", "cache.timing_repeats"):
    require_positive_int(config, field)
  require(
    isinstance(config.cache.reuse, int) and config.cache.reuse >= 0,
    "cache.reuse",
    "must be an int >= 0",
  )
  require(
    all(0 <= b < config.model.depth for b in config.cache.indicator_blocks),
    "cache.indicator_blocks",
    f"must index the {config.model.depth} blocks",
  )
  require(config.cache.delta >= 0, "cache.delta", "must be >= 0")
  _validate_readings(config)
  _validate_diffusion(config)
  _validate_checkpoint(config)


def _validate_readings(config) -> None:
  """The rule's open readings (`core/block_cache.py`), the seeds and the frontier's step counts."""
  c = config.cache
  require_choice(config, "cache.tail_of", block_cache.TAIL_READINGS)
  require_choice(config, "cache.indicator_reference", block_cache.INDICATOR_REFERENCES)
  require(0.0 <= c.tail_fraction <= 1.0, "cache.tail_fraction", "must lie in [0, 1]")
  for field in ("warmup", "reading_reuse"):
    value = c[field]
    require(isinstance(value, int) and value >= 0, f"cache.{field}", "must be an int >= 0")
  require(
    all(isinstance(w, int) and w >= 0 for w in c.warmups),
    "cache.warmups",
    "must be ints >= 0",
  )
  require_positive_int(config, "cache.seeds")
  require(
    all(isinstance(n, int) and 1 <= n <= c.num_steps for n in c.frontier_steps),
    "cache.frontier_steps",
    f"must be step counts in [1, cache.num_steps = {c.num_steps}]",
  )
  require(c.reading_delta >= 0, "cache.reading_delta", "must be >= 0")


def _validate_diffusion(config) -> None:
  """The training target and the sampler must agree: Euler for rectified flow, DDIM for DDPM."""
  require_choice(config, "diffusion.kind", ("rectified_flow", "ddpm"))
  require_choice(config, "cache.sampler", ("euler", "ddim"))
  require_choice(config, "cache.ddim_spacing", diffusion.DDIM_SPACINGS)
  if config.diffusion.kind == "rectified_flow":
    require(
      config.cache.sampler == "euler",
      "cache.sampler",
      "'ddim' needs diffusion.kind='ddpm'; for rectified flow deterministic DDIM is the Euler step",
    )
    return
  require(
    config.cache.sampler == "ddim", "cache.sampler", "'euler' needs rectified flow; use 'ddim'"
  )
  require_positive_int(config, "diffusion.train_steps")
  require(
    config.cache.num_steps <= config.diffusion.train_steps,
    "cache.num_steps",
    f"DDIM takes at most diffusion.train_steps = {config.diffusion.train_steps} steps",
  )
  d = config.diffusion
  require(
    0 < d.beta_start < d.beta_end < 1, "diffusion.beta_end", "need 0 < beta_start < beta_end < 1"
  )


def _validate_checkpoint(config) -> None:
  """Model options a Latte checkpoint needs, and the class label used for sampling."""
  m = config.model
  require_choice(config, "model.positions", ("sincos3d", "latte"))
  require_choice(config, "model.checkpoint_format", ("orbax", "latte"))
  require(isinstance(m.learn_sigma, bool), "model.learn_sigma", "must be a bool")
  require(
    isinstance(m.time_frequencies, int) and m.time_frequencies >= 0 and m.time_frequencies % 2 == 0,
    "model.time_frequencies",
    "must be an even int >= 0 (0 = model.hidden)",
  )
  if m.positions == "latte":
    require(
      m.attention == "alternating", "model.attention", "positions='latte' needs 'alternating'"
    )
    require(m.hidden % 4 == 0, "model.hidden", "positions='latte' needs a multiple of 4")
  if m.checkpoint_format == "latte":
    require_file(
      config,
      "model.checkpoint",
      "a Latte state dict saved as .safetensors",
      "convert Latte's released .pt once with torch (methods/bwcache/phases.py: load_pretrained)",
    )
    require(m.positions == "latte", "model.positions", "a Latte checkpoint needs 'latte'")
    require(m.patch[0] == 1, "model.patch", "Latte patchifies each frame: patch[0] must be 1")
  require(
    isinstance(m.num_classes, int) and m.num_classes >= 0,
    "model.num_classes",
    "must be an int >= 0",
  )
  require(
    -1 <= config.cache.class_label < m.num_classes,
    "cache.class_label",
    f"must be -1 (unconditional) or a class in [0, {m.num_classes})",
  )


METHOD = Method(
  name="bwcache", phases=phases, validate=validate, study_arms=study_arms, report=report
)
