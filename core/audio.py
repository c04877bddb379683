"""Audio signal processing in JAX: STFT/ISTFT, mel and linear filterbanks, spectral losses and the
audio metrics of Flow2GAN ("Flow2GAN: Hybrid Flow Matching and GAN with Multi-Resolution Network for
Few-step Audio Generation", ICLR 2026; official code k2-fsa/Flow2GAN).

Conventions follow `torch.stft` / `torch.istft` as the official code calls them (`flow2gan/models/
modules.py`: `STFT`, `ISTFT`): periodic Hann window of length `n_fft`, `center=True` with reflect
padding of `n_fft // 2`, `1 + T // hop` frames, one-sided unnormalised FFT; the inverse overlap-adds
the windowed inverse FFTs, divides by the overlap-added squared window and trims the centre padding,
giving `hop * (frames - 1)` samples. Signals are `(..., T)`; spectrograms are `(..., frames, bins)`
(time before frequency, the channels-last layout of the Flax networks).

- `stft`, `istft`: the transform pair (perfect reconstruction for `n_fft % hop == 0`, `hop <= n_fft/2`).
- `hz_to_mel`, `mel_to_hz`, `triangular_filterbank`, `mel_filterbank`, `linear_filterbank`: the
  filterbanks of torchaudio's `melscale_fbanks` (HTK or Slaney scale, optional Slaney area
  normalisation) and `linear_fbanks`, as `(bins, filters)` matrices.
- `mel_spectrogram`, `log_mel`: magnitude (power 1) mel spectrogram and `log(clamp(., 1e-7))`, the
  conditioning of the reference (`LogMelSpectrogram`).
- `filterbank_power`: `|STFT|^2` through a filterbank (`LinearFilterSpectrogram`).
- `energy_scaled_spectral_loss`: Flow2GAN's loss scaling (Sec. 3.1; `BaseAudioGenerator.compute_loss`).
- `multi_scale_mel_l1` (the GAN stage's mel reconstruction loss and the mel distance metric),
  `multi_resolution_stft_distance`, `silence_leakage_dbfs`, `quiet_bin_lsd`: losses and metrics.
- `pesq_wideband`: PESQ (ITU-T P.862.2, wideband) through the optional `pesq` package, after
  resampling to 16 kHz; `PESQ_AVAILABLE` says whether the package is installed.

Choices where the paper is open: `quiet_bin_lsd` floors both spectra at `floor_db` below the reference
segment's maximum bin, so that digital silence counts as a finite level and the metric stays finite.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np

LOG_EPS = 1e-7  # the reference's safe_log clamp


# ---------------------------------------------------------------------------------------------------
# STFT / ISTFT
# ---------------------------------------------------------------------------------------------------


def hann_window(n: int) -> jax.Array:
  """The periodic Hann window of `torch.hann_window(n)` (and `scipy.signal.get_window("hann", n)`)."""
  return jnp.asarray(0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n), jnp.float32)


def num_frames(length: int, hop: int) -> int:
  """Frames of a centred STFT of `length` samples."""
  return 1 + length // hop


def _check_hop(n_fft: int, hop: int) -> None:
  if n_fft % hop or hop > n_fft // 2:
    raise ValueError(f"need n_fft % hop == 0 and hop <= n_fft / 2, got n_fft={n_fft}, hop={hop}")


def frame_signal(x: jax.Array, n_fft: int, hop: int) -> jax.Array:
  """`(..., T) -> (..., 1 + T // hop, n_fft)` frames of the reflect-padded signal.

  Frames are assembled from `n_fft / hop` shifted views of hop-sized blocks (slices, not a gather),
  which keeps the backward pass a sum of pads rather than a scatter.
  """
  _check_hop(n_fft, hop)
  pad = n_fft // 2
  if x.shape[-1] <= pad:
    raise ValueError(f"signal of {x.shape[-1]} samples is too short for reflect padding of {pad}")
  frames = num_frames(x.shape[-1], hop)
  ratio = n_fft // hop
  x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
  blocks = -(-x.shape[-1] // hop)
  x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, blocks * hop - x.shape[-1])])
  x = x.reshape(*x.shape[:-1], blocks, hop)
  return jnp.concatenate([x[..., k : k + frames, :] for k in range(ratio)], axis=-1)


def stft(x: jax.Array, n_fft: int, hop: int) -> jax.Array:
  """Complex one-sided STFT `(..., T) -> (..., 1 + T // hop, n_fft // 2 + 1)` (torch conventions)."""
  return jnp.fft.rfft(frame_signal(x, n_fft, hop) * hann_window(n_fft), axis=-1)


def overlap_add(frames: jax.Array, hop: int) -> jax.Array:
  """`(..., F, n_fft) -> (..., hop * (F - 1) + n_fft)`: frame `f` added at offset `f * hop`."""
  n_fft = frames.shape[-1]
  ratio, count = n_fft // hop, frames.shape[-2]
  chunks = frames.reshape(*frames.shape[:-1], ratio, hop)
  lead = [(0, 0)] * (frames.ndim - 2)
  total = sum(jnp.pad(chunks[..., k, :], lead + [(k, ratio - 1 - k), (0, 0)]) for k in range(ratio))
  return total.reshape(*frames.shape[:-2], (count + ratio - 1) * hop)


def istft(spec: jax.Array, n_fft: int, hop: int, length: int | None = None) -> jax.Array:
  """Inverse of `stft`: `(..., F, n_fft // 2 + 1) -> (..., hop * (F - 1))`, then zero-padded or cut to
  `length` when given (the reference's `convert_length`)."""
  _check_hop(n_fft, hop)
  window = hann_window(n_fft)
  frames = jnp.fft.irfft(spec, n=n_fft, axis=-1) * window
  signal = overlap_add(frames, hop)
  envelope = overlap_add(jnp.broadcast_to(jnp.square(window), (spec.shape[-2], n_fft)), hop)
  pad = n_fft // 2
  end = signal.shape[-1] - pad
  signal = signal[..., pad:end] / jnp.maximum(envelope[pad:end], 1e-11)
  return signal if length is None else fit_length(signal, length)


def fit_length(x: jax.Array, length: int) -> jax.Array:
  """Cuts or zero-pads the last axis to `length`."""
  if x.shape[-1] >= length:
    return x[..., :length]
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, length - x.shape[-1])])


