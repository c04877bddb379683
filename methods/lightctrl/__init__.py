"""LightCtrl: "LightCtrl: Training-free Controllable Video Relighting" (ICLR 2026; official code
GVCLab/LightCtrl).

Claim: an image relighter steered by per-frame light maps, fused into the denoising loop of a video
diffusion prior (progressive light fusion with x0 replacement in the Euler-ancestral step), relights a
video along a light trajectory; Light Map Injection makes the light follow the path and
Geometry-Aware Relighting (low frequencies of the relighter's condition from the normal video)
suppresses the source light.

Phases (`phases.py`): `autoencoder`, `relighter` and `video_prior` train the three small networks on
rendered Lambertian scenes (`core/data/lambertian.py`); `relight` (0 steps, `pipeline.py`) runs the
training-free pipeline of `core/relighting.py` and its baselines on clips along the paper's six
trajectories and measures them against the target renders (`core/relight_metrics.py`). The `paper`
variant runs only `relight`, on SD-1.5 + IC-Light fc + AnimateDiff v1-5-3 (`paper.py`).
`results.json`: `psnr`, `ssim`, `light_following`, `psnr_light`, `source_leakage`, `flicker`,
`prompt_error` of the headline arm, and `<arm>/<metric>` for every arm. The study (`study.py`) is one
run whose relight phase evaluates every arm; its report tabulates them.
"""

from __future__ import annotations

import ml_collections

from core import relighting
from core.data import lambertian
from methods.base import (
  Method,
  require,
  require_choice,
  require_positive_int,
)
from methods.lightctrl import paper, pipeline
from methods.lightctrl.models import (
  alpha_bars,
  autoencoder,
  decode,
  encode,
  evaluation_clips,
  latent_size,
  relighter,
  video_prior,
)
from methods.lightctrl.phases import phases
from methods.lightctrl.study import report, study_arms

__all__ = [
  "METHOD",
  "alpha_bars",
  "autoencoder",
  "decode",
  "encode",
  "evaluation_clips",
  "latent_size",
  "paper",
  "phases",
  "pipeline",
  "relighter",
  "report",
  "study_arms",
  "validate",
  "video_prior",
]


def validate(config: ml_collections.ConfigDict) -> None:
  _validate_data(config)
  _validate_training(config)
  _validate_pipeline(config)
  _validate_evaluation(config)
  if config.variant == "paper":
    paper.validate(config)


