"""Flow2GAN: "Flow2GAN: Hybrid Flow Matching and GAN with Multi-Resolution Network for Few-step Audio
Generation" (Yao et al., ICLR 2026; official code k2-fsa/Flow2GAN).

Claim: for mel-conditioned waveform generation, flow matching that predicts the endpoint (the clean
waveform) and scales its loss by the target's spectral energy (Sec. 3.1) trains a multi-branch
Fourier-coefficient generator (Sec. 3.2) that is good at few Euler steps; GAN fine-tuning of its
unrolled 1- or 2-step sampler (Sec. 3.3) then reaches the quality of many-step flow matching at a
fraction of the cost.

Map to the code:
  `core/diffusion.py`            the one flow-matching implementation: `rf_regression_loss` (endpoint
                                 or velocity target, uniform time, noise scale 0.1), `rf_data_sampler`
                                 (the endpoint Euler sampler `v = (x - x1_hat) / t`), `euler_sampler`.
  `core/audio.py`                STFT/ISTFT (torch conventions), mel and linear filterbanks, log-mel,
                                 the energy-scaled spectral loss, multi-scale mel L1, multi-resolution
                                 STFT distance, silence leakage, quiet-bin LSD.
  `core/nn/audio_convnext.py`    BiasNorm, ChannelScale, ConvNeXt blocks, the mel encoder, the
                                 branches and their mean with branch dropout.
  `core/nn/audio_convnext_convert.py`  the official PyTorch generator weights (an `.npz` of the state
                                 dict) as its parameters (`model.pretrained_checkpoint`).
  `core/data/wav.py`             16-bit PCM WAV files of the examples.
  `core/nn/audio_discriminators.py`  MPD and MRD.
  `core/gan.py`                  hinge and feature-matching losses.
  `core/data/speech_like.py`     procedural speech-like audio; LibriTTS crops through tfds.
  `core/nn/codec.py`             the token codec in EnCodec's layout: SEANet encoder / decoder, residual
                                 vector quantizer (k-means init, moving-average codebooks).
  `core/nn/encodec_convert.py`   EnCodec 24 kHz's encoder and codebooks as the codec
                                 (`model.codec_checkpoint`).
  `tokens.py`                    `model.condition = "tokens"`: the token condition, the `codec` phase.
  `phases.py`                    [`codec` ->] `flow` -> `gan_<N>step` (per `gan.generator_steps`) ->
                                 `benchmark`;
                                 the GAN phases start from the flow phase's averaged parameters,
                                 handed over by the loop (orbax checkpoints of each phase).
  `study.py`                     the study's arms, table and figure.
  `experiments/flow2gan_examples.py`  WAV examples and PESQ of a run finished before the benchmark
                                 wrote them, from its checkpoints (new runs write them as the
                                 benchmark's `examples` artifact).

Time runs from 1 (noise) to 0 (data) as everywhere in `core/diffusion.py`; the network is given the
reference's time `1 - t`. With a velocity target the network learns `eps - x`, the negative of the
reference's `x1 - x0` (the same model up to the sign of its output layer).
"""

from __future__ import annotations

import importlib.util

import ml_collections

from core import diffusion
from core.data import speech_like
from methods.base import (
  Method,
  lookup,
  require,
  require_choice,
  require_file,
  require_positive_int,
  require_prepared_tfds,
)
from methods.flow2gan import study, tokens
from methods.flow2gan.phases import (
  benchmark,
  flow_loss,
  gan_step,
  generate,
  generator,
  init_flow_state,
  init_gan_state,
  phases,
)

__all__ = [
  "METHOD",
  "benchmark",
  "flow_loss",
  "gan_step",
  "generate",
  "generator",
  "init_flow_state",
  "init_gan_state",
  "phases",
  "validate",
]


def _positive_ints(config, field: str) -> tuple[int, ...]:
  from methods.base import lookup

  values = tuple(lookup(config, field))
  require(
    all(isinstance(v, int) and v > 0 for v in values), field, f"must be positive ints, got {values}"
  )
  return values


