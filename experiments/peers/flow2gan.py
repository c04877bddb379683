r"""Flow2GAN two ways: k2-fsa/Flow2GAN's own PyTorch generator, losses and discriminators beside ours
(`methods/flow2gan`), trained on the same procedural speech-like batches at the same sizes and
steps, then scored by the same metric functions on the same test clips.

  pip install -e ".[peers]"
  python experiments/peers/flow2gan.py --official_repo=PATH/TO/Flow2GAN [--seeds=0] \
      [--flow_steps=600] [--gan_steps=80] [--disc_only_steps=20] [--fm_steps=1,2,4] \
      [--json=runs/peers_flow2gan.json]

Run against k2-fsa/Flow2GAN at commit ec5b85de4d286a7f8582112cbe28af63a6d4b5d1. What is taken from
the checkout, unchanged, at run time:
  * `flow2gan/models/generator.py:MelAudioGenerator`: the generator (its `forward` is the
    flow-matching loss: endpoint target, uniform time, noise scale 0.1, the energy-scaled spectral
    loss of `compute_loss`, branch dropout; its `infer` is the Euler sampler), built with the
    default config's sizes (`configs/flow2gan.py`: 8 kHz, mel n_fft 256 / hop 64 / 32 mels, branches
    n_fft 128/64/32, widths 48/32/24, 2 blocks, time embedding 32, 1-block 32-wide mel encoder, loss
    STFT 256/64 with 64 filters) in place of `mel_24k_base`, and its own weight init.
  * `flow2gan/models/modules.py:LogMelSpectrogram`: the condition, computed from the audio as
    `bin/pretrain.py:get_cond_module_and_generator` does.
  * `flow2gan/models/gan.py:GAN`: the discriminator's and generator's GAN losses (hinge, feature
    matching, multi-scale log-mel L1) and the N-step unrolled generator in them, with `bin/finetune.py`'s
    default loss scales (1.0 / 0.1 for MPD / MRD, 45 for the mel loss) and its
    `generator.branch_dropout = 0.0` for fine-tuning.
  * `flow2gan/models/discriminators.py`: `MultiPeriodDiscriminator`, `DiscriminatorP`,
    `MultiResolutionDiscriminator`, `DiscriminatorR` (Vocos's), as the GAN builds them.
What the driver changes from outside (nothing in the checkout is edited):
  1. `torchaudio` is not installed: a stand-in module is put in `sys.modules` with the four pieces the
     checkout uses, written here from torchaudio's definitions: `transforms.Spectrogram` (`torch.stft`,
     periodic Hann, centred reflect padding; complex for `power=None`), `transforms.MelSpectrogram`
     (HTK scale, no normalisation, f_min 0, f_max sr/2), `functional.melscale_fbanks` and
     `functional.linear_fbanks` (triangular filters on linearly spaced bin frequencies).
     `stand_in_filterbanks_match_ours` checks them against `core.audio` at the run's settings.
  2. `torch.utils.tensorboard` (imported by `flow2gan/utils.py`, unused here) is a stub when
     tensorboard is not installed, and the package `flow2gan/__init__.py` (Hugging Face download and
     lhotse checkpoint helpers) is not executed: `flow2gan` is registered as a bare package whose
     path is the checkout's folder, so that only the model modules are imported.
  3. The GAN's discriminators are rebuilt at the default config's scaled-down widths (`gan.periods`,
     `gan.period_channels` 4/8/16/32/32 instead of 32/128/512/1024/1024, `gan.windows` 512/256/128,
     `gan.resolution_channels` 4), the official classes with their convolutions replaced by narrower
     ones of the same kernels, strides and padding, exactly as ours are scaled; the mel loss scales
     are `gan.mel_n_ffts` / `gan.mel_n_mels` (5 scales, 32-512) through `GAN`'s own arguments.
  4. The optimisation is ours on both sides, so that a gap is the model's and losses' and not the
     recipe's: AdamW at `flow.learning_rate` with `flow.warmup_steps` warm-up and cosine decay
     (`core.optim.warmup_cosine` evaluated per step), weight decay 1e-4, global-norm clip
     `flow.grad_clip`, an EMA of the parameters (`flow.ema_decay`) handed to the GAN stage; GAN AdamW
     (`gan.b1`, `gan.b2`, `gan.gen_learning_rate`, clip `gan.grad_clip`) with, per step, one
     discriminator update then (after `gan.disc_only_steps`) one generator update on the same batch.
     The reference's recipe is ScaledAdam + Eden2 with a running-average model, and its fine-tuning
     alternates the two updates on successive batches; neither is used.
Ours runs `methods.flow2gan.phases` (`init_flow_state`, `flow_step`, `init_gan_state`, `gan_step`,
`jitted_generator`) directly on the same config, without the experiment loop's checkpoints.

Both sides take the batches of `phases.data_source` (the same indices per step) and are scored by
`phases.test_set_scores` on the same `--num_test` test clips: mel distance (5-scale log-mel L1),
MR-STFT distance, quiet-bin LSD and silence leakage (dBFS inside the references' exact silences),
for FM at each `--fm_steps` and the GAN generator of `--gan_generator_steps`. Outputs are clamped to
[-1, 1] on both sides. Speed: samples/s of one generator call on the same `--timing_batch` test
clips (condition included on both sides: the log-mel), best of `--timing_repeats` after one warm-up
call; ours jitted (XLA), theirs eager PyTorch under `torch.inference_mode`, in the same process, both
on `--threads` CPU threads (torch's intra- and inter-op threads; XLA:CPU's Eigen pool, off for one
thread). One thread is the default: on a shared 2-core machine two-thread torch spends most of its
time waiting at its thread barriers. The two sides' noise draws differ (jax vs torch generators),
as do their inits.

Both conditions are computed from the same clips; how far the official log-mel (through the
stand-in) is from ours on the test clips is reported (`condition_abs_diff`), as is the largest
difference between the stand-in filterbanks and `core.audio`'s.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
import types

from absl import app, flags, logging

OFFICIAL_MARKER = os.path.join("flow2gan", "models", "generator.py")


def define_flags(flag_values=flags.FLAGS) -> None:
  f = flag_values
  flags.DEFINE_string("official_repo", None, "A checkout of k2-fsa/Flow2GAN.", flag_values=f)
  flags.DEFINE_list("seeds", ["0"], "Seeds: init, batches order, noise.", flag_values=f)
  flags.DEFINE_integer("flow_steps", 600, "Flow-matching steps of each side.", flag_values=f)
  flags.DEFINE_integer("gan_steps", 80, "GAN steps (0: flow matching only).", flag_values=f)
  flags.DEFINE_integer("disc_only_steps", 20, "Discriminator-only GAN steps.", flag_values=f)
  flags.DEFINE_integer(
    "gan_generator_steps", 1, "Sampler steps of the GAN generator.", flag_values=f
  )
  flags.DEFINE_list("fm_steps", ["1", "2", "4"], "FM sampler steps scored.", flag_values=f)
  flags.DEFINE_integer("num_train", 1024, "Procedural training clips.", flag_values=f)
  flags.DEFINE_integer("num_test", 64, "Procedural test clips.", flag_values=f)
  flags.DEFINE_integer("timing_batch", 8, "Clips per timed generator call.", flag_values=f)
  flags.DEFINE_integer("timing_repeats", 3, "Timed calls (best kept).", flag_values=f)
  flags.DEFINE_list("sides", ["official", "ours"], "Which sides to run.", flag_values=f)
  flags.DEFINE_integer("threads", 1, "CPU threads of each side (torch and XLA).", flag_values=f)
  flags.DEFINE_string(
    "json", "runs/peers_flow2gan.json", "Where results go as JSON.", flag_values=f
  )
  flags.DEFINE_list(
    "tabulate", [], "Only tabulate the seeds of these JSON files (no training).", flag_values=f
  )
  flags.mark_flags_as_required(["official_repo"], flag_values=f)


def check_checkout(repo: str) -> str:
  """The checkout's absolute path, or one clear error line naming `--official_repo`."""
  path = os.path.abspath(repo)
  if not os.path.isfile(os.path.join(path, OFFICIAL_MARKER)):
    raise SystemExit(
      f"error: --official_repo: {path} is not a k2-fsa/Flow2GAN checkout (no {OFFICIAL_MARKER})"
    )
  return path


