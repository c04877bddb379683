"""Spike-train data for the Dynamic Gated Neuron experiments: generators, perturbations, readers.

Paper: "A Brain-Inspired Gating Mechanism Unlocks Robust Computation in Spiking Neural Networks"
(Bai, Wang, Yu; ICLR 2026), robustness experiments: networks trained on clean spike trains (TIDIGITS,
SHD, ...) and tested on perturbations never seen in training: spike insertion, deletion, both, and
gradient attacks.

Every array of spikes is `[n, T, channels]` (uint8 0/1 from the generators; float in [0, 1] after a
relaxed attack).

Generators (numpy, pure functions of their seeds):
* `temporal_order_digits`: a CPU stand-in for spoken digits. Each class is a set of "formant tracks"
  `f_k(tau) = c_k + a_k sin(2 pi w_k tau + p_k)` over the channel ("cochlear") axis, active on
  `[on_k, off_k]` of the normalised time `tau`. Classes come in pairs `(2j, 2j + 1)` where `2j + 1` is
  the time reversal of `2j`: their per-channel spike counts have the same distribution, so only the
  temporal order separates them. Samples are time-warped, shifted in time and channel, jittered, and
  thinned (each track point spikes w.p. `p_track`, its two neighbours w.p. `p_neighbour`), over a
  background rate.
* `mnist1d_like`: the MNIST-1D recipe (Greydanus 2020: ten 12-point templates, random padding,
  stretch, shear, translation, correlated and iid noise, resampled to 40 points), generated here with
  no download, then read left to right as time and encoded by `population_encode`.
* `population_encode`: each of `channels` neurons has a Gaussian tuning curve over the signal's range;
  it spikes at step `t` w.p. `max_rate * tuning(x_t)`.

Test-time perturbations (jax, pure functions of a key; all are the identity at strength 0):
`add_spikes` (each silent bin spikes w.p. p), `delete_spikes` (each spike is removed w.p. p), `mixed`
(both), `jitter` (each spike moves by `round(N(0, sigma^2))` steps, clipped to the window).

Readers for the paper-scale data (`read_events`, `EventDataset`): the Spiking Heidelberg Digits HDF5
files (`shd_train.h5`, `shd_test.h5`: `spikes/times` in seconds, `spikes/units`, `labels`, Cramer et
al. 2020) binned into `num_steps` bins over `[0, max_time)`. TIDIGITS is distributed as audio (LDC93S10);
the paper's spike encoder is not public, so its reader expects the encoded spikes in the same HDF5 layout
(`tidigits_train.h5`, `tidigits_test.h5`). Reading needs `h5py`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

# ---------------------------------------------------------------------------------------------------
# Temporal-order spike digits
# ---------------------------------------------------------------------------------------------------


def _prototypes(seed: int, num_pairs: int, num_tracks: int, channels: int) -> dict[str, np.ndarray]:
  """Track parameters `[num_pairs, num_tracks]` of the even classes."""
  rng = np.random.default_rng([seed, 0])
  shape = (num_pairs, num_tracks)
  margin = channels / 8
  duration = rng.uniform(0.3, 0.8, shape)
  onset = rng.uniform(0.0, 1.0 - duration)
  return {
    "centre": rng.uniform(margin, channels - margin, shape),
    "amplitude": rng.uniform(2.0, 10.0, shape) * channels / 64,
    "frequency": rng.uniform(0.5, 2.0, shape),
    "phase": rng.uniform(0.0, 2 * np.pi, shape),
    "onset": onset,
    "offset": onset + duration,
  }


def temporal_order_digits(
  seed: int,
  num_per_class: int,
  num_classes: int = 10,
  num_steps: int = 100,
  channels: int = 64,
  prototype_seed: int = 0,
  num_tracks: int = 3,
  p_track: float = 0.8,
  p_neighbour: float = 0.3,
  background_rate: float = 0.002,
  warp: float = 0.2,
  time_shift: float = 0.1,
  channel_shift: int = 3,
) -> dict[str, np.ndarray]:
  """`{"x": uint8 [n, T, channels], "y": int32 [n]}`, `num_per_class` samples of each class, shuffled.

  The class prototypes depend only on `prototype_seed` (shared by the train and test splits); `seed`
  draws the samples. `num_classes` must be even (time-reversed pairs).
  """
  if num_classes % 2:
    raise ValueError(f"num_classes must be even (time-reversed pairs), got {num_classes}")
  proto = _prototypes(prototype_seed, num_classes // 2, num_tracks, channels)
  rng = np.random.default_rng([seed, 1])
  y = rng.permutation(np.repeat(np.arange(num_classes), num_per_class)).astype(np.int32)
  n = len(y)
  stretch = rng.uniform(1 - warp, 1 + warp, (n, 1))
  offset = rng.uniform(-time_shift, time_shift, (n, 1))
  tau = (np.linspace(0.0, 1.0, num_steps)[None] - 0.5 - offset) / stretch + 0.5
  tau = np.where((y % 2 == 1)[:, None], 1.0 - tau, tau)[..., None]  # [n, T, 1]
  track = {name: value[y // 2][:, None, :] for name, value in proto.items()}  # [n, 1, K]
  position = track["centre"] + track["amplitude"] * np.sin(
    2 * np.pi * track["frequency"] * tau + track["phase"]
  )
  shift = rng.integers(-channel_shift, channel_shift + 1, (n, 1, 1))
  position = np.rint(position + shift + rng.normal(size=position.shape)).astype(np.int64)
  active = (tau >= track["onset"]) & (tau <= track["offset"])
  x = (rng.random((n, num_steps, channels)) < background_rate).astype(np.uint8)
  for offset_channel, rate in ((0, p_track), (-1, p_neighbour), (1, p_neighbour)):
    channel = position + offset_channel
    fire = active & (rng.random(position.shape) < rate) & (channel >= 0) & (channel < channels)
    b, t, k = np.nonzero(fire)
    x[b, t, channel[b, t, k]] = 1
  return {"x": x, "y": y}


# ---------------------------------------------------------------------------------------------------
# MNIST-1D-style signals and population coding
# ---------------------------------------------------------------------------------------------------

# The ten 12-point templates of MNIST-1D (Greydanus 2020), one row per digit.
MNIST1D_TEMPLATES = np.array(
  [
    [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
    [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
    [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
    [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
    [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
    [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
    [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
    [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
  ]
)


def _smooth(noise: np.ndarray, width: float) -> np.ndarray:
  """Gaussian smoothing along the last axis (correlated noise)."""
  radius = int(3 * width)
  kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / width) ** 2)
  kernel /= kernel.sum()
  padded = np.pad(noise, ((0, 0), (radius, radius)), mode="edge")
  windows = np.lib.stride_tricks.sliding_window_view(padded, len(kernel), axis=-1)
  return windows @ kernel


def mnist1d_like(
  seed: int,
  num_examples: int,
  length: int = 40,
  shear_scale: float = 0.75,
  corr_noise_scale: float = 0.25,
  iid_noise_scale: float = 0.02,
  scale_coeff: float = 0.4,
  max_translation: int = 48,
) -> dict[str, np.ndarray]:
  """`{"x": float32 [n, length], "y": int32 [n]}`: MNIST-1D's generative recipe (module docstring)."""
  rng = np.random.default_rng([seed, 2])
  y = rng.integers(0, 10, num_examples).astype(np.int32)
  signals = np.empty((num_examples, length), np.float32)
  for i, label in enumerate(y):
    template = MNIST1D_TEMPLATES[label] - 5.0
    template = template * rng.uniform(1 - scale_coeff, 1 + scale_coeff)
    padding = rng.integers(36, 60)
    canvas_length = len(template) + padding
    stretched = np.interp(
      np.linspace(0, 1, canvas_length), np.linspace(0, 1, len(template)), template
    )
    canvas = np.zeros(canvas_length + max_translation)
    start = rng.integers(0, max_translation)
    canvas[start : start + canvas_length] = stretched
    canvas += rng.uniform(-shear_scale, shear_scale) * np.linspace(-1, 1, len(canvas))
    resampled = np.interp(np.linspace(0, 1, length), np.linspace(0, 1, len(canvas)), canvas)
    signals[i] = resampled
  signals += corr_noise_scale * _smooth(rng.normal(size=signals.shape), 2.0)
  signals += iid_noise_scale * rng.normal(size=signals.shape)
  return {"x": signals.astype(np.float32), "y": y}