# ---------------------------------------------------------------------------------------------------
# Filterbanks
# ---------------------------------------------------------------------------------------------------

MEL_SCALES = ("htk", "slaney")


def hz_to_mel(f, scale: str = "htk"):
  """HTK `2595 log10(1 + f / 700)`, or Slaney: linear `3 f / 200` below 1 kHz, logarithmic above
  with 27 mels per factor 6.4 (`librosa.hz_to_mel(htk=False)`)."""
  f = np.asarray(f, np.float64)
  if scale == "htk":
    return 2595.0 * np.log10(1.0 + f / 700.0)
  logstep = math.log(6.4) / 27.0
  linear = f / (200.0 / 3.0)
  return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / logstep, linear)


def mel_to_hz(m, scale: str = "htk"):
  """Inverse of `hz_to_mel`."""
  m = np.asarray(m, np.float64)
  if scale == "htk":
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
  logstep = math.log(6.4) / 27.0
  return np.where(m >= 15.0, 1000.0 * np.exp(logstep * (m - 15.0)), m * 200.0 / 3.0)


def triangular_filterbank(bin_freqs: np.ndarray, corner_freqs: np.ndarray) -> np.ndarray:
  """`(bins, filters)` triangles: filter `j` rises from `corner[j]` to 1 at `corner[j + 1]` and falls
  to 0 at `corner[j + 2]` (torchaudio's `_create_triangular_filterbank`)."""
  widths = np.diff(corner_freqs)
  slopes = corner_freqs[None, :] - bin_freqs[:, None]
  down = -slopes[:, :-2] / widths[:-1]
  up = slopes[:, 2:] / widths[1:]
  return np.maximum(0.0, np.minimum(down, up))