def set_threads(count: int) -> None:
  """The same thread count for both sides: torch's intra-op threads, XLA:CPU's Eigen pool (one
  thread: Eigen off). Call before JAX starts its backend."""
  import torch

  torch.set_num_threads(count)
  torch.set_num_interop_threads(count)
  extra = ["--xla_cpu_multi_thread_eigen=false"] if count == 1 else []
  extra.append(f"intra_op_parallelism_threads={count}")
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *extra]).strip()


def experiment_config(values, seed: int):
  """The default config (`configs/flow2gan.py`) at the driver's steps and sizes."""
  from configs import flow2gan as flow2gan_config

  config = flow2gan_config.get_config()
  config.seed = seed
  config.flow.steps = values.flow_steps
  config.gan.steps = values.gan_steps
  config.gan.disc_only_steps = min(values.disc_only_steps, max(values.gan_steps - 1, 0))
  config.gan.generator_steps = (values.gan_generator_steps,) if values.gan_steps else ()
  config.eval.fm_steps = tuple(int(s) for s in values.fm_steps)
  config.eval.headline_fm_steps = config.eval.fm_steps[-1]
  config.data.num_train = values.num_train
  config.data.num_test = values.num_test
  config.eval.timing_batch = min(values.timing_batch, values.num_test)
  config.eval.timing_repeats = values.timing_repeats
  return config


