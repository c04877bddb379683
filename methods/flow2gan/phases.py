"""Flow2GAN's phases: with `model.condition = "tokens"` first `codec` (the codec whose tokens condition
the generator, `methods/flow2gan/tokens.py`), then `flow` (flow matching of the multi-branch
generator), one `gan_<N>step` phase per entry of `config.gan.generator_steps` (GAN fine-tuning of
the N-step unrolled sampler, initialised from the flow phase's averaged parameters) and `benchmark`
(0 steps: every generator on the same test set and noise, quality metrics and speed side by side).
The paper and the map to `core/` are in `methods/flow2gan/__init__.py`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import audio, diffusion, gan, optim
from core.data import batching, speech_like, wav
from core.nn import audio_convnext_convert
from core.nn.audio_convnext import MultiBranchGenerator
from core.nn.audio_discriminators import Discriminators
from methods.base import ConfigError, Phase, cached_per_config
from methods.flow2gan import tokens

WAV_EXAMPLES = (
  4  # test segments the benchmark writes as WAV files per generator (and of the reference)
)

# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def _procedural_kwargs(config) -> dict:
  d = config.data
  return dict(
    length=d.segment_length,
    sample_rate=d.sample_rate,
    min_events=d.min_events,
    max_events=d.max_events,
  )


@cached_per_config(maxsize=4)
def train_arrays(config) -> dict[str, np.ndarray]:
  """The training segments (procedural; `data.num_train` of them, seed `data.seed`)."""
  d = config.data
  return speech_like.segments(d.seed, 0, d.num_train, **_procedural_kwargs(config))


@cached_per_config(maxsize=4)
def test_arrays(config) -> dict[str, np.ndarray]:
  """Held-out segments: procedural indices after the training ones, or LibriTTS test crops."""
  d = config.data
  if d.source == "libritts":
    source = speech_like.libritts_source(d.test_split, d.data_dir)
    records = [
      speech_like.crop_record(source[i], d.seed + 1, i, d.segment_length)
      for i in range(min(d.num_test, len(source)))
    ]
    return {k: np.stack([r[k] for r in records]) for k in ("audio", "silence")}
  return speech_like.segments(d.seed, d.num_train, d.num_test, **_procedural_kwargs(config))


def data_source(config, batch_size: int):
  """Resumable batches of `{"audio": (B, T)}`: procedural arrays, or LibriTTS crops read at random
  access (one seeded window of each utterance; the batch is a pure function of the step)."""
  d = config.data
  if d.source == "libritts":
    source = speech_like.libritts_source(d.train_split, d.data_dir)

    def gather(indices):
      crops = [
        speech_like.crop_record(source[int(i)], d.seed, int(i), d.segment_length) for i in indices
      ]
      return {"audio": np.stack([c["audio"] for c in crops])}

    return batching.IndexedBatches(gather, len(source), batch_size, config.seed)
  return batching.from_arrays({"audio": train_arrays(config)["audio"]}, batch_size, config.seed)


# ---------------------------------------------------------------------------------------------------
# The generator and its samplers
# ---------------------------------------------------------------------------------------------------


def generator(config) -> MultiBranchGenerator:
  m = config.model
  return MultiBranchGenerator(
    n_ffts=tuple(m.n_ffts),
    hops=tuple(m.hops),
    channels=tuple(m.channels),
    num_blocks=tuple(m.num_blocks),
    cond_channels=m.cond_channels,
    cond_blocks=m.cond_blocks,
    cond_hop=tokens.codec_hop(config) if tokens.uses_tokens(config) else config.mel.hop,
    time_dim=m.time_dim,
    hidden_factor=m.hidden_factor,
    kernel_size=m.kernel_size,
    branch_dropout=m.branch_dropout,
  )


def mel_features(config, waveform: jax.Array) -> jax.Array:
  """The conditioning log-mel `(B, frames, n_mels)`."""
  m = config.mel
  return audio.log_mel(waveform, config.data.sample_rate, m.n_fft, m.hop, m.n_mels)


def condition_features(config, codec, waveform: jax.Array) -> jax.Array:
  """The condition encoder's input `(B, frames, channels)` (`model.condition`): the log-mel, or the
  summed codewords of the codec's tokens of `waveform` (`codec` from the `codec` phase; None for mel)."""
  if tokens.uses_tokens(config):
    return tokens.token_features(config, codec, waveform)
  return mel_features(config, waveform)


