"""Video files as the frames Qwen2.5-VL reads: uniform sampling of N frames from a file and the
processor's resize (the input side of "MARC: Memory-Augmented RL Token Compression for Efficient
Video Understanding", ICLR 2026, whose model is Qwen2.5-VL-3B-Instruct).

  sample_indices   N frame indices spread uniformly over the video, `round(linspace(0, total - 1,
                   N))`, as qwen-vl-utils' `_read_video_decord` / `_read_video_torchvision` pick
                   them (github.com/QwenLM/Qwen2.5-VL, qwen-vl-utils/src/qwen_vl_utils/
                   vision_process.py).
  read_video       decodes those frames with PyAV (`pip install av`, FFmpeg's libraries) and
                   resizes each to `core.nn.qwen_vision.smart_resize` of the video's size (both
                   sides multiples of 28, the area within the video pixel bounds). The resize is
                   FFmpeg's bicubic swscale, not torchvision's antialiased bicubic that the
                   processor uses: the sizes agree exactly, the pixels to within interpolation.
  VideoClip        the frames `[N, H, W, 3]` uint8, their times in seconds, and
                   `seconds_per_grid` (temporal patch / sampling fps), which M-RoPE's temporal ids
                   scale with (`core.nn.qwen_vision.rope_index`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from core.nn import qwen_vision


class VideoClip(NamedTuple):
  frames: np.ndarray  # [N, H, W, 3] uint8, H and W multiples of 28
  times: np.ndarray  # [N] float seconds of each sampled frame
  fps: float  # the file's average frame rate
  total_frames: int  # decoded frames of the file

  def seconds_per_grid(self, temporal_patch_size: int = 2) -> float:
    """Seconds covered by one temporal patch at the sampling rate (the processor's
    `second_per_grid_ts`; qwen-vl-utils' `sample_fps = N / total_frames * fps`)."""
    return temporal_patch_size / (len(self.frames) / self.total_frames * self.fps)


def sample_indices(total: int, num_frames: int) -> np.ndarray:
  """`num_frames` indices spread uniformly over `total` frames (repeats when the video is shorter)."""
  if total < 1 or num_frames < 1:
    raise ValueError(
      f"sample_indices: need total >= 1 and num_frames >= 1, got {total}, {num_frames}"
    )
  return np.round(np.linspace(0, total - 1, num_frames)).astype(np.int64)


def read_video(
  path: str,
  num_frames: int,
  *,
  factor: int = 28,
  min_pixels: int = qwen_vision.VIDEO_MIN_PIXELS,
  max_pixels: int = qwen_vision.VIDEO_MAX_PIXELS,
) -> VideoClip:
  """`num_frames` uniformly sampled frames of the video at `path`, resized by `smart_resize`."""
  try:
    import av
  except ImportError as error:
    raise ImportError(
      "read_video needs PyAV: pip install av (or pip install -e '.[video]')"
    ) from error
  try:
    with av.open(path) as container:  # pass 1: the frame count (container headers may omit it)
      stream = container.streams.video[0]
      fps = float(stream.average_rate or 0) or 1.0
      total = sum(1 for _ in container.decode(stream))
    if total == 0:
      raise ValueError(f"read_video: {path!r} has no video frames")
    wanted = sample_indices(total, num_frames)
    frames, times = [], []
    with av.open(path) as container:  # pass 2: keep only the sampled frames, resized
      for index, frame in enumerate(container.decode(container.streams.video[0])):
        copies = int(np.sum(wanted == index))
        if not copies:
          continue
        size = qwen_vision.smart_resize(frame.height, frame.width, factor, min_pixels, max_pixels)
        rgb = frame.reformat(width=size[1], height=size[0], format="rgb24", interpolation="BICUBIC")
        frames += [rgb.to_ndarray()] * copies
        times += [frame.time if frame.time is not None else index / fps] * copies
  except (av.error.FFmpegError, IndexError, OSError) as error:
    raise ValueError(
      f"read_video: cannot decode {path!r}: {type(error).__name__}: {error}"
    ) from None
  return VideoClip(np.stack(frames), np.array(times, np.float64), fps, total)