# ---------------------------------------------------------------------------------------------------
# Stand-ins for what the checkout imports but is not installed (torchaudio, tensorboard)
# ---------------------------------------------------------------------------------------------------


def _torchaudio_stand_in():
  """torchaudio's `Spectrogram`, `MelSpectrogram`, `melscale_fbanks`, `linear_fbanks` (defaults as
  torchaudio's: periodic Hann, centred reflect padding, HTK mel scale, no normalisation)."""
  import torch

  def triangular(all_freqs, f_pts):
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.max(torch.zeros(1), torch.min(down, up))

  def melscale_fbanks(n_freqs, f_min, f_max, n_mels, sample_rate, norm=None, mel_scale="htk"):  # noqa: ARG001
    if norm is not None or mel_scale != "htk":
      raise NotImplementedError("the stand-in has the HTK scale without normalisation only")
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    to_mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)  # noqa: E731
    m_pts = torch.linspace(to_mel(f_min), to_mel(f_max), n_mels + 2)
    f_pts = 700.0 * (10 ** (m_pts / 2595.0) - 1.0)
    return triangular(all_freqs, f_pts)

  def linear_fbanks(n_freqs, f_min, f_max, n_filter, sample_rate):
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    return triangular(all_freqs, torch.linspace(f_min, f_max, n_filter + 2))

  class Spectrogram(torch.nn.Module):
    def __init__(
      self,
      n_fft=400,
      win_length=None,
      hop_length=None,
      pad=0,
      window_fn=torch.hann_window,
      power=2.0,
      normalized=False,
      wkwargs=None,
      center=True,
      pad_mode="reflect",
      onesided=True,
    ):
      super().__init__()
      if pad or normalized:
        raise NotImplementedError("the stand-in has pad=0 and normalized=False only")
      self.n_fft, self.win_length = n_fft, win_length or n_fft
      self.hop_length = hop_length or self.win_length // 2
      self.power, self.center, self.pad_mode, self.onesided = power, center, pad_mode, onesided
      self.register_buffer("window", window_fn(self.win_length, **(wkwargs or {})))

    def forward(self, waveform):
      shape = waveform.shape
      spec = torch.stft(
        waveform.reshape(-1, shape[-1]),
        self.n_fft,
        self.hop_length,
        self.win_length,
        self.window,
        center=self.center,
        pad_mode=self.pad_mode,
        onesided=self.onesided,
        return_complex=True,
      )
      spec = spec.reshape(*shape[:-1], *spec.shape[-2:])
      return spec if self.power is None else spec.abs().pow(self.power)

  class MelSpectrogram(torch.nn.Module):
    def __init__(
      self,
      sample_rate=16000,
      n_fft=400,
      win_length=None,
      hop_length=None,
      f_min=0.0,
      f_max=None,
      n_mels=128,
      power=2.0,
      center=True,
      pad_mode="reflect",
    ):
      super().__init__()
      self.spectrogram = Spectrogram(
        n_fft, win_length, hop_length, power=power, center=center, pad_mode=pad_mode
      )
      fb = melscale_fbanks(n_fft // 2 + 1, f_min, f_max or sample_rate / 2, n_mels, sample_rate)
      self.register_buffer("fb", fb)

    def forward(self, waveform):
      spec = self.spectrogram(waveform)
      return torch.matmul(spec.transpose(-1, -2), self.fb).transpose(-1, -2)

  module = types.ModuleType("torchaudio")
  module.functional = types.ModuleType("torchaudio.functional")
  module.functional.melscale_fbanks = melscale_fbanks
  module.functional.linear_fbanks = linear_fbanks
  module.transforms = types.ModuleType("torchaudio.transforms")
  module.transforms.Spectrogram = Spectrogram
  module.transforms.MelSpectrogram = MelSpectrogram
  return module


def install_stand_ins(repo: str) -> None:
  """Changes 1 and 2 of the module docstring."""
  if importlib.util.find_spec("torchaudio") is None:
    module = _torchaudio_stand_in()
    sys.modules.update(
      {
        "torchaudio": module,
        "torchaudio.functional": module.functional,
        "torchaudio.transforms": module.transforms,
      }
    )
  if importlib.util.find_spec("tensorboard") is None:
    board = types.ModuleType("torch.utils.tensorboard")
    board.SummaryWriter = object
    sys.modules["torch.utils.tensorboard"] = board
  package = types.ModuleType("flow2gan")
  package.__path__ = [os.path.join(repo, "flow2gan")]
  sys.modules["flow2gan"] = package


def stand_in_filterbanks_match_ours(config) -> float:
  """The largest difference between the stand-in filterbanks and `core.audio`'s at the run's
  settings (the condition mel and the loss's linear filters)."""
  import numpy as np
  import torchaudio

  from core import audio

  sr, m, f = config.data.sample_rate, config.mel, config.flow
  mel = torchaudio.functional.melscale_fbanks(m.n_fft // 2 + 1, 0.0, sr / 2, m.n_mels, sr).numpy()
  lin = torchaudio.functional.linear_fbanks(f.loss_n_fft // 2 + 1, 0.0, sr / 2, f.loss_filters, sr)
  return float(
    max(
      np.abs(mel - np.asarray(audio.mel_filterbank(sr, m.n_fft, m.n_mels))).max(),
      np.abs(
        lin.numpy() - np.asarray(audio.linear_filterbank(sr, f.loss_n_fft, f.loss_filters))
      ).max(),
    )
  )


# ---------------------------------------------------------------------------------------------------
# The official side
# ---------------------------------------------------------------------------------------------------


def _our_phases():
  """`methods.flow2gan.phases` (the package exports a function of that name)."""
  import importlib

  return importlib.import_module("methods.flow2gan.phases")


def official_generator(config):
  from flow2gan.models.generator import MelAudioGenerator

  m, f, mel = config.model, config.flow, config.mel
  return MelAudioGenerator(
    n_mels=mel.n_mels,
    mel_n_fft=mel.n_fft,
    mel_hop_length=mel.hop,
    sampling_rate=config.data.sample_rate,
    n_ffts=tuple(m.n_ffts),
    hop_lengths=tuple(m.hops),
    channels=tuple(m.channels),
    time_embed_channels=m.time_dim,
    hidden_factor=m.hidden_factor,
    conv_kernel_sizes=(m.kernel_size,) * len(m.n_ffts),
    num_layers=tuple(m.num_blocks),
    cond_enc_channels=m.cond_channels,
    cond_enc_hidden_factor=m.hidden_factor,
    cond_enc_conv_kernel_size=m.kernel_size,
    cond_enc_num_layers=m.cond_blocks,
    init_noise_scale=f.noise_scale,
    pred_x1=f.prediction == "data",
    spec_scaling_loss=f.spectral_scaling,
    loss_n_filters=f.loss_filters,
    loss_n_fft=f.loss_n_fft,
    loss_hop_length=f.loss_hop,
    loss_power=f.loss_power,
    loss_eps=f.loss_eps,
    loss_scale_min=f.loss_scale_min,
    loss_scale_max=f.loss_scale_max,
    branch_dropout=m.branch_dropout,
  )


def official_condition(config):
  from flow2gan.models.modules import LogMelSpectrogram

  m = config.mel
  return LogMelSpectrogram(config.data.sample_rate, m.n_fft, m.hop, m.n_mels, True, 1)


def _narrow_period(d, channels):
  """`DiscriminatorP`'s five convolutions and `conv_post` at `channels` widths (same kernels)."""
  from torch import nn

  widths = (1, *channels)
  for i, conv in enumerate(d.convs):
    d.convs[i] = nn.Conv2d(
      widths[i], widths[i + 1], conv.kernel_size, conv.stride, padding=conv.padding
    )
  d.conv_post = nn.Conv2d(widths[-1], 1, d.conv_post.kernel_size, 1, padding=d.conv_post.padding)


def official_gan(config, generator):
  """`flow2gan.models.gan.GAN` with its discriminators at the config's widths (change 3)."""
  from flow2gan.models import discriminators as disc
  from flow2gan.models.gan import GAN
  from torch import nn

  g = config.gan
  gan = GAN(generator, tuple(g.mel_n_ffts), tuple(g.mel_n_mels))
  mpd = disc.MultiPeriodDiscriminator(periods=tuple(g.periods))
  for d in mpd.discriminators:
    _narrow_period(d, tuple(g.period_channels))
  mrd = disc.MultiResolutionDiscriminator(fft_sizes=tuple(g.windows))
  mrd.discriminators = nn.ModuleList(
    [disc.DiscriminatorR(window_length=w, channels=g.resolution_channels) for w in g.windows]
  )
  gan.discriminator = nn.ModuleList([mpd, mrd])
  return gan


def _torch_batch(config, source, step: int):
  import torch

  audio = torch.as_tensor(source.batch(step)["audio"], dtype=torch.float32)
  return audio, torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long)


def _clip_and_step(optimizer, params, clip: float, lr: float | None = None):
  import torch

  torch.nn.utils.clip_grad_norm_(params, clip)
  if lr is not None:
    for group in optimizer.param_groups:
      group["lr"] = lr
  optimizer.step()


def official_flow(config, log_every: int = 100):
  """Flow matching of the official generator (change 4's recipe); returns its EMA copy."""
  import copy

  import torch

  from core import optim

  phases = _our_phases()

  f = config.flow
  model, cond_module = official_generator(config), official_condition(config)
  ema = copy.deepcopy(model)
  params = list(model.parameters())
  optimizer = torch.optim.AdamW(params, lr=0.0, weight_decay=1e-4)
  schedule = optim.warmup_cosine(f.learning_rate, f.warmup_steps, f.steps)
  source = phases.data_source(config, f.batch_size)
  model.train()
  for n in range(f.steps):
    audio, lens = _torch_batch(config, source, n)
    loss = model(cond=cond_module(audio), audio=audio, audio_lens=lens)
    optimizer.zero_grad()
    loss.backward()
    _clip_and_step(optimizer, params, f.grad_clip, float(schedule(n)))
    with torch.no_grad():
      for e, p in zip(ema.parameters(), params, strict=True):
        e.mul_(f.ema_decay).add_(p, alpha=1.0 - f.ema_decay)
    if n % log_every == 0 or n == f.steps - 1:
      logging.info("official flow step %d: loss %.4f", n, float(loss))
  return ema, cond_module


def official_gan_stage(config, generator, cond_module, log_every: int = 20):
  """GAN fine-tuning of the official N-step generator through `GAN.forward` (change 4's schedule)."""
  import copy

  import torch

  phases = _our_phases()

  g = config.gan
  n_steps = g.generator_steps[0]
  generator = copy.deepcopy(generator)
  generator.branch_dropout = 0.0  # bin/finetune.py: "disable branch dropout for finetuning"
  gan = official_gan(config, generator)
  gen_params, disc_params = list(generator.parameters()), list(gan.discriminator.parameters())
  betas = (g.b1, g.b2)
  opt_g = torch.optim.AdamW(gen_params, lr=g.gen_learning_rate, betas=betas)
  opt_d = torch.optim.AdamW(disc_params, lr=g.disc_learning_rate, betas=betas)
  w_adv_mpd, w_adv_mrd, w_fm_mpd, w_fm_mrd, w_mel = g.weights
  w_d_mpd, w_d_mrd = g.disc_weights
  source = phases.data_source(config, g.batch_size)
  for n in range(g.steps):
    audio, lens = _torch_batch(config, source, n)
    cond = cond_module(audio)
    d_mpd, d_mrd = gan(cond, audio, lens, n_timesteps=n_steps, train_disc=True)
    loss_d = w_d_mpd * d_mpd + w_d_mrd * d_mrd
    opt_d.zero_grad()
    loss_d.backward()
    _clip_and_step(opt_d, disc_params, g.grad_clip)
    if n >= g.disc_only_steps:
      adv_mpd, adv_mrd, fm_mpd, fm_mrd, mel = gan(
        cond, audio, lens, n_timesteps=n_steps, train_disc=False
      )
      loss_g = w_adv_mpd * adv_mpd + w_adv_mrd * adv_mrd + w_fm_mpd * fm_mpd
      loss_g = loss_g + w_fm_mrd * fm_mrd + w_mel * mel
      opt_g.zero_grad()
      loss_g.backward()
      _clip_and_step(opt_g, gen_params, g.grad_clip)
      if n % log_every == 0 or n == g.steps - 1:
        logging.info("official gan step %d: D %.3f, G %.3f (mel %.3f)", n, loss_d, loss_g, mel)
  generator.eval()
  return generator


def official_outputs(config, generator, cond_fn, num_steps: int, seed: int):
  """The official sampler on the test clips (clamped), `eval.batch_size` at a time."""
  import numpy as np
  import torch

  phases = _our_phases()

  generator.eval()
  torch.manual_seed(seed)
  data = phases.test_arrays(config)["audio"]
  outs = []
  with torch.inference_mode():
    for start in range(0, len(data), config.eval.batch_size):
      audio = torch.as_tensor(data[start : start + config.eval.batch_size])
      lens = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long)
      out = generator.infer(cond_fn(audio), lens, n_timesteps=num_steps, clamp_pred=True)
      outs.append(out.numpy())
  return np.concatenate(outs)


def official_speed(config, generator, cond_module, num_steps: int) -> float:
  import torch

  phases = _our_phases()

  e = config.eval
  audio = torch.as_tensor(phases.test_arrays(config)["audio"][: e.timing_batch])
  lens = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long)

  def call():
    generator.infer(cond_module(audio), lens, n_timesteps=num_steps, clamp_pred=True)

  with torch.inference_mode():
    call()
    best = float("inf")
    for _ in range(e.timing_repeats):
      start = time.perf_counter()
      call()
      best = min(best, time.perf_counter() - start)
  return audio.numel() / best