def init_generator(config, rng) -> dict:
  """Fresh parameters, or the official weights converted when `model.pretrained_checkpoint` is set."""
  t = config.data.segment_length
  x = jnp.zeros((1, t))
  if tokens.uses_tokens(config):
    mel = jnp.zeros((1, *tokens.condition_shape(config, t)))
  else:
    mel = mel_features(config, x)
  init = functools.partial(generator(config).init, method=MultiBranchGenerator.full)
  if config.model.pretrained_checkpoint:
    return load_pretrained(config, jax.eval_shape(init, rng, x, mel, jnp.zeros((1,))))
  return init(rng, x, mel, jnp.zeros((1,)))


def load_pretrained(config, expected) -> dict:
  """The official PyTorch generator (an `.npz` of its state dict) as this generator's parameters
  (`core/nn/audio_convnext_convert.py`); a key that does not fit names itself in a `ConfigError`."""
  path = config.model.pretrained_checkpoint
  try:
    state_dict = audio_convnext_convert.read_npz(path)
    return audio_convnext_convert.flow2gan_to_flax(state_dict, expected, tuple(config.model.n_ffts))
  except (audio_convnext_convert.CheckpointError, OSError, ValueError) as error:
    raise ConfigError(f"config.model.pretrained_checkpoint: {error}") from None


def model_fn(config, params, cond, dropout_rng=None):
  """`(x_t, t) -> prediction` in `core/diffusion.py`'s time (1 = noise); the network sees the
  reference's time `1 - t` (0 = noise)."""
  net = generator(config)

  def fn(x, t):
    return net.apply(params, x, cond, 1.0 - t, dropout_rng)

  return fn


def sampler(prediction: str, num_steps: int) -> diffusion.Sampler:
  """Euler over `num_steps` uniform steps; the endpoint form converts the data prediction to a velocity."""
  ts = diffusion.rf_time_grid(num_steps)
  return diffusion.rf_data_sampler(ts) if prediction == "data" else diffusion.euler_sampler(ts)


def generate(config, params, mel, noise, num_steps: int, dropout_rng=None):
  """The N-step generator: the condition (`mel`: `condition_features`, log-mel or token codewords)
  encoded once, then `num_steps` Euler steps from `noise` (already scaled by `flow.noise_scale`);
  differentiable through every step."""
  net = generator(config)
  cond = net.apply(params, mel, method=MultiBranchGenerator.encode)
  fn = model_fn(config, params, cond, dropout_rng)
  return diffusion.sample(fn, noise, sampler(config.flow.prediction, num_steps))


def initial_noise(config, rng, shape) -> jax.Array:
  return config.flow.noise_scale * jax.random.normal(rng, shape)


# ---------------------------------------------------------------------------------------------------
# Phase "flow": flow matching
# ---------------------------------------------------------------------------------------------------


def flow_optimizer(config) -> optax.GradientTransformation:
  f = config.flow
  schedule = optim.warmup_cosine(f.learning_rate, f.warmup_steps, f.steps)
  return optim.clipped_adam(schedule, f.grad_clip, weight_decay=1e-4)  # optax.adamw's default


def loss_filterbank(config) -> jax.Array:
  f = config.flow
  return jnp.asarray(audio.linear_filterbank(config.data.sample_rate, f.loss_n_fft, f.loss_filters))


