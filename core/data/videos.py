"""Moving-shape videos: seeded, deterministic, generated on the fly; small enough to train a video DiT
on a CPU (the toy setting in which this codebase tests BWCache's block caching, ICLR 2026).

Each video has `frames` frames of `size x size` pixels in [-1, 1] (background -1) and 1..`max_shapes`
shapes (square, disk or cross) of side 3..6 px and intensity U(0.2, 1), starting at a uniform position
and moving at a constant velocity U(-1.5, 1.5) px/frame per axis, bouncing off the walls.
`video_batch(seed, index, n)` is a pure function of its arguments, so batches resume by index.
"""

from __future__ import annotations

import numpy as np

from core.data.batching import GeneratedBatches

SHAPES = ("square", "disk", "cross")


def _shape_mask(kind: str, side: int) -> np.ndarray:
  yy, xx = np.mgrid[:side, :side] - (side - 1) / 2
  if kind == "square":
    return np.ones((side, side), bool)
  if kind == "disk":
    return yy**2 + xx**2 <= (side / 2) ** 2
  return (np.abs(yy) <= side / 6 + 0.5) | (np.abs(xx) <= side / 6 + 0.5)


def _bounce(start: float, velocity: float, frames: int, span: float) -> np.ndarray:
  """Positions of a point moving at `velocity` inside [0, span], reflected at the walls."""
  raw = start + velocity * np.arange(frames)
  period = 2 * span
  folded = np.mod(raw, period)
  return np.where(folded > span, period - folded, folded)


def moving_shapes_video(
  rng: np.random.Generator, frames: int, size: int, channels: int, max_shapes: int
) -> np.ndarray:
  video = -np.ones((frames, size, size, channels), np.float32)
  for _ in range(rng.integers(1, max_shapes + 1)):
    kind = SHAPES[rng.integers(len(SHAPES))]
    side = int(rng.integers(3, 7))
    intensity = rng.uniform(0.2, 1.0, size=channels).astype(np.float32)
    span = size - side
    ys = _bounce(rng.uniform(0, span), rng.uniform(-1.5, 1.5), frames, span)
    xs = _bounce(rng.uniform(0, span), rng.uniform(-1.5, 1.5), frames, span)
    mask = _shape_mask(kind, side)
    for f in range(frames):
      y, x = int(round(ys[f])), int(round(xs[f]))
      patch = video[f, y : y + side, x : x + side]
      patch[mask] = intensity
  return video


def video_batch(
  seed: int,
  index: int,
  n: int,
  frames: int = 8,
  size: int = 16,
  channels: int = 1,
  max_shapes: int = 2,
):
  """`n` videos `(n, frames, size, size, channels)` float32; batch `index` of stream `seed`."""
  rng = np.random.default_rng([seed, index])
  return np.stack([moving_shapes_video(rng, frames, size, channels, max_shapes) for _ in range(n)])


def video_stream(seed: int, global_batch_size: int, **video) -> GeneratedBatches:
  """A `DataSource`: the global batch of step `s` is `video_batch(seed, s, global_batch_size)`."""
  return GeneratedBatches(
    lambda step: {"video": video_batch(seed, step, global_batch_size, **video)}, global_batch_size
  )
