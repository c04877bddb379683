"""Flow2GAN from discrete codec tokens ("Flow2GAN", ICLR 2026: generation "from Mel-spectrograms or
discrete audio tokens"; its token models condition on 24 kHz EnCodec tokens at 1.5 to 6 kbps).

`model.condition = "tokens"` replaces the log-mel by the token condition: the waveform is encoded by a
codec (`core/nn/codec.py`, EnCodec's layout), quantized by its residual vector quantizer with the first
`codec.quantizers` codebooks (the bitrate), and each frame's condition is the sum over those codebooks
of the tokens' codewords (the codec's own codebook vectors, as Vocos embeds EnCodec tokens). The
official condition encoder takes such codec embeddings in place of mels ("ConvNeXt-based Encoder on
input conditions, e.g., mels, codec embeddings", k2-fsa/Flow2GAN `flow2gan/models/modules.py`); the
frames are repeated to each branch's frame rate exactly as mel frames are, so the codec hop must be a
multiple of every branch hop. Everything after the condition encoder is the mel model's code.

The codec comes from the `codec` phase, before flow matching: either trained here (SEANet encoder and
decoder, k-means-initialised codebooks updated by moving averages, quantizer dropout, loss
`codec.l1_weight * |x - x_hat| + codec.spectral_weight * multi-scale log-mel L1 +
codec.commitment_weight * commitment`; no adversarial loss: the decoder only serves to train the
encoder and codebooks, its audio is never the output), or, with `model.codec_checkpoint`, EnCodec
24 kHz's released encoder and quantizer converted (`core/nn/encodec_convert.py`; 0 steps). Tokens are
computed on the fly from the clean training audio inside the jitted steps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import audio
from core.nn import codec as codec_lib
from core.nn import encodec_convert
from methods.base import ConfigError, cached_per_config


def uses_tokens(config) -> bool:
  return config.model.condition == "tokens"


def codec_hop(config) -> int:
  return int(np.prod(config.codec.ratios))


def bitrate_kbps(config) -> float:
  """Token bitrate: `quantizers * log2(codebook_size) * frame rate` (EnCodec's accounting)."""
  c = config.codec
  return (
    c.quantizers * math.log2(c.codebook_size) * config.data.sample_rate / codec_hop(config) / 1e3
  )


def _layout(config) -> dict:
  c = config.codec
  return dict(
    num_filters=c.num_filters,
    ratios=tuple(c.ratios),
    dimension=c.dimension,
    num_residual_layers=c.num_residual_layers,
    lstm_layers=c.lstm_layers,
  )


def encoder(config) -> codec_lib.SEANetEncoder:
  return codec_lib.SEANetEncoder(**_layout(config))


def decoder(config) -> codec_lib.SEANetDecoder:
  return codec_lib.SEANetDecoder(**_layout(config))


def num_frames(config, length: int) -> int:
  return -(-length // codec_hop(config))


def condition_shape(config, length: int) -> tuple[int, int]:
  """`(frames, channels)` of the token condition of `length` samples."""
  return num_frames(config, length), config.codec.dimension


def tokens(config, codec: dict, waveform: jax.Array) -> jax.Array:
  """int32 tokens `(B, frames, codec.quantizers)` of `waveform (B, T)`."""
  z = encoder(config).apply({"params": codec["encoder"]}, waveform)
  codes, _ = codec_lib.rvq_encode(z, codec["codebooks"], config.codec.quantizers)
  return codes


def token_features(config, codec: dict, waveform: jax.Array) -> jax.Array:
  """The token condition `(B, frames, codec.dimension)`: the summed codewords of `tokens`."""
  codes = tokens(config, jax.lax.stop_gradient(codec), waveform)
  return codec_lib.embed_tokens(codes, codec["codebooks"])


# ---------------------------------------------------------------------------------------------------
# Phase "codec"
# ---------------------------------------------------------------------------------------------------


def codec_optimizer(config) -> optax.GradientTransformation:
  """Adam (b1 0.5, b2 0.9, EnCodec's) after a linear warm-up of `codec.warmup_steps`: Adam's first
  steps move every weight by the full rate and undo the k-means fit of the codebooks."""
  c = config.codec
  schedule = optax.linear_schedule(0.0, c.learning_rate, max(c.warmup_steps, 1))
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule, b1=0.5, b2=0.9))


def init_codec_state(config, rng, inputs=None) -> dict:
  """Fresh encoder, decoder and empty codebooks; or, with `model.codec_checkpoint`, the converted
  EnCodec encoder and codebooks only (nothing is trained then)."""
  del inputs
  c = config.codec
  x = jnp.zeros((1, config.data.segment_length))
  enc_rng, dec_rng = jax.random.split(rng)
  if config.model.codec_checkpoint:
    expected = jax.eval_shape(encoder(config).init, enc_rng, x)
    return load_codec(config, expected)
  enc = encoder(config).init(enc_rng, x)["params"]
  z = jnp.zeros((1, num_frames(config, x.shape[1]), c.dimension))
  dec = decoder(config).init(dec_rng, z)["params"]
  params = {"encoder": enc, "decoder": dec}
  return {
    "params": params,
    "opt_state": codec_optimizer(config).init(params),
    "rvq": codec_lib.init_rvq(c.num_quantizers, c.codebook_size, c.dimension),
  }