def flow_error_fn(config, waveform):
  """The error reduction: the energy-scaled spectral loss against `waveform`, or the mean square."""
  f = config.flow
  if not f.spectral_scaling:
    return None
  bank = loss_filterbank(config)
  return lambda error: audio.energy_scaled_spectral_loss(
    error,
    waveform,
    bank,
    f.loss_n_fft,
    f.loss_hop,
    f.loss_power,
    f.loss_eps,
    f.loss_scale_min,
    f.loss_scale_max,
  )


def flow_loss(config, params, waveform, rng, codec=None):
  """Flow matching of the generator on `waveform` (`core.diffusion.rf_regression_loss`), endpoint or
  velocity target (`flow.prediction`), with or without spectral scaling, uniform time, noise scale
  `flow.noise_scale`, branch dropout on; conditioned on `condition_features` of `waveform`."""
  loss_rng, dropout_rng = jax.random.split(rng)
  net = generator(config)
  features = condition_features(config, codec, waveform)
  cond = net.apply(params, features, method=MultiBranchGenerator.encode)
  f = config.flow
  return diffusion.rf_regression_loss(
    model_fn(config, params, cond, dropout_rng),
    waveform,
    loss_rng,
    prediction=f.prediction,
    time_sampling=f.time_sampling,
    noise_scale=f.noise_scale,
    error_fn=flow_error_fn(config, waveform),
  )


def _with_codec(config, state: dict, inputs) -> dict:
  """The codec rides in the state of every phase after it (steps see no inputs), frozen."""
  if tokens.uses_tokens(config):
    return {**state, "codec": inputs["codec"]}
  return state


def init_flow_state(config, rng, inputs=None) -> dict:
  params = init_generator(config, rng)
  state = {"params": params, "ema": params, "opt_state": flow_optimizer(config).init(params)}
  return _with_codec(config, state, inputs)


def flow_step(config, state, batch, rng):
  codec = state.get("codec")
  loss, grads = jax.value_and_grad(lambda p: flow_loss(config, p, batch["audio"], rng, codec))(
    state["params"]
  )
  updates, opt_state = flow_optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  decay = config.flow.ema_decay
  ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, state["ema"], params)
  new = {"params": params, "ema": ema, "opt_state": opt_state}
  return {**state, **new}, {
    "loss": loss,
    "grad_norm": optax.tree.norm(grads),
  }


@cached_per_config(maxsize=4)
def jitted_flow_loss(config):
  return jax.jit(functools.partial(flow_loss, config))


def flow_validation(config, state, rng) -> dict[str, float]:
  """The flow-matching loss of the averaged parameters on (a slice of) the test set, two draws of
  time and noise."""
  waveform = jnp.asarray(test_arrays(config)["audio"][: config.eval.batch_size])
  loss_fn = jitted_flow_loss(config)
  codec = state.get("codec")
  losses = [loss_fn(state["ema"], waveform, jax.random.fold_in(rng, i), codec) for i in range(2)]
  return {"flow_validation_loss": float(np.mean(losses))}


# ---------------------------------------------------------------------------------------------------
# Phases "gan_<N>step": GAN fine-tuning of the N-step generator
# ---------------------------------------------------------------------------------------------------


def discriminators(config) -> Discriminators:
  g = config.gan
  return Discriminators(
    tuple(g.periods), tuple(g.period_channels), tuple(g.windows), g.resolution_channels
  )


def gan_optimizers(config) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
  g = config.gan
  gen = optax.chain(
    optax.clip_by_global_norm(g.grad_clip), optax.adamw(g.gen_learning_rate, g.b1, g.b2)
  )
  disc = optax.chain(
    optax.clip_by_global_norm(g.grad_clip), optax.adamw(g.disc_learning_rate, g.b1, g.b2)
  )
  return gen, disc