def condition_difference(config, cond_module) -> dict[str, float]:
  """How far the official log-mel (through the stand-in) is from ours (`phases.mel_features`) on the
  test clips: the mean and largest absolute difference, and the largest over bins whose mel
  magnitude is above 1e-3 (below it float32 rounding is magnified by the log)."""
  import numpy as np
  import torch

  phases = _our_phases()
  data = phases.test_arrays(config)["audio"]
  with torch.inference_mode():
    theirs = cond_module(torch.as_tensor(data)).numpy().transpose(0, 2, 1)
  ours = np.asarray(phases.mel_features(config, data))
  diff = np.abs(theirs - ours)
  return {
    "mean": float(diff.mean()),
    "max": float(diff.max()),
    "max_above_1e-3": float(diff[ours > np.log(1e-3)].max()),
  }


def run_official(config, seed: int) -> dict:
  import torch

  phases = _our_phases()

  torch.manual_seed(seed)
  start = time.process_time()
  ema, cond_module = official_flow(config)
  generators = {f"fm_{n}step": (ema, n) for n in config.eval.fm_steps}
  if config.gan.generator_steps:
    n = config.gan.generator_steps[0]
    generators[f"gan_{n}step"] = (official_gan_stage(config, ema, cond_module), n)
  train_cpu = time.process_time() - start
  result = {"train_cpu_s": train_cpu, "generators": {}}
  result["condition_abs_diff"] = condition_difference(config, cond_module)
  for name, (model, n) in generators.items():
    outputs = official_outputs(config, model, cond_module, n, seed)
    scores = phases.test_set_scores(config, outputs)
    scores["samples_per_second"] = official_speed(config, model, cond_module, n)
    result["generators"][name] = scores
    logging.info("official %s: %s", name, json.dumps(scores))
  result["parameters"] = sum(p.numel() for p in ema.parameters())
  return result


