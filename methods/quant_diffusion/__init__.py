"""QDPM: "Quantization-Aware Diffusion Models for Maximum Likelihood Training" (ICLR 2026, OpenReview
5ekhMkawuT).

Claim: with the denoiser `x_hat = softround(x_t, t) + u * delta_hat`, `u = exp(-1/t^2)`, the reverse
VE SDE ends on the data's quantization grid (Prop. 2), and the bound
`-log p(x_0) <= E_u[(1/2u) ||u delta_hat - delta_t||^2]` on the *discrete* pmf needs no truncation and
no dequantization; QDPM's test bpd is below a VDM-style discrete model's, which is below a model of
uniformly dequantized data.

One phase, `train`, for each of three models on the same backbone (`config.model.kind`):
  qdpm         the paper's parameterisation; trained on the C-free loss, evaluated with the full bound
               (analytic C = log2 K per dimension, derived here); sampled with QDPM-Solver-1 (and -2).
  vdm          plain x-prediction, bound truncated to [t_min, t_max] with a categorical decoder.
  dequantized  the same continuous model on x_0 + U[0, 1), a Gaussian decoder (dequantized bpd).
The maths lives in `core/quant_diffusion.py`; this module wires it to data, the optimiser and the loop.

Choices where the paper is open: an MLP backbone on flattened images (the paper's VDM U-Net is a config
away for image-sized data); EDM-style preconditioning for the baselines' x-prediction
(`c + c_skip (x_t - c) + c_out F`) so that their network sees the same input scale as QDPM's; the
QDPM network gets `u` as its time feature and the baselines a normalised log t; EMA parameters for
evaluation and sampling.
"""

from __future__ import annotations

import ml_collections

from core.nn import precision
from methods.base import (
  Method,
  require,
  require_choice,
  require_positive_int,
  require_prepared_tfds,
)
from methods.quant_diffusion.phases import (
  KINDS,
  SOURCES,
  init_state,
  load_splits,
  per_example_nats,
  phases,
  train_batches,
  train_step,
)
from methods.quant_diffusion.study import (
  ENTROPY_ESTIMATES,
  entropy_report,
  report,
  study_arms,
)


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "model.kind", KINDS)
  require_choice(config, "model.dtype", precision.DTYPE_NAMES)
  levels = config.data.num_levels
  if config.data.name in SOURCES:
    _validate_known_entropy(config)
  elif config.data.name == "digits":
    require(
      isinstance(levels, int) and 2 <= levels <= 17,
      "data.num_levels",
      f"digits need 2..17, got {levels}",
    )
  else:
    require(
      isinstance(levels, int) and 2 <= levels <= 256,
      "data.num_levels",
      f"must be in 2..256, got {levels}",
    )
    require_prepared_tfds(config, "data.data_dir", config.data.name)
  for field in (
    "model.width",
    "model.depth",
    "eval.num_u_samples",
    "eval.chunk",
    "eval.num_samples",
    "eval.sampler_steps",
  ):
    require_positive_int(config, field)
  require(config.model.time_features % 2 == 0, "model.time_features", "must be even")
  require(
    0 < config.model.t_min < config.model.t_max,
    "model.t_min",
    "need 0 < t_min < t_max",
  )
  require(config.model.sigma_data > 0, "model.sigma_data", "must be positive")
  require(0.0 <= config.optim.ema_decay < 1.0, "optim.ema_decay", "must be in [0, 1)")
  for name in config.study.sources:
    require(name in SOURCES, "study.sources", f"{name!r} is not one of {SOURCES}")


def _validate_known_entropy(config: ml_collections.ConfigDict) -> None:
  data, levels = config.data, config.data.num_levels
  require(
    isinstance(levels, int) and 2 <= levels <= 256,
    "data.num_levels",
    f"need 2..256, got {levels}",
  )
  for field in (
    "data.image_size",
    "data.num_train",
    "data.num_eval_examples",
    "eval.log_t_samples",
  ):
    require_positive_int(config, field)
  require(
    config.eval.log_t_samples >= 2,
    "eval.log_t_samples",
    "need >= 2 for a standard error",
  )
  require(config.eval.mc_c_repeats >= 1, "eval.mc_c_repeats", "must be >= 1")
  require(data.level_std > 0, "data.level_std", f"must be positive, got {data.level_std}")
  require(
    0.0 <= data.markov_stay < 1.0,
    "data.markov_stay",
    f"need [0, 1), got {data.markov_stay}",
  )


__all__ = [
  "ENTROPY_ESTIMATES",
  "KINDS",
  "METHOD",
  "SOURCES",
  "entropy_report",
  "init_state",
  "load_splits",
  "per_example_nats",
  "phases",
  "report",
  "study_arms",
  "train_batches",
  "train_step",
  "validate",
]

METHOD = Method(
  name="quant_diffusion",
  phases=phases,
  validate=validate,
  study_arms=study_arms,
  report=report,
)