def init_gan_state(config, rng, inputs) -> dict:
  """The generator from the flow phase's averaged parameters; fresh discriminators."""
  gen_params = inputs["flow"]
  x = jnp.zeros((1, config.data.segment_length))
  disc_params = discriminators(config).init(rng, x)
  gen_opt, disc_opt = gan_optimizers(config)
  state = {
    "gen": gen_params,
    "disc": disc_params,
    "gen_opt": gen_opt.init(gen_params),
    "disc_opt": disc_opt.init(disc_params),
    "step": jnp.zeros((), jnp.int32),
  }
  return _with_codec(config, state, inputs)


def _judge(config, disc_params, real, fake):
  """Both discriminators on real and fake in one batch (one graph, not two); returns
  `{name: ((real scores, fake scores), (real fmaps, fake fmaps))}`."""
  out = discriminators(config).apply(disc_params, jnp.concatenate([real, fake], axis=0))
  n = real.shape[0]

  def split(tree):
    return jax.tree.map(lambda a: a[:n], tree), jax.tree.map(lambda a: a[n:], tree)

  return {name: (split(scores), split(fmaps)) for name, (scores, fmaps) in out.items()}


def discriminator_loss(config, disc_params, real, fake):
  """`1.0 hinge(MPD) + 0.1 hinge(MRD)` (`gan.disc_weights`)."""
  judged = _judge(config, disc_params, real, fake)
  w_mpd, w_mrd = config.gan.disc_weights
  return w_mpd * gan.hinge_discriminator_loss(*judged["mpd"][0]) + w_mrd * (
    gan.hinge_discriminator_loss(*judged["mrd"][0])
  )


def generator_losses(config, disc_params, real, fake) -> dict[str, jax.Array]:
  """Adversarial and feature-matching losses of MPD and MRD and the multi-scale mel L1; `total` is
  their weighted sum (`gan.weights`: 1, 0.1, 1, 0.1, 45 in the reference)."""
  judged = _judge(config, disc_params, real, fake)
  g = config.gan
  losses = {
    "adv_mpd": gan.hinge_generator_loss(judged["mpd"][0][1]),
    "adv_mrd": gan.hinge_generator_loss(judged["mrd"][0][1]),
    "fm_mpd": gan.feature_matching_loss(*judged["mpd"][1]),
    "fm_mrd": gan.feature_matching_loss(*judged["mrd"][1]),
    "mel": audio.multi_scale_mel_l1(
      real, fake, config.data.sample_rate, tuple(g.mel_n_ffts), tuple(g.mel_n_mels)
    ),
  }
  weights = dict(zip(("adv_mpd", "adv_mrd", "fm_mpd", "fm_mrd", "mel"), g.weights, strict=True))
  losses["total"] = sum(weights[k] * losses[k] for k in weights)
  return losses


def discriminator_update(config, num_steps: int, state, real, mel, rng):
  """One discriminator step on the current generator's output (no gradient into the generator,
  branch dropout off, as the reference's generator in eval mode)."""
  fake = generate(config, state["gen"], mel, initial_noise(config, rng, real.shape), num_steps)
  fake = jax.lax.stop_gradient(fake)
  loss, grads = jax.value_and_grad(lambda p: discriminator_loss(config, p, real, fake))(
    state["disc"]
  )
  _, disc_opt = gan_optimizers(config)
  updates, opt_state = disc_opt.update(grads, state["disc_opt"], state["disc"])
  return {
    **state,
    "disc": optax.apply_updates(state["disc"], updates),
    "disc_opt": opt_state,
  }, loss


def generator_update(config, num_steps: int, state, real, mel, rng):
  """One generator step through all `num_steps` unrolled sampler steps (branch dropout on)."""
  noise_rng, dropout_rng = jax.random.split(rng)
  noise = initial_noise(config, noise_rng, real.shape)

  def loss_fn(params):
    fake = generate(config, params, mel, noise, num_steps, dropout_rng)
    losses = generator_losses(config, state["disc"], real, fake)
    return losses["total"], losses

  (_, losses), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["gen"])
  gen_opt, _ = gan_optimizers(config)
  updates, opt_state = gen_opt.update(grads, state["gen_opt"], state["gen"])
  return {**state, "gen": optax.apply_updates(state["gen"], updates), "gen_opt": opt_state}, losses