def _validate_data(config) -> None:
  for field in ("data.frames", "data.size", "data.max_objects"):
    require_positive_int(config, field)
  d = config.data
  require(d.frames >= 2, "data.frames", "needs at least 2 frames (flicker, trajectories)")
  factor = 2 ** len(config.autoencoder.widths)
  require(
    d.size % (2 * factor) == 0,
    "data.size",
    f"must be a multiple of 2 x the autoencoder's factor {factor} (the relighter halves the latent)",
  )
  require(d.size // factor >= 2, "data.size", "the latent must be at least 2x2")
  require(d.size >= 7, "data.size", "frames must be at least 7x7 (SSIM window)")
  require(d.light_radius > 0, "data.light_radius", "must be > 0")
  require(d.light_height > 0, "data.light_height", "must be > 0")
  require(d.normal_noise >= 0, "data.normal_noise", "must be >= 0")


def _validate_training(config) -> None:
  for section in ("autoencoder", "relighter", "video_prior"):
    for field in ("batch_size", "warmup_steps"):
      require_positive_int(config, f"{section}.{field}")
    steps = config[section].steps
    require(
      isinstance(steps, int) and steps >= 0, f"{section}.steps", f"must be an int >= 0, got {steps}"
    )
    require(config[section].learning_rate > 0, f"{section}.learning_rate", "must be > 0")
    require(0 <= config[section].ema_decay < 1, f"{section}.ema_decay", "must be in [0, 1)")
  require_positive_int(config, "autoencoder.latent_channels")
  require(len(config.autoencoder.widths) >= 1, "autoencoder.widths", "needs at least one level")
  require(
    config.autoencoder.batch_size >= 8,
    "autoencoder.batch_size",
    "needs >= 8 (one clip gives 8 images)",
  )
  require_positive_int(config, "relighter.width")
  require_choice(config, "relighter.light_condition", ("init", "fbc"))
  v = config.video_prior
  for field in ("hidden", "depth", "heads", "mlp_ratio"):
    require_positive_int(config, f"video_prior.{field}")
  require_choice(config, "video_prior.attention", ("full", "alternating"))
  s = latent_size(config)
  pt, ph, pw = v.patch
  require(
    config.data.frames % pt == 0 and s % ph == 0 and s % pw == 0,
    "video_prior.patch",
    f"{tuple(v.patch)} must divide the latent video (F, h, w) = ({config.data.frames}, {s}, {s})",
  )
  require(v.hidden % v.heads == 0, "video_prior.heads", "must divide video_prior.hidden")
  require(0 <= config.relighter.gar_rate <= 1, "relighter.gar_rate", "must be in [0, 1]")
  for section in ("relighter", "video_prior"):
    rate = config[section].prompt_dropout
    require(0 <= rate < 1, f"{section}.prompt_dropout", "must be in [0, 1)")
  d = config.diffusion
  require_choice(config, "diffusion.video_beta_schedule", tuple(relighting.BETA_SCHEDULES))
  require_positive_int(config, "diffusion.train_steps")
  require(
    0 < d.beta_start < d.beta_end < 1, "diffusion.beta_end", "need 0 < beta_start < beta_end < 1"
  )


def _validate_pipeline(config) -> None:
  p = config.pipeline
  require_positive_int(config, "pipeline.num_steps")
  require_positive_int(config, "pipeline.relight_steps")
  for field in ("strength", "relight_strength"):
    require(0 < p[field] <= 1, f"pipeline.{field}", f"must be in (0, 1], got {p[field]}")
  for field in ("omega", "mask_threshold"):
    require(0 <= p[field] <= 1, f"pipeline.{field}", f"must be in [0, 1], got {p[field]}")
  require(p.guidance >= 0 and p.relight_guidance >= 0, "pipeline.guidance", "must be >= 0")
  require(0 <= p.fuse_above, "pipeline.fuse_above", "must be >= 0")
  require_choice(config, "pipeline.lmi_noise_scale", ("unit", "sigma"))
  require_choice(config, "pipeline.gar_axes", tuple(relighting.GAR_AXES))
  require_choice(config, "pipeline.gar_filter", relighting.FILTERS)
  require_positive_int(config, "pipeline.gar_order")
  require(isinstance(p.detail, bool), "pipeline.detail", "must be a bool")
  require(
    isinstance(p.clips_per_call, int) and p.clips_per_call >= 0,
    "pipeline.clips_per_call",
    f"must be an int >= 0 (0: every clip at once), got {p.clips_per_call}",
  )


def _validate_evaluation(config) -> None:
  e = config.evaluation
  require_positive_int(config, "evaluation.num_clips")
  require(
    e.num_clips >= lambertian.MIN_PAPER_CLIPS,
    "evaluation.num_clips",
    f"{e.num_clips} clips cannot cover the {len(lambertian.TRAJECTORIES)} trajectories and "
    f"{len(lambertian.PROMPTS)} prompts; needs >= {lambertian.MIN_PAPER_CLIPS}",
  )
  require(len(e.arms) > 0, "evaluation.arms", "needs at least one arm")
  for arm in e.arms:
    require(
      pipeline.known_arm(arm),
      "evaluation.arms",
      f"unknown arm {arm!r}; known: source, per_frame, per_frame_sdedit_<strength>, "
      f"{', '.join(pipeline.FUSION_ARMS)}, oracle",
    )
  seeds = tuple(config.study.seeds)
  require(
    len(seeds) >= 1 and len(set(seeds)) == len(seeds) and all(isinstance(s, int) for s in seeds),
    "study.seeds",
    f"needs distinct int seeds, got {seeds}",
  )
  require(e.headline in e.arms, "evaluation.headline", f"{e.headline!r} is not in evaluation.arms")
  require(
    0 <= e.figure_clip < e.num_clips, "evaluation.figure_clip", "must index an evaluation clip"
  )


METHOD = Method(
  name="lightctrl", phases=phases, validate=validate, study_arms=study_arms, report=report
)