def _validate_data(config) -> None:
  d = config.data
  require_choice(config, "data.source", ("procedural", "libritts"))
  for field in ("data.sample_rate", "data.segment_length", "data.num_train", "data.num_test"):
    require_positive_int(config, field)
  require(
    1 <= d.min_events <= d.max_events, "data.max_events", "need 1 <= min_events <= max_events"
  )
  if d.source == "libritts":
    if d.data_dir:
      require(
        importlib.util.find_spec("tensorflow") is not None,
        "data.source",
        "'libritts' is read through tfds's LibriTTS builder, which needs TensorFlow "
        '(pip install -e ".[audio_data]")',
      )
    require_prepared_tfds(config, "data.data_dir", speech_like.LIBRITTS)


def _validate_model(config) -> None:
  m = config.model
  n_ffts, hops = _positive_ints(config, "model.n_ffts"), _positive_ints(config, "model.hops")
  channels, blocks = (
    _positive_ints(config, "model.channels"),
    _positive_ints(config, "model.num_blocks"),
  )
  require(
    len(n_ffts) == len(hops) == len(channels) == len(blocks) >= 1,
    "model.hops",
    "model.n_ffts, hops, channels and num_blocks need one entry per branch",
  )
  require_choice(config, "model.condition", ("mel", "tokens"))
  cond_hop, cond_name = config.mel.hop, "mel.hop"
  if m.condition == "tokens":
    cond_hop, cond_name = tokens.codec_hop(config), "the codec hop prod(codec.ratios)"
  for n, h in zip(n_ffts, hops, strict=True):
    require(n % h == 0 and 2 * h <= n, "model.hops", f"hop {h} must divide n_fft {n} and be <= n/2")
    require(cond_hop % h == 0, "model.hops", f"hop {h} must divide {cond_name} {cond_hop}")
  for field in (
    "model.hidden_factor",
    "model.time_dim",
    "model.cond_channels",
    "model.cond_blocks",
  ):
    require_positive_int(config, field)
  require(m.time_dim % 2 == 0 and m.time_dim >= 4, "model.time_dim", "must be even and >= 4")
  require(m.kernel_size % 2 == 1, "model.kernel_size", "must be odd")
  require(0.0 <= m.branch_dropout < 1.0, "model.branch_dropout", "must be in [0, 1)")
  if m.pretrained_checkpoint:
    require_file(
      config,
      "model.pretrained_checkpoint",
      "an .npz of the official generator's state dict",
      "export it from a released k2-fsa/Flow2GAN .pt where torch is installed "
      "(core/nn/audio_convnext_convert.py)",
    )
    require(
      m.pretrained_checkpoint.endswith(".npz"),
      "model.pretrained_checkpoint",
      f"{m.pretrained_checkpoint!r} is not an .npz; a released .pt is a torch pickle, export its "
      "state dict with torch first (core/nn/audio_convnext_convert.py)",
    )
  length = config.data.segment_length
  require(
    length % max(config.mel.hop, cond_hop, *hops) == 0,
    "data.segment_length",
    f"{length} must be a multiple of every hop ({cond_name} {cond_hop}, mel.hop {config.mel.hop}, "
    f"model.hops {hops})",
  )
  if m.codec_checkpoint:
    require(
      m.condition == "tokens", "model.codec_checkpoint", "is used only with condition 'tokens'"
    )
    require_file(
      config,
      "model.codec_checkpoint",
      "an .npz of EnCodec's state dict (transformers' EncodecModel)",
      "export facebook/encodec_24khz's state dict where torch is installed (core/nn/encodec_convert.py)",
    )
    require(
      m.codec_checkpoint.endswith(".npz"),
      "model.codec_checkpoint",
      f"{m.codec_checkpoint!r} is not an .npz of named arrays (core/nn/encodec_convert.py)",
    )