# ---------------------------------------------------------------------------------------------------
# Ours
# ---------------------------------------------------------------------------------------------------


def run_ours(config, seed: int) -> dict:
  import jax

  phases = _our_phases()

  key = jax.random.key(seed)
  start = time.process_time()
  flow_step = jax.jit(lambda s, b, r: phases.flow_step(config, s, b, r))
  state = phases.init_flow_state(config, jax.random.fold_in(key, 0))
  source = phases.data_source(config, config.flow.batch_size)
  for n in range(config.flow.steps):
    state, metrics = flow_step(state, source.batch(n), jax.random.fold_in(key, 1000 + n))
    if n % 100 == 0 or n == config.flow.steps - 1:
      logging.info("ours flow step %d: loss %.4f", n, float(metrics["loss"]))
  params = {"flow": state["ema"]}
  for n_gen in config.gan.generator_steps:
    gan = phases.init_gan_state(config, jax.random.fold_in(key, 1), {"flow": params["flow"]})
    step = jax.jit(lambda s, b, r, k=n_gen: phases.gan_step(config, k, s, b, r))
    source = phases.data_source(config, config.gan.batch_size)
    for n in range(config.gan.steps):
      gan, metrics = step(gan, source.batch(n), jax.random.fold_in(key, 100_000 + n))
      if n % 20 == 0 or n == config.gan.steps - 1:
        logging.info("ours gan step %d: D %.3f", n, float(metrics["disc_loss"]))
    params[f"gan_{n_gen}step"] = gan["gen"]
  train_cpu = time.process_time() - start
  result = {"train_cpu_s": train_cpu, "generators": {}}
  for name, phase, n in phases.generators(config):
    scores, _ = phases.quality(config, params[phase], n, jax.random.fold_in(key, 7))
    scores["samples_per_second"] = phases.speed(config, params[phase], n)["samples_per_second"]
    result["generators"][name] = scores
    logging.info("ours %s: %s", name, json.dumps(scores))
  result["parameters"] = int(sum(x.size for x in jax.tree.leaves(params["flow"])))
  return result