def gan_step(config, num_steps: int, state, batch, rng):
  """A discriminator step, then (after `gan.disc_only_steps` steps) a generator step."""
  real = batch["audio"]
  mel = condition_features(config, state.get("codec"), real)
  d_rng, g_rng = jax.random.split(rng)
  state, d_loss = discriminator_update(config, num_steps, state, real, mel, d_rng)
  zeros = {k: jnp.zeros(()) for k in ("adv_mpd", "adv_mrd", "fm_mpd", "fm_mrd", "mel", "total")}

  def train_generator(state):
    return generator_update(config, num_steps, state, real, mel, g_rng)

  state, g_losses = jax.lax.cond(
    state["step"] >= config.gan.disc_only_steps,
    train_generator,
    lambda state: (state, zeros),
    state,
  )
  state = {**state, "step": state["step"] + 1}
  metrics = {f"gan_{k}": v for k, v in g_losses.items()}
  return state, {"loss": d_loss + g_losses["total"], "disc_loss": d_loss, **metrics}


# ---------------------------------------------------------------------------------------------------
# Phase "benchmark": every generator side by side
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def jitted_generator(config, num_steps: int):
  """`(params, codec, audio, rng) -> waveform` clamped to [-1, 1] (inference; the condition, log-mel
  or tokens, is computed from `audio` inside, and timed with the generator)."""

  def run(params, codec, reference, rng):
    noise = initial_noise(config, rng, reference.shape)
    out = generate(config, params, condition_features(config, codec, reference), noise, num_steps)
    return jnp.clip(out, -1.0, 1.0)

  return jax.jit(run)


@cached_per_config(maxsize=4)
def jitted_metrics(config):
  e = config.eval

  def metrics(real, fake, silence):
    return {
      "mel_distance": audio.multi_scale_mel_l1(
        real, fake, config.data.sample_rate, tuple(e.mel_n_ffts), tuple(e.mel_n_mels)
      ),
      "mr_stft_distance": audio.multi_resolution_stft_distance(real, fake, tuple(e.stft_n_ffts)),
      "quiet_bin_lsd": audio.quiet_bin_lsd(
        real, fake, e.lsd_n_fft, e.lsd_n_fft // 4, e.quiet_threshold_db, e.floor_db
      ),
      "silence_energy": jnp.sum(jnp.square(fake) * silence),
      "silence_samples": jnp.sum(silence),
    }

  return jax.jit(metrics)


def test_set_scores(config, outputs: np.ndarray) -> dict[str, float]:
  """Metrics of generated `outputs (num_test, T)` against the test set, `eval.batch_size` clips at a
  time: mel and MR-STFT distance and quiet-bin LSD (batch means), silence leakage (the output's
  energy pooled over every reference's exact-zero samples, in dBFS). `pesq` (wideband,
  `core.audio.pesq_wideband`) is the mean over the segments PESQ can score, and is there only when
  the optional `pesq` package is installed."""
  data = test_arrays(config)
  metric_fn = jitted_metrics(config)
  rows, pesq = [], []
  size = config.eval.batch_size
  for start in range(0, len(data["audio"]), size):
    real = jnp.asarray(data["audio"][start : start + size])
    silence = jnp.asarray(data["silence"][start : start + size], jnp.float32)
    fake = jnp.asarray(outputs[start : start + size])
    rows.append(jax.device_get(metric_fn(real, fake, silence)))
    if audio.PESQ_AVAILABLE:
      pesq.append(audio.pesq_wideband(np.asarray(real), np.asarray(fake), config.data.sample_rate))
  energy = sum(float(r["silence_energy"]) for r in rows)
  samples = sum(float(r["silence_samples"]) for r in rows)
  leakage = 10.0 * np.log10(max(energy / samples, 1e-20)) if samples else float("nan")
  out = {k: float(np.mean([r[k] for r in rows])) for k in ("mel_distance", "mr_stft_distance")}
  out["quiet_bin_lsd"] = float(np.mean([r["quiet_bin_lsd"] for r in rows]))
  out["silence_leakage_dbfs"] = leakage
  if pesq:
    scores = np.concatenate(pesq)
    scored = scores[np.isfinite(scores)]
    out["pesq"] = float(scored.mean()) if scored.size else float("nan")
  return out