def _validate_codec(config) -> None:
  c = config.codec
  _positive_ints(config, "codec.ratios")
  for field in (
    "codec.num_filters",
    "codec.dimension",
    "codec.num_residual_layers",
    "codec.codebook_size",
    "codec.num_quantizers",
    "codec.quantizers",
    "codec.batch_size",
    "codec.kmeans_iters",
  ):
    require_positive_int(config, field)
  require(
    isinstance(c.lstm_layers, int) and c.lstm_layers >= 0,
    "codec.lstm_layers",
    "must be an int >= 0",
  )
  for field in ("codec.steps", "codec.warmup_steps"):
    value = lookup(config, field)
    require(isinstance(value, int) and value >= 0, field, "must be an int >= 0")
  require(
    c.codebook_size & (c.codebook_size - 1) == 0, "codec.codebook_size", "must be a power of 2"
  )
  require(
    c.quantizers <= c.num_quantizers,
    "codec.quantizers",
    f"{c.quantizers} codebooks used, only codec.num_quantizers = {c.num_quantizers} exist",
  )
  require(0.0 <= c.ema_decay < 1.0, "codec.ema_decay", "must be in [0, 1)")
  require(c.ema_eps > 0 and c.learning_rate > 0, "codec.learning_rate", "must be positive")
  require(c.dead_code_threshold >= 0, "codec.dead_code_threshold", "must be >= 0")


def _validate_flow(config) -> None:
  f = config.flow
  require_choice(config, "flow.prediction", diffusion.RF_PREDICTIONS)
  require_choice(config, "flow.time_sampling", diffusion.RF_TIME_SAMPLINGS)
  require(f.noise_scale > 0, "flow.noise_scale", "must be positive")
  for field in (
    "flow.steps",
    "flow.batch_size",
    "flow.loss_n_fft",
    "flow.loss_hop",
    "flow.loss_filters",
  ):
    require_positive_int(config, field)
  require(
    f.loss_n_fft % f.loss_hop == 0 and 2 * f.loss_hop <= f.loss_n_fft,
    "flow.loss_hop",
    "must divide flow.loss_n_fft and be at most half of it",
  )
  require(0 < f.loss_scale_min <= f.loss_scale_max, "flow.loss_scale_max", "need 0 < min <= max")
  require(0.0 <= f.ema_decay < 1.0, "flow.ema_decay", "must be in [0, 1)")
  require(f.learning_rate > 0, "flow.learning_rate", "must be positive")


def _validate_gan(config) -> None:
  g = config.gan
  _positive_ints(config, "gan.generator_steps")
  require(
    len(set(g.generator_steps)) == len(g.generator_steps), "gan.generator_steps", "repeats a value"
  )
  for field in ("gan.steps", "gan.batch_size", "gan.resolution_channels"):
    require_positive_int(config, field)
  require(0 <= g.disc_only_steps < g.steps, "gan.disc_only_steps", "must be in [0, gan.steps)")
  require(
    len(g.weights) == 5, "gan.weights", "needs 5 weights: adv MPD, adv MRD, FM MPD, FM MRD, mel"
  )
  require(len(g.disc_weights) == 2, "gan.disc_weights", "needs 2 weights: MPD, MRD")
  require(
    len(g.mel_n_ffts) == len(g.mel_n_mels), "gan.mel_n_mels", "needs one entry per gan.mel_n_ffts"
  )
  _positive_ints(config, "gan.periods")
  _positive_ints(config, "gan.period_channels")
  windows = _positive_ints(config, "gan.windows")
  require(
    all(w % 4 == 0 and w // 2 < config.data.segment_length for w in windows),
    "gan.windows",
    "need multiples of 4 shorter than twice data.segment_length",
  )


def _validate_eval(config) -> None:
  e = config.eval
  steps = _positive_ints(config, "eval.fm_steps")
  require(e.headline_fm_steps in steps, "eval.headline_fm_steps", f"must be one of {steps}")
  require(len(e.mel_n_ffts) == len(e.mel_n_mels), "eval.mel_n_mels", "one per eval.mel_n_ffts")
  for field in ("eval.batch_size", "eval.timing_batch", "eval.timing_repeats", "eval.lsd_n_fft"):
    require_positive_int(config, field)
  require(e.timing_batch <= config.data.num_test, "eval.timing_batch", "must be <= data.num_test")
  require(e.floor_db < e.quiet_threshold_db, "eval.floor_db", "must be below quiet_threshold_db")


def validate(config: ml_collections.ConfigDict) -> None:
  _validate_data(config)
  _validate_model(config)
  if tokens.uses_tokens(config):
    _validate_codec(config)
  _validate_flow(config)
  _validate_gan(config)
  _validate_eval(config)


METHOD = Method(
  name="flow2gan",
  phases=phases,
  validate=validate,
  study_arms=study.study_arms,
  report=study.report,
)