# ---------------------------------------------------------------------------------------------------
# All seeds, the table
# ---------------------------------------------------------------------------------------------------


METRICS = (
  ("mel_distance", "mel distance"),
  ("silence_leakage_dbfs", "silence leakage (dBFS)"),
  ("quiet_bin_lsd", "quiet-bin LSD (dB)"),
  ("mr_stft_distance", "MR-STFT distance"),
)


def markdown(seeds: list[dict]) -> str:
  from methods.base import t_interval_cell

  def interval(values):
    return t_interval_cell(values, digits=2)

  sides = [s for s in ("official", "ours") if s in seeds[0]]
  names = list(seeds[0][sides[0]]["generators"])
  lines = [
    f"{len(seeds)} seed(s); mean ± 95% t-interval over seeds where more than one",
    "",
    "| generator | side | " + " | ".join(label for _, label in METRICS) + " | samples/s |",
    "|---|---|" + "---|" * (len(METRICS) + 1),
  ]
  for name in names:
    for side in sides:
      rows = [s[side]["generators"][name] for s in seeds]
      cells = [interval([r[k] for r in rows]) for k, _ in METRICS]
      speed = interval([r["samples_per_second"] / 1000 for r in rows]) + "k"
      lines.append(f"| {name} | {side} | " + " | ".join(cells) + f" | {speed} |")
  if len(sides) == 2:
    lines += ["", "| generator | speed ratio ours / official |", "|---|---|"]
    for name in names:
      ratios = [
        s["ours"]["generators"][name]["samples_per_second"]
        / s["official"]["generators"][name]["samples_per_second"]
        for s in seeds
      ]
      lines.append(f"| {name} | {interval(ratios)} |")
  return "\n".join(lines)


