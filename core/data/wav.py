"""16-bit PCM WAV files of float waveforms (stdlib `wave`; no audio package needed).

- `to_pcm16`: floats in [-1, 1] -> int16, `round(x * 32767)`; samples outside [-1, 1] are clipped
  (and counted), non-finite samples are an error.
- `write_wav`, `read_wav`: one file, mono `(T,)` or interleaved channels `(T, C)`; reading returns
  float32 `pcm / 32767`, so a written-then-read waveform is within half an LSB of its clipped input.
- `write_examples`: a folder of named example waveforms (a reference and each generator's output),
  as the vocoder benchmarks of Flow2GAN ("Flow2GAN", ICLR 2026) leave them for listening.
"""

from __future__ import annotations

import dataclasses
import os
import wave
from collections.abc import Mapping

import numpy as np

FULL_SCALE = 32767  # int16 full scale: 1.0 -> 32767, -1.0 -> -32767 (symmetric, -32768 unused)


def to_pcm16(waveform: np.ndarray) -> tuple[np.ndarray, int]:
  """`(int16 samples, number of samples clipped)`; raises `ValueError` on NaN or infinity."""
  x = np.asarray(waveform, np.float64)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"waveform of shape {x.shape} has non-finite samples")
  clipped = int(np.sum(np.abs(x) > 1.0))
  return np.round(np.clip(x, -1.0, 1.0) * FULL_SCALE).astype(np.int16), clipped


def _channels_last(waveform: np.ndarray) -> np.ndarray:
  x = np.asarray(waveform)
  if x.ndim == 1:
    return x[:, None]
  if x.ndim == 2:
    return x
  raise ValueError(f"waveform must be (T,) or (T, channels), got shape {x.shape}")


def write_wav(path: str, waveform: np.ndarray, sample_rate: int) -> int:
  """Writes `waveform` (`(T,)` or `(T, channels)`, floats in [-1, 1]) as 16-bit PCM; returns how many
  samples were clipped to full scale."""
  if not (isinstance(sample_rate, int | np.integer) and sample_rate > 0):
    raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")
  samples, clipped = to_pcm16(_channels_last(waveform))
  with wave.open(os.fspath(path), "wb") as f:
    f.setnchannels(samples.shape[1])
    f.setsampwidth(2)
    f.setframerate(int(sample_rate))
    f.writeframes(samples.astype("<i2").tobytes())
  return clipped


def read_wav(path: str) -> tuple[np.ndarray, int]:
  """`(float32 waveform, sample rate)` of a 16-bit PCM file: `(T,)` for mono, else `(T, channels)`."""
  with wave.open(os.fspath(path), "rb") as f:
    if f.getsampwidth() != 2:
      raise ValueError(f"{path}: {8 * f.getsampwidth()}-bit samples; only 16-bit PCM is read")
    channels, rate = f.getnchannels(), f.getframerate()
    data = np.frombuffer(f.readframes(f.getnframes()), "<i2")
  data = data.reshape(-1, channels).astype(np.float32) / FULL_SCALE
  return (data[:, 0] if channels == 1 else data), rate


@dataclasses.dataclass(frozen=True)
class AudioExamples:
  """A phase artifact of sound: `experiments/loop.py` writes `<workdir>/<stem>/<name>_<i>.wav` for the
  first `count` rows of every `(N, T)` array in `waveforms`."""

  sample_rate: int
  waveforms: Mapping[str, np.ndarray]
  count: int


def write_examples(
  directory: str, sample_rate: int, waveforms: Mapping[str, np.ndarray], count: int
) -> dict[str, int]:
  """Writes the first `count` rows of each `(N, T)` array in `waveforms` to `<directory>/<name>_<i>.wav`;
  returns `{file name: clipped samples}`."""
  os.makedirs(directory, exist_ok=True)
  written = {}
  for name, batch in waveforms.items():
    batch = np.asarray(batch)
    if batch.ndim != 2:
      raise ValueError(f"examples {name!r}: need (N, T) waveforms, got shape {batch.shape}")
    for i in range(min(count, batch.shape[0])):
      file_name = f"{name}_{i}.wav"
      written[file_name] = write_wav(os.path.join(directory, file_name), batch[i], sample_rate)
  return written