def fft_bin_freqs(n_fft: int, sample_rate: int) -> np.ndarray:
  return np.linspace(0.0, sample_rate // 2, n_fft // 2 + 1)


@functools.lru_cache(maxsize=64)
def mel_filterbank(
  sample_rate: int,
  n_fft: int,
  n_mels: int,
  f_min: float = 0.0,
  f_max: float | None = None,
  scale: str = "htk",
  slaney_norm: bool = False,
) -> np.ndarray:
  """`(n_fft // 2 + 1, n_mels)` float32 mel filterbank (torchaudio `melscale_fbanks`; its defaults,
  HTK without normalisation, are the reference's conditioning). `slaney_norm` scales filter `j` by
  `2 / (f[j + 2] - f[j])`, so each triangle has unit area in Hz."""
  if scale not in MEL_SCALES:
    raise ValueError(f"scale must be one of {MEL_SCALES}, got {scale!r}")
  f_max = float(sample_rate // 2) if f_max is None else f_max
  mels = np.linspace(hz_to_mel(f_min, scale), hz_to_mel(f_max, scale), n_mels + 2)
  corners = mel_to_hz(mels, scale)
  bank = triangular_filterbank(fft_bin_freqs(n_fft, sample_rate), corners)
  if slaney_norm:
    bank = bank * (2.0 / (corners[2:] - corners[:-2]))[None, :]
  return bank.astype(np.float32)


@functools.lru_cache(maxsize=64)
def linear_filterbank(
  sample_rate: int, n_fft: int, n_filters: int, f_min: float = 0.0, f_max: float | None = None
) -> np.ndarray:
  """`(n_fft // 2 + 1, n_filters)` triangles with corners evenly spaced in Hz (torchaudio
  `linear_fbanks`), the filterbank of Flow2GAN's loss scaling."""
  f_max = float(sample_rate // 2) if f_max is None else f_max
  corners = np.linspace(f_min, f_max, n_filters + 2)
  return triangular_filterbank(fft_bin_freqs(n_fft, sample_rate), corners).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Spectrograms
# ---------------------------------------------------------------------------------------------------


def mel_spectrogram(x: jax.Array, sample_rate: int, n_fft: int, hop: int, n_mels: int) -> jax.Array:
  """`(..., T) -> (..., frames, n_mels)` magnitude (power 1) mel spectrogram."""
  magnitude = jnp.abs(stft(x, n_fft, hop))
  return magnitude @ jnp.asarray(mel_filterbank(sample_rate, n_fft, n_mels))


def log_mel(x: jax.Array, sample_rate: int, n_fft: int, hop: int, n_mels: int) -> jax.Array:
  """`log(clamp(mel, 1e-7))`: Flow2GAN's conditioning features (`LogMelSpectrogram`)."""
  return jnp.log(jnp.maximum(mel_spectrogram(x, sample_rate, n_fft, hop, n_mels), LOG_EPS))


def filterbank_power(x: jax.Array, bank: jax.Array, n_fft: int, hop: int) -> jax.Array:
  """`|STFT(x)|^2 @ bank`: `(..., T) -> (..., frames, filters)` (`LinearFilterSpectrogram`, power 2)."""
  spec = stft(x, n_fft, hop)
  return (jnp.square(spec.real) + jnp.square(spec.imag)) @ bank


# ---------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------


def energy_scaled_spectral_loss(
  error: jax.Array,
  reference: jax.Array,
  bank: jax.Array,
  n_fft: int,
  hop: int,
  power: float = 0.5,
  eps: float = 1e-7,
  scale_min: float = 1e-2,
  scale_max: float = 1e2,
) -> jax.Array:
  """Flow2GAN's spectral-energy loss scaling (Sec. 3.1; `BaseAudioGenerator.compute_loss`).

  `S(y) = |STFT(y)|^2 @ bank`; the loss is the mean over batch, frames and filters of
  `S(error) * clamp((S(reference) + eps)^-power, scale_min, scale_max)`: the error's energy in each
  time-frequency cell, weighted up where the target is quiet (power 0.5 sits between no correction,
  0, and full level invariance, 1). `error` and `reference` are `(B, T)` of full length (no padding).
  """
  error_power = filterbank_power(error, bank, n_fft, hop)
  target_power = filterbank_power(jax.lax.stop_gradient(reference), bank, n_fft, hop)
  scale = jnp.clip(jnp.power(target_power + eps, -power), scale_min, scale_max)
  return jnp.mean(error_power * scale)


def multi_scale_mel_l1(
  real: jax.Array,
  fake: jax.Array,
  sample_rate: int,
  n_ffts: tuple[int, ...],
  n_mels: tuple[int, ...],
) -> jax.Array:
  """Sum over scales of the mean `|log mel(real) - log mel(fake)|`, hop `n_fft / 4` (the GAN stage's
  mel reconstruction loss, `GAN.mel_recon_loss`); also the study's mel distance."""
  total = 0.0
  for n_fft, mels in zip(n_ffts, n_mels, strict=True):
    a = log_mel(real, sample_rate, n_fft, n_fft // 4, mels)
    b = log_mel(fake, sample_rate, n_fft, n_fft // 4, mels)
    total = total + jnp.mean(jnp.abs(a - b))
  return total


def multi_resolution_stft_distance(
  real: jax.Array, fake: jax.Array, n_ffts: tuple[int, ...]
) -> jax.Array:
  """Mean over resolutions (hop `n_fft / 4`) of spectral convergence `||S_r - S_f||_F / ||S_r||_F`
  plus mean `|log S_r - log S_f|` of the magnitudes (Yamamoto et al. 2020, Parallel WaveGAN Eq. 4-5)."""
  total = 0.0
  for n_fft in n_ffts:
    a = jnp.abs(stft(real, n_fft, n_fft // 4))
    b = jnp.abs(stft(fake, n_fft, n_fft // 4))
    convergence = jnp.sqrt(jnp.sum(jnp.square(a - b), (-2, -1))) / jnp.maximum(
      jnp.sqrt(jnp.sum(jnp.square(a), (-2, -1))), 1e-7
    )
    log_distance = jnp.mean(jnp.abs(jnp.log(a + 1e-7) - jnp.log(b + 1e-7)), (-2, -1))
    total = total + jnp.mean(convergence + log_distance)
  return total / len(n_ffts)


# ---------------------------------------------------------------------------------------------------
# Metrics of the regimes Flow2GAN's flow-matching changes target
# ---------------------------------------------------------------------------------------------------


def silence_leakage_dbfs(fake: jax.Array, silence: jax.Array) -> jax.Array:
  """RMS level in dBFS of `fake` over the samples where `silence` (the reference is digital zero),
  pooled over the batch; NaN when there is no silence. -200 dBFS is digital silence."""
  silence = silence.astype(fake.dtype)
  energy = jnp.sum(jnp.square(fake) * silence) / jnp.sum(silence)
  return 10.0 * jnp.log10(jnp.maximum(energy, 1e-20))


def quiet_bin_lsd(
  real: jax.Array,
  fake: jax.Array,
  n_fft: int,
  hop: int,
  threshold_db: float = -40.0,
  floor_db: float = -80.0,
) -> jax.Array:
  """Log-spectral distance (dB, RMS over bins) on the time-frequency bins where the reference power
  is below `threshold_db` relative to its segment's loudest bin; both spectra are floored at
  `floor_db` relative to that maximum."""
  p_real = jnp.square(jnp.abs(stft(real, n_fft, hop)))
  p_fake = jnp.square(jnp.abs(stft(fake, n_fft, hop)))
  peak = jnp.max(p_real, axis=(-2, -1), keepdims=True) + 1e-20
  floor = 10.0 ** (floor_db / 10.0)
  db_real = 10.0 * jnp.log10(jnp.maximum(p_real / peak, floor))
  db_fake = 10.0 * jnp.log10(jnp.maximum(p_fake / peak, floor))
  quiet = (db_real < threshold_db).astype(p_real.dtype)
  return jnp.sqrt(jnp.sum(jnp.square(db_real - db_fake) * quiet) / jnp.maximum(jnp.sum(quiet), 1.0))


# ---------------------------------------------------------------------------------------------------
# PESQ (optional package)
# ---------------------------------------------------------------------------------------------------

PESQ_AVAILABLE = importlib.util.find_spec("pesq") is not None
PESQ_RATE = 16_000  # P.862.2 wideband PESQ is defined at 16 kHz


def resample(x: np.ndarray, sample_rate: int, target_rate: int) -> np.ndarray:
  """Polyphase resampling (`scipy.signal.resample_poly`, Kaiser-windowed low-pass) of `(..., T)`."""
  from scipy import signal

  if sample_rate == target_rate:
    return np.asarray(x, np.float64)
  g = math.gcd(sample_rate, target_rate)
  return signal.resample_poly(
    np.asarray(x, np.float64), target_rate // g, sample_rate // g, axis=-1
  )


def pesq_wideband(reference: np.ndarray, degraded: np.ndarray, sample_rate: int) -> np.ndarray:
  """Wideband PESQ (MOS-LQO, about 1.04-4.64) of each `(T,)` row of `degraded` against `reference`
  (both `(..., T)` at `sample_rate`), both resampled to 16 kHz first, as the paper scores its 24 kHz
  LibriTTS output. NaN where PESQ finds no utterance or the segment is too short (the package's error
  codes). Needs the optional `pesq` package (`PESQ_AVAILABLE`); it runs on the CPU, one row at a time.

  Below 16 kHz (the 8 kHz CPU-scale data) the upsampled signals have no content above the original
  Nyquist frequency, so the score rates the band that exists; PESQ is also calibrated on speech, so
  on procedural audio it is a relative measure between generators, not a listening-test proxy.
  """
  from pesq import PesqError, pesq

  ref = resample(reference, sample_rate, PESQ_RATE).astype(np.float32)
  deg = resample(degraded, sample_rate, PESQ_RATE).astype(np.float32)
  if ref.shape != deg.shape:
    raise ValueError(f"reference {ref.shape} and degraded {deg.shape} differ in shape")
  flat_ref, flat_deg = ref.reshape(-1, ref.shape[-1]), deg.reshape(-1, deg.shape[-1])
  scores = [
    pesq(PESQ_RATE, r, d, "wb", on_error=PesqError.RETURN_VALUES)
    for r, d in zip(flat_ref, flat_deg, strict=True)
  ]
  scores = np.asarray(scores, np.float64)
  return np.where(scores < 0, np.nan, scores).reshape(ref.shape[:-1])