def checkout_commit(repo: str) -> str:
  import subprocess

  try:
    out = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
  except OSError:
    return "unknown"
  return out.stdout.strip() or "unknown"


def tabulate(paths: list[str]) -> str:
  seeds = []
  for path in paths:
    with open(path) as f:
      seeds += json.load(f)["seeds"]
  return markdown(seeds)


def main(argv):
  del argv
  values = flags.FLAGS
  repo = check_checkout(values.official_repo)
  if values.tabulate:
    print(tabulate(values.tabulate))
    return
  set_threads(values.threads)
  from experiments import runtime

  runtime.setup()
  install_stand_ins(repo)
  seeds = []
  for seed in (int(s) for s in values.seeds):
    config = experiment_config(values, seed)
    result = {"seed": seed}
    if "official" in values.sides:
      result["stand_in_filterbank_max_abs_diff"] = stand_in_filterbanks_match_ours(config)
      result["official"] = run_official(config, seed)
    if "ours" in values.sides:
      result["ours"] = run_ours(config, seed)
    seeds.append(result)
  table = markdown(seeds)
  print(table)
  if values.json:
    os.makedirs(os.path.dirname(values.json) or ".", exist_ok=True)
    names = ("flow_steps", "gan_steps", "disc_only_steps", "num_train", "num_test", "threads")
    settings = {k: getattr(values, k) for k in names}
    settings.update(official_commit=checkout_commit(repo), argv=sys.argv)
    with open(values.json, "w") as f:
      json.dump({"seeds": seeds, "markdown": table, "settings": settings}, f, indent=2)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  define_flags()
  app.run(main)