def quality(config, params, num_steps: int, rng, codec=None) -> tuple[dict[str, float], np.ndarray]:
  """`test_set_scores` of one generator (fixed noise per batch), and its first outputs."""
  data = test_arrays(config)["audio"]
  fn = jitted_generator(config, num_steps)
  size = config.eval.batch_size
  fakes = [
    np.asarray(
      fn(params, codec, jnp.asarray(data[start : start + size]), jax.random.fold_in(rng, i))
    )
    for i, start in enumerate(range(0, len(data), size))
  ]
  return test_set_scores(config, np.concatenate(fakes)), fakes[0]


def speed(config, params, num_steps: int, codec=None) -> dict[str, float]:
  """Samples per second and real-time factor (generation time / audio duration) of the jitted
  generator on `eval.timing_batch` segments, best of `eval.timing_repeats` after a warm-up call."""
  import time

  e, d = config.eval, config.data
  fn = jitted_generator(config, num_steps)
  reference = jnp.asarray(test_arrays(config)["audio"][: e.timing_batch])
  jax.block_until_ready(fn(params, codec, reference, jax.random.key(0)))
  best = float("inf")
  for i in range(e.timing_repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(params, codec, reference, jax.random.key(i + 1)))
    best = min(best, time.perf_counter() - start)
  duration = reference.shape[0] * reference.shape[1] / d.sample_rate
  return {"samples_per_second": reference.size / best, "real_time_factor": best / duration}


def generators(config) -> list[tuple[str, str, int]]:
  """`(name, phase holding its parameters, sampler steps)`: FM at every `eval.fm_steps`, then each GAN
  generator. The headline is the first GAN generator, or FM at `eval.headline_fm_steps`."""
  rows = [(f"fm_{n}step", "flow", n) for n in config.eval.fm_steps]
  rows += [(f"gan_{n}step", f"gan_{n}step", n) for n in config.gan.generator_steps]
  return rows


def headline(config) -> str:
  if config.gan.generator_steps:
    return f"gan_{config.gan.generator_steps[0]}step"
  return f"fm_{config.eval.headline_fm_steps}step"


def benchmark(config, params_by_phase, rng) -> tuple[dict[str, float], dict[str, np.ndarray]]:
  results, examples = {}, {}
  codec = params_by_phase.get("codec")
  for name, phase, steps in generators(config):
    params = params_by_phase[phase]
    metrics, examples[name] = quality(config, params, steps, rng, codec)
    metrics.update(speed(config, params, steps, codec))
    results.update({f"{name}/{k}": v for k, v in metrics.items()})
    if name == headline(config):
      results.update(metrics)
  return results, examples


def audio_examples(config, examples: dict[str, np.ndarray]) -> wav.AudioExamples:
  """The benchmark's `examples` artifact: reference and generators, `WAV_EXAMPLES` segments each."""
  return wav.AudioExamples(config.data.sample_rate, waveforms(config, examples), WAV_EXAMPLES)