def load_codec(config, expected) -> dict:
  """EnCodec's encoder and quantizer (an `.npz` of transformers' `EncodecModel` state dict) as
  `{"encoder", "codebooks"}`; a key that does not fit names itself in a `ConfigError`."""
  path = config.model.codec_checkpoint
  try:
    state_dict = encodec_convert.read_npz(path)
    out = encodec_convert.encodec_to_flax(state_dict, expected, config.codec.num_quantizers)
  except (encodec_convert.CheckpointError, OSError, ValueError) as error:
    raise ConfigError(f"config.model.codec_checkpoint: {error}") from None
  size = out["codebooks"].shape[1]
  if size != config.codec.codebook_size:
    raise ConfigError(
      f"config.model.codec_checkpoint: codebooks of {size}, codec.codebook_size is "
      f"{config.codec.codebook_size}"
    )
  return out


def codec_outputs(state) -> dict:
  """What the later phases condition on: the encoder and the codebooks (the decoder stays here)."""
  if "rvq" not in state:
    return state
  return {"encoder": state["params"]["encoder"], "codebooks": state["rvq"]["embed"]}


MEL_FLOOR = 1e-5  # EnCodec's mel-loss floor (`floor_level`)


def reconstruction_loss(config, real, fake) -> dict[str, jax.Array]:
  """Waveform L1 and the sum over `gan.mel_n_ffts` scales (hop n_fft / 4) of the mean
  `|log max(mel, 1e-5) - log max(mel_hat, 1e-5)|`. The floor is EnCodec's: with the vocoder's 1e-7
  clamp the loss of a codec is dominated by how close to exact zero its output is inside the data's
  digital silences, and jumps as silent frames change codewords."""
  g, rate = config.gan, config.data.sample_rate
  spectral = 0.0
  for n_fft, n_mels in zip(g.mel_n_ffts, g.mel_n_mels, strict=True):
    a, b = (
      jnp.log(jnp.maximum(audio.mel_spectrogram(x, rate, n_fft, n_fft // 4, n_mels), MEL_FLOOR))
      for x in (real, fake)
    )
    spectral = spectral + jnp.mean(jnp.abs(a - b))
  return {"l1": jnp.mean(jnp.abs(real - fake)), "spectral": spectral}


def codec_step(config, state, batch, rng):
  """One codec step: encoder, quantizer (the first `active` codebooks; `active` uniform in
  1..num_quantizers with `codec.quantizer_dropout`, EnCodec's bandwidth sampling), decoder; Adam on
  the encoder and decoder, moving averages on the codebooks."""
  c = config.codec
  real = batch["audio"]
  drop_rng, rvq_rng = jax.random.split(rng)
  active = (
    jax.random.randint(drop_rng, (), 1, c.num_quantizers + 1)
    if c.quantizer_dropout
    else jnp.asarray(c.num_quantizers)
  )

  def loss_fn(params):
    z = encoder(config).apply({"params": params["encoder"]}, real)
    quantized, commit, rvq, _ = codec_lib.rvq_train(
      state["rvq"],
      z,
      active,
      rvq_rng,
      decay=c.ema_decay,
      eps=c.ema_eps,
      dead_threshold=c.dead_code_threshold,
      kmeans_iters=c.kmeans_iters,
    )
    fake = decoder(config).apply({"params": params["decoder"]}, quantized)[:, : real.shape[1]]
    losses = reconstruction_loss(config, real, fake)
    losses["commitment"] = commit
    total = c.l1_weight * losses["l1"] + c.spectral_weight * losses["spectral"]
    return total + c.commitment_weight * commit, (losses, rvq)

  (loss, (losses, rvq)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = codec_optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  metrics = {"loss": loss, **{f"codec_{k}": v for k, v in losses.items()}}
  return {"params": params, "opt_state": opt_state, "rvq": rvq}, metrics


@cached_per_config(maxsize=4)
def jitted_resynthesis(config):
  """`(codec state, audio) -> (losses, tokens)`: encode, quantize, decode at the inference bitrate."""

  def run(state, real):
    z = encoder(config).apply({"params": state["params"]["encoder"]}, real)
    codes, quantized = codec_lib.rvq_encode(z, state["rvq"]["embed"], config.codec.quantizers)
    fake = decoder(config).apply({"params": state["params"]["decoder"]}, quantized)
    return reconstruction_loss(config, real, fake[:, : real.shape[1]]), codes

  return jax.jit(run)


def codec_evaluation(config, state, test_audio: np.ndarray) -> dict[str, float]:
  """The codec's own resynthesis at the inference bitrate on the test set (its decoder's log-mel L1
  and waveform L1), and how many codewords of each used codebook the test tokens touch (as a
  perplexity: `exp` of the entropy of the token histogram, pooled over the used codebooks)."""
  if "rvq" not in state:
    return {}
  run = jitted_resynthesis(config)
  rows, codes = [], []
  size = config.eval.batch_size
  for start in range(0, len(test_audio), size):
    losses, c = run(state, jnp.asarray(test_audio[start : start + size]))
    rows.append(jax.device_get(losses))
    codes.append(np.asarray(c))
  codes = np.concatenate(codes).reshape(-1, config.codec.quantizers)
  perplexities = []
  for i in range(codes.shape[1]):
    p = np.bincount(codes[:, i], minlength=config.codec.codebook_size) / len(codes)
    perplexities.append(float(np.exp(-np.sum(p[p > 0] * np.log(p[p > 0])))))
  return {
    "codec_mel_distance": float(np.mean([r["spectral"] for r in rows])),
    "codec_l1": float(np.mean([r["l1"] for r in rows])),
    "codec_perplexity": float(np.mean(perplexities)),
    "codec_kbps": bitrate_kbps(config),
  }
