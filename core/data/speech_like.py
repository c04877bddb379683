"""Speech-like audio for small-scale vocoder experiments, and LibriTTS crops for paper scale.

Procedural data (numpy and scipy, a pure function of `(seed, index)`): each segment concatenates
events of four kinds, the regimes Flow2GAN's flow-matching changes target ("Flow2GAN", ICLR 2026,
Sec. 3.1: silent regions and quiet bands, where a velocity target is pure noise cancellation):

- voiced tones: f0 80-300 Hz with a glide and vibrato, harmonics up to Nyquist with 1/h tilt, shaped
  by 2-3 formant resonances (two-pole resonators), under an attack-decay-sustain-release envelope;
- unvoiced bursts: band-passed white noise under a short envelope;
- exact digital silence of 40-150 ms (at least one per segment; at most a third of it);
  every segment also has at least one loud (voiced or unvoiced) event;
- quiet passages: a voiced or unvoiced event 30-45 dB below the segment's loud events.

Each segment is peak-normalised to a random level in [-6, -1] dBFS (the reference's training gain).
`segments` returns the audio and a mask of the exactly silent samples (for the silence-leakage metric).

LibriTTS (the paper's data) is read from a prepared tfds folder (`tfds build libritts
--file_format=array_record`), never downloaded: `libritts_source` crops a deterministic window of
each utterance and peak-normalises it the same way.
"""

from __future__ import annotations

import numpy as np
from scipy import signal

EVENT_KINDS = ("voiced", "unvoiced", "silence", "quiet")