def waveforms(config, examples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`{"reference": ..., <generator>: ...}`, the first `WAV_EXAMPLES` test segments of each."""
  reference = test_arrays(config)["audio"][:WAV_EXAMPLES]
  return {"reference": reference, **{k: np.asarray(v)[:WAV_EXAMPLES] for k, v in examples.items()}}


def spectrogram_figure(config, examples: dict[str, np.ndarray]):
  """Log-magnitude spectrograms of the first test segment: reference and every generator; the
  reference's digital silence is marked under its panel."""
  from methods.base import figure_grid

  data = test_arrays(config)
  panels = [("reference", data["audio"][0]), *[(k, v[0]) for k, v in examples.items()]]
  e = config.eval
  fig, axes = figure_grid(len(panels), 1, panel_size=(8, 1.6))
  peak = None
  for ax, (name, wave) in zip(axes[:, 0], panels, strict=True):
    power = np.square(
      np.abs(np.asarray(audio.stft(jnp.asarray(wave), e.lsd_n_fft, e.lsd_n_fft // 4)))
    )
    peak = power.max() if peak is None else peak
    db = 10 * np.log10(np.maximum(power / peak, 1e-10))
    ax.imshow(db.T, origin="lower", aspect="auto", vmin=-100, vmax=0, cmap="magma")
    ax.set_ylabel(name, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
  silent = data["silence"][0][:: e.lsd_n_fft // 4]
  axes[0, 0].plot(np.flatnonzero(silent), np.zeros(int(silent.sum())), "c|", ms=4)
  axes[0, 0].set_title("log |STFT| (dB re. reference max; cyan: digital silence)", fontsize=9)
  fig.tight_layout()
  return fig


# ---------------------------------------------------------------------------------------------------
# The phases
# ---------------------------------------------------------------------------------------------------


def codec_phase(config) -> Phase:
  """The codec of the token condition: trained (`codec.steps`), or converted from
  `model.codec_checkpoint` (0 steps); hands `{"encoder", "codebooks"}` on."""
  return Phase(
    name="codec",
    num_steps=0 if config.model.codec_checkpoint else config.codec.steps,
    init=functools.partial(tokens.init_codec_state, config),
    step=functools.partial(tokens.codec_step, config),
    data=lambda inputs: data_source(config, config.codec.batch_size),
    evaluate=lambda state, rng, inputs: tokens.codec_evaluation(
      config, state, test_arrays(config)["audio"]
    ),
    outputs=lambda state, inputs: tokens.codec_outputs(state),
  )


def phases(config) -> list[Phase]:
  flow = Phase(
    name="flow",
    num_steps=0 if config.model.pretrained_checkpoint else config.flow.steps,
    init=functools.partial(init_flow_state, config),
    step=functools.partial(flow_step, config),
    data=lambda inputs: data_source(config, config.flow.batch_size),
    evaluate=lambda state, rng, inputs: flow_validation(config, state, rng),
    outputs=lambda state, inputs: state["ema"],
  )
  gans = [
    Phase(
      name=f"gan_{n}step",
      num_steps=config.gan.steps,
      init=functools.partial(init_gan_state, config),
      step=functools.partial(gan_step, config, n),
      data=lambda inputs: data_source(config, config.gan.batch_size),
      outputs=lambda state, inputs: state["gen"],
    )
    for n in config.gan.generator_steps
  ]
  cache: dict = {}

  def evaluate(state, rng, inputs):
    results, cache["examples"] = benchmark(config, state, rng)
    return results

  def artifacts(state, rng, inputs):
    if "examples" not in cache:
      _, cache["examples"] = benchmark(config, state, rng)
    return {
      "spectrograms": spectrogram_figure(config, cache["examples"]),
      "examples": audio_examples(config, cache["examples"]),
    }

  bench = Phase(
    name="benchmark",
    num_steps=0,
    init=lambda rng, inputs: dict(inputs),
    evaluate=evaluate,
    artifacts=artifacts,
  )
  codec = [codec_phase(config)] if tokens.uses_tokens(config) else []
  return [*codec, flow, *gans, bench]
