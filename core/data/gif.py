"""Animated GIFs of video clips (Pillow, which matplotlib already installs).

- `to_uint8_frames`: `(F, H, W, 3)` or `(F, H, W)` floats in [0, 1] (or uint8) -> uint8 RGB frames;
  non-finite pixels are an error, values outside [0, 1] are clipped.
- `write_gif`: one clip as a looping GIF at `fps` frames per second.
- `VideoClips`: a phase artifact of moving pictures; `experiments/reports.write_artifact` writes
  `<workdir>/<stem>/<name>.gif` for every clip, e.g. one relit clip per arm of LightCtrl
  ("LightCtrl", ICLR 2026), whose claims (light following, flicker) are about motion.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np


def to_uint8_frames(frames: np.ndarray) -> np.ndarray:
  """`(F, H, W, 3)` uint8 RGB frames of a clip given as floats in [0, 1] or uint8, RGB or grey."""
  x = np.asarray(frames)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4 or x.shape[-1] not in (1, 3) or x.shape[0] < 1:
    raise ValueError(f"a clip must be (frames, H, W[, 1 or 3]), got shape {np.shape(frames)}")
  if x.dtype != np.uint8:
    if not np.all(np.isfinite(x)):
      raise ValueError(f"clip of shape {x.shape} has non-finite pixels")
    x = np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
  return np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x


def write_gif(path: str, frames: np.ndarray, fps: float, scale: int = 1) -> None:
  """Writes a clip as a looping GIF; `scale` enlarges each pixel (nearest) for small renders."""
  from PIL import Image

  if not fps > 0:
    raise ValueError(f"fps must be positive, got {fps!r}")
  if not (isinstance(scale, int) and scale >= 1):
    raise ValueError(f"scale must be a positive int, got {scale!r}")
  pixels = to_uint8_frames(frames)
  if scale > 1:
    pixels = pixels.repeat(scale, axis=1).repeat(scale, axis=2)
  images = [Image.fromarray(frame) for frame in pixels]
  images[0].save(
    os.fspath(path),
    save_all=True,
    append_images=images[1:],
    duration=int(round(1000.0 / fps)),
    loop=0,
    optimize=False,
  )


@dataclasses.dataclass(frozen=True)
class VideoClips:
  """A phase or study artifact of video: `<stem>/<name>.gif` for each `(F, H, W[, 3])` clip."""

  clips: Mapping[str, np.ndarray]
  fps: float = 8.0
  scale: int = 1


def write_clips(directory: str, artifact: VideoClips) -> list[str]:
  """Writes every clip of `artifact` to `<directory>/<name>.gif`; returns the paths."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, frames in artifact.clips.items():
    path = os.path.join(directory, f"{name}.gif")
    write_gif(path, frames, artifact.fps, artifact.scale)
    paths.append(path)
  return paths