def _envelope(rng, length: int, sample_rate: int) -> np.ndarray:
  """Attack 5-30 ms, decay 20-60 ms to a sustain of 0.6-0.9, release 10-50 ms (all cut to fit)."""
  ms = sample_rate / 1000.0
  attack = min(int(rng.uniform(5, 30) * ms), length // 4)
  decay = min(int(rng.uniform(20, 60) * ms), length // 4)
  release = min(int(rng.uniform(10, 50) * ms), length // 4)
  sustain_level = rng.uniform(0.6, 0.9)
  sustain = max(length - attack - decay - release, 0)
  env = np.concatenate(
    [
      np.linspace(0.0, 1.0, attack, endpoint=False),
      np.linspace(1.0, sustain_level, decay, endpoint=False),
      np.full(sustain, sustain_level),
      np.linspace(sustain_level, 0.0, release),
    ]
  )
  return np.pad(env, (0, length - len(env)))[:length]


def _resonator(x: np.ndarray, freq: float, bandwidth: float, sample_rate: int) -> np.ndarray:
  """A two-pole resonance at `freq` Hz of `bandwidth` Hz (a formant)."""
  r = np.exp(-np.pi * bandwidth / sample_rate)
  a = [1.0, -2.0 * r * np.cos(2.0 * np.pi * freq / sample_rate), r * r]
  return signal.lfilter([1.0 - r], a, x)


def voiced(rng, length: int, sample_rate: int) -> np.ndarray:
  """A harmonic tone with glide, vibrato, 1/h tilt, 2-3 formants and an ADSR envelope (peak 1)."""
  nyquist = sample_rate / 2.0
  t = np.arange(length) / sample_rate
  f_start = rng.uniform(80.0, 300.0)
  f_end = f_start * rng.uniform(0.8, 1.25)
  vibrato = 1.0 + rng.uniform(0.005, 0.03) * np.sin(2 * np.pi * rng.uniform(4.0, 7.0) * t)
  f0 = np.linspace(f_start, f_end, length) * vibrato
  phase = 2.0 * np.pi * np.cumsum(f0) / sample_rate
  tone = np.zeros(length)
  for h in range(1, int(nyquist / 80.0) + 1):
    below = (h * f0 < 0.95 * nyquist).astype(np.float64)
    tone += below * np.sin(h * phase) / h
  shaped = np.zeros(length)
  for _ in range(rng.integers(2, 4)):
    freq = rng.uniform(300.0, 0.8 * nyquist)
    shaped += _resonator(tone, freq, rng.uniform(60.0, 200.0), sample_rate) * rng.uniform(0.5, 1.0)
  out = shaped * _envelope(rng, length, sample_rate)
  return out / (np.max(np.abs(out)) + 1e-12)


def unvoiced(rng, length: int, sample_rate: int) -> np.ndarray:
  """Band-passed white noise (a fricative or burst) under a short envelope (peak 1)."""
  nyquist = sample_rate / 2.0
  low = rng.uniform(0.15, 0.5) * nyquist
  high = min(low * rng.uniform(1.5, 2.5), 0.95 * nyquist)
  sos = signal.butter(4, [low, high], btype="bandpass", fs=sample_rate, output="sos")
  out = signal.sosfilt(sos, rng.standard_normal(length)) * _envelope(rng, length, sample_rate)
  return out / (np.max(np.abs(out)) + 1e-12)


def _event_lengths(rng, length: int, sample_rate: int, min_events: int, max_events: int):
  """Kinds and lengths of the events of one segment; one silence of 40-150 ms is always among them."""
  count = int(rng.integers(min_events, max_events + 1))
  silence = min(int(rng.uniform(0.04, 0.15) * sample_rate), length // 3)
  others = rng.choice(["voiced", "voiced", "unvoiced", "quiet", "silence"], size=count - 1)
  others[0] = rng.choice(["voiced", "unvoiced"])  # at least one loud event
  weights = rng.uniform(0.5, 1.5, size=count - 1)
  rest = length - silence
  lengths = np.floor(weights / weights.sum() * rest).astype(int)
  lengths[-1] += rest - lengths.sum()
  lengths = np.where(others == "silence", np.minimum(lengths, silence), lengths)
  kinds = ["silence", *others.tolist()]
  lengths = [silence, *lengths.tolist()]
  order = rng.permutation(count)
  kinds, lengths = [kinds[i] for i in order], [lengths[i] for i in order]
  sounding = [i for i, k in enumerate(kinds) if k != "silence"] or [count - 1]
  lengths[sounding[0]] += length - sum(lengths)
  return kinds, lengths


def segment(
  seed: int, index: int, length: int, sample_rate: int, min_events: int = 3, max_events: int = 6
) -> tuple[np.ndarray, np.ndarray]:
  """One segment `(audio float32 (length,), silence bool (length,))`, a pure function of the seed and
  index."""
  rng = np.random.default_rng([seed, index])
  kinds, lengths = _event_lengths(rng, length, sample_rate, min_events, max_events)
  pieces, quiet = [], []
  for kind, n in zip(kinds, lengths, strict=True):
    if kind == "silence" or n < 16:
      pieces.append(np.zeros(n))
      quiet.append(False)
      continue
    source = voiced if kind == "voiced" or (kind == "quiet" and rng.random() < 0.5) else unvoiced
    pieces.append(source(rng, n, sample_rate))
    quiet.append(kind == "quiet")
  loud_peak = max([np.max(np.abs(p)) for p, q in zip(pieces, quiet, strict=True) if not q] + [1.0])
  for i, is_quiet in enumerate(quiet):
    if is_quiet:
      pieces[i] = pieces[i] * loud_peak * 10.0 ** (-rng.uniform(30.0, 45.0) / 20.0)
  audio = np.concatenate(pieces)
  peak = np.max(np.abs(audio))
  if peak > 0:
    audio = audio / peak * 10.0 ** (rng.uniform(-6.0, -1.0) / 20.0)
  silence = np.concatenate(
    [np.full(n, k == "silence" or n < 16) for k, n in zip(kinds, lengths, strict=True)]
  )
  return audio.astype(np.float32), silence


def segments(seed: int, start: int, count: int, length: int, sample_rate: int, **kwargs) -> dict:
  """`{"audio": (count, length) float32, "silence": (count, length) bool}` for indices
  `start .. start + count - 1`."""
  pairs = [segment(seed, start + i, length, sample_rate, **kwargs) for i in range(count)]
  return {
    "audio": np.stack([a for a, _ in pairs]),
    "silence": np.stack([s for _, s in pairs]),
  }


# ---------------------------------------------------------------------------------------------------
# LibriTTS (paper scale) through tfds
# ---------------------------------------------------------------------------------------------------

LIBRITTS = "libritts"
LIBRITTS_RATE = 24_000


def libritts_source(split: str, data_dir: str):
  """A random-access tfds source of LibriTTS utterances (`{"speech": int16-valued samples, ...}`);
  reads a prepared array_record folder and never downloads."""
  import tensorflow_datasets as tfds

  return tfds.data_source(LIBRITTS, split=split, data_dir=data_dir, download=False)


def crop_record(record: dict, seed: int, index: int, length: int) -> dict[str, np.ndarray]:
  """A deterministic `length`-sample window of one utterance (zero-padded when shorter), scaled from
  16-bit integers and peak-normalised to [-6, -1] dBFS; `silence` marks exact zeros (padding)."""
  rng = np.random.default_rng([seed, index])
  speech = np.asarray(record["speech"], np.float32)
  if np.issubdtype(np.asarray(record["speech"]).dtype, np.integer):
    speech = speech / 32768.0
  start = int(rng.integers(0, max(len(speech) - length, 0) + 1))
  audio = np.pad(speech[start : start + length], (0, max(length - len(speech), 0)))
  peak = np.max(np.abs(audio))
  if peak > 0:
    audio = audio / peak * 10.0 ** (rng.uniform(-6.0, -1.0) / 20.0)
  return {"audio": audio.astype(np.float32), "silence": audio == 0.0}