def population_encode(
  seed: int,
  signals: np.ndarray,
  channels: int = 64,
  num_steps: int = 80,
  max_rate: float = 0.8,
  value_range: tuple[float, float] = (-4.0, 4.0),
) -> np.ndarray:
  """Signals `[n, L]` -> spikes uint8 `[n, num_steps, channels]`: resampled to `num_steps` steps;
  channel `j` spikes w.p. `max_rate * exp(-(x - m_j)^2 / (2 w^2))`, `m_j` evenly spaced over
  `value_range`, `w` their spacing."""
  rng = np.random.default_rng([seed, 3])
  n, length = signals.shape
  grid = np.linspace(0, length - 1, num_steps)
  resampled = np.stack([np.interp(grid, np.arange(length), s) for s in signals])
  centres = np.linspace(*value_range, channels)
  width = centres[1] - centres[0]
  rate = max_rate * np.exp(-0.5 * ((resampled[..., None] - centres) / width) ** 2)
  return (rng.random(rate.shape) < rate).astype(np.uint8)


def mnist1d_spikes(
  seed: int, num_examples: int, channels: int = 64, num_steps: int = 80
) -> dict[str, np.ndarray]:
  """`mnist1d_like` signals, population-coded into spikes: `{"x": uint8 [n, T, C], "y"}`."""
  data = mnist1d_like(seed, num_examples)
  return {"x": population_encode(seed, data["x"], channels, num_steps), "y": data["y"]}


# ---------------------------------------------------------------------------------------------------
# Test-time perturbations
# ---------------------------------------------------------------------------------------------------


def add_spikes(key: jax.Array, x: jax.Array, p) -> jax.Array:
  """Every silent bin spikes with probability `p` (spike insertion)."""
  x = x.astype(jnp.float32)
  return jnp.maximum(x, (jax.random.uniform(key, x.shape) < p).astype(jnp.float32))


def delete_spikes(key: jax.Array, x: jax.Array, p) -> jax.Array:
  """Every spike is removed with probability `p` (spike deletion)."""
  x = x.astype(jnp.float32)
  return x * (jax.random.uniform(key, x.shape) >= p)


def mixed(key: jax.Array, x: jax.Array, p_add, p_delete) -> jax.Array:
  """Deletion with `p_delete`, then insertion with `p_add`, independently."""
  key_delete, key_add = jax.random.split(key)
  return add_spikes(key_add, delete_spikes(key_delete, x, p_delete), p_add)


def jitter(key: jax.Array, x: jax.Array, sigma) -> jax.Array:
  """Every spike moves by `round(sigma * N(0, 1))` steps within its channel (clipped to the window);
  spikes landing in the same bin merge."""
  x = x.astype(jnp.float32)
  batch, steps, channels = x.shape
  moved = jnp.rint(sigma * jax.random.normal(key, x.shape)).astype(jnp.int32)
  target = jnp.clip(jnp.arange(steps)[None, :, None] + moved, 0, steps - 1)
  b = jnp.broadcast_to(jnp.arange(batch)[:, None, None], x.shape)
  c = jnp.broadcast_to(jnp.arange(channels)[None, None, :], x.shape)
  return jnp.zeros_like(x).at[b, target, c].max(x)


PERTURBATIONS = ("additive", "subtractive", "mixed", "jitter")


def perturb(key: jax.Array, x: jax.Array, family: str, strength) -> jax.Array:
  """`family` in `PERTURBATIONS`; `strength` is p, p, (p_add, p_delete) or sigma."""
  if family == "additive":
    return add_spikes(key, x, strength)
  if family == "subtractive":
    return delete_spikes(key, x, strength)
  if family == "mixed":
    return mixed(key, x, strength[0], strength[1])
  if family == "jitter":
    return jitter(key, x, strength)
  raise ValueError(f"family must be one of {PERTURBATIONS}, got {family!r}")


# ---------------------------------------------------------------------------------------------------
# Paper-scale readers: spike events in the Spiking Heidelberg Digits HDF5 layout
# ---------------------------------------------------------------------------------------------------

EVENT_FILES = {
  "shd": {"train": "shd_train.h5", "test": "shd_test.h5"},
  "tidigits": {"train": "tidigits_train.h5", "test": "tidigits_test.h5"},
}


def event_file(data_dir: str, name: str, split: str) -> str:
  return os.path.join(data_dir, EVENT_FILES[name][split])


def read_events(path: str) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
  """`(times, units, labels)`: per example its spike times (seconds) and unit indices."""
  import h5py

  with h5py.File(path, "r") as f:
    times = [np.asarray(t, np.float64) for t in f["spikes"]["times"]]
    units = [np.asarray(u, np.int64) for u in f["spikes"]["units"]]
    labels = np.asarray(f["labels"], np.int32)
  return times, units, labels


def bin_events(
  times: np.ndarray, units: np.ndarray, num_steps: int, max_time: float, num_units: int
) -> np.ndarray:
  """One example's events -> uint8 `[num_steps, num_units]`; events at or after `max_time` dropped,
  several events in one bin count once."""
  keep = (times >= 0) & (times < max_time) & (units >= 0) & (units < num_units)
  steps = np.floor(times[keep] / max_time * num_steps).astype(np.int64)
  dense = np.zeros((num_steps, num_units), np.uint8)
  dense[steps, units[keep]] = 1
  return dense


class EventDataset:
  """Random access to binned examples of an event file, densified on demand (SHD's dense train set
  would take gigabytes)."""

  def __init__(self, path: str, num_steps: int, max_time: float, num_units: int):
    self.times, self.units, self.labels = read_events(path)
    self.num_steps, self.max_time, self.num_units = num_steps, max_time, num_units

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, indices) -> dict[str, np.ndarray]:
    indices = np.atleast_1d(indices)
    x = np.stack(
      [
        bin_events(self.times[i], self.units[i], self.num_steps, self.max_time, self.num_units)
        for i in indices
      ]
    )
    return {"x": x, "y": self.labels[indices]}


def write_events(path: str, times, units, labels) -> None:
  """Writes events in the SHD layout (what an encoder for TIDIGITS should produce; used by tests)."""
  import h5py

  def ragged(arrays, dtype):
    out = np.empty(len(arrays), dtype=object)
    out[:] = [np.asarray(a, dtype) for a in arrays]
    return out

  with h5py.File(path, "w") as f:
    spikes = f.create_group("spikes")
    spikes.create_dataset(
      "times", data=ragged(times, np.float32), dtype=h5py.vlen_dtype(np.float32)
    )
    spikes.create_dataset("units", data=ragged(units, np.uint16), dtype=h5py.vlen_dtype(np.uint16))
    f.create_dataset("labels", data=np.asarray(labels, np.uint16))
