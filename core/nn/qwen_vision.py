"""Qwen2.5-VL's vision side in JAX: the video preprocessing, the windowed vision tower and the
multimodal rotary position ids of a mixed text / video sequence.

Ported from transformers 5.x (the model Qwen2.5-VL-3B-Instruct, which "MARC: Memory-Augmented RL
Token Compression for Efficient Video Understanding", ICLR 2026, fine-tunes; official code
github.com/Gimlettt/MARC):

  smart_resize, pixel_values   transformers/models/qwen2_vl/video_processing_qwen2_vl.py
                               (`smart_resize`, rescale + CLIP normalisation, `patchify`): frames
                               `[T, H, W, 3]` -> rows `[t h w, 3 * 2 * 14 * 14]` in the processor's
                               order (2 x 2 merge blocks contiguous), and `grid_thw = (t, h, w)`.
  VisionTower                  transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py
                               (`Qwen2_5_VisionTransformerPretrainedModel`): a bias-free Conv3d patch
                               embedding (a linear map of each flattened `(C, 2, 14, 14)` patch),
                               `depth` pre-norm blocks (RMSNorm, attention with a fused qkv and 2-D
                               rotary over (row, column), SwiGLU MLP with biases), windowed attention
                               (windows of `window_size` px = 4 x 4 merged tokens) except in
                               `fullatt_block_indexes` (attention within each temporal slice), and
                               the `PatchMerger` (RMSNorm, the 2 x 2 neighbours concatenated, an MLP
                               with exact GELU to the language model's width).
  window_index, vision_positions  transformers/vision_utils.py (`get_vision_window_index`,
                               `get_vision_position_ids`, `get_vision_cu_seqlens`), in numpy: they
                               depend on the grid only, so they are static under `jit`.
  rope_index                   `Qwen2_5_VLModel.get_rope_index`: M-RoPE ids `[3, L]` of one
                               sequence; text tokens count up with all three axes equal, a video's
                               tokens get (t x interval, row, column) offset by the position where it
                               starts, with interval = tokens_per_second x seconds per temporal patch.

Text after a video. transformers 5.x continues the text at `start + max(h, w) / merge`
(`rule="grid"`); the release that Qwen2.5-VL was trained with (transformers 4.49-4.51, and the
official Qwen2.5-VL code) continues it at one past the largest id of the video, temporal ids included
(`rule="max"`, the default here). The two agree when the temporal ids stay below the spatial ones
(as in the tests' tiny video) and differ on long videos.

Attention inside the tower runs per segment (a temporal slice in the full-attention blocks, a window
in the others): the packed patches of every video of a call are gathered into `[segments, longest
segment]` with a padding mask (`Segments`), so memory grows with the segments' sizes, not with the
square of the whole video's patch count.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core.nn import attention as attention_lib

# the processor's normalisation (transformers.image_utils.OPENAI_CLIP_MEAN / _STD)
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
# qwen-vl-utils' per-frame pixel bounds for videos
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28

Grid = tuple[tuple[int, int, int], ...]  # (t, h, w) patches per video


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The fields of a Qwen2.5-VL `vision_config` that the tower uses (defaults: the 3B release)."""

  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  in_channels: int = 3
  out_hidden_size: int = 2048
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  tokens_per_second: float = 2.0
  rope_theta: float = 10_000.0

  @classmethod
  def from_hf(cls, vision: Mapping) -> VisionConfig:
    """From a `config.json`'s `vision_config` (released or transformers 5.x spelling)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vision.items() if k in fields}
    if "in_chans" in vision:
      values.setdefault("in_channels", vision["in_chans"])
    rope = vision.get("rope_parameters") or {}
    if "rope_theta" in rope:
      values["rope_theta"] = rope["rope_theta"]
    values["fullatt_block_indexes"] = tuple(
      values.get("fullatt_block_indexes", cls.fullatt_block_indexes)
    )
    if vision.get("hidden_act", "silu") != "silu":
      raise ValueError(f"vision_config.hidden_act={vision['hidden_act']!r}: only 'silu' is ported")
    return cls(**values)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size**2


# ---------------------------------------------------------------------------------------------------
# Preprocessing (the video processor)
# ---------------------------------------------------------------------------------------------------


def smart_resize(
  height: int,
  width: int,
  factor: int = 28,
  min_pixels: int = VIDEO_MIN_PIXELS,
  max_pixels: int = VIDEO_MAX_PIXELS,
) -> tuple[int, int]:
  """The processor's target size: both sides multiples of `factor`, the area within
  `[min_pixels, max_pixels]`, the aspect ratio kept as closely as that allows."""
  if max(height, width) / min(height, width) > 200:
    raise ValueError(f"smart_resize: aspect ratio of {height} x {width} exceeds 200")
  h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt(height * width / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def pixel_values(
  frames: np.ndarray, config: VisionConfig
) -> tuple[np.ndarray, tuple[int, int, int]]:
  """uint8 (or [0, 255] float) frames `[T, H, W, 3]`, H and W multiples of patch x merge (resize
  first) -> `(pixel_values_videos [t h w, C 2 p p] float32, grid (t, h, w))`. A frame count that
  the temporal patch does not divide is padded with copies of the last frame, as the processor
  does."""
  frames = np.asarray(frames, np.float32)
  p, m, tp = config.patch_size, config.spatial_merge_size, config.temporal_patch_size
  if frames.ndim != 4 or frames.shape[-1] != config.in_channels:
    raise ValueError(
      f"pixel_values: frames must be [T, H, W, {config.in_channels}], got {frames.shape}"
    )
  t, h, w, c = frames.shape
  if h % (p * m) or w % (p * m):
    raise ValueError(
      f"pixel_values: frame size {h} x {w} is not a multiple of {p * m} (smart_resize)"
    )
  video = (frames / 255.0 - CLIP_MEAN) / CLIP_STD
  if pad := -t % tp:
    video = np.concatenate([video, np.repeat(video[-1:], pad, 0)])
  gt, gh, gw = video.shape[0] // tp, h // p, w // p
  video = video.transpose(0, 3, 1, 2)  # T, C, H, W
  patches = video.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
  patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
  return np.ascontiguousarray(patches.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


# ---------------------------------------------------------------------------------------------------
# Index bookkeeping (static: functions of the grid)
# ---------------------------------------------------------------------------------------------------


def vision_positions(grid: Grid, merge: int) -> np.ndarray:
  """`[N, 2]` (row, column) of every patch in the processor's order (merge blocks contiguous)."""
  out = []
  for t, h, w in grid:
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
    out.append(np.tile(np.stack([rows, cols], -1), (t, 1)))
  return np.concatenate(out)


def window_index(grid: Grid, config: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
  """`(order of the merged tokens [N / merge^2], cu_window_seqlens)`: merged tokens regrouped so
  that each window of `window_size` px (per temporal slice) is contiguous, and the patch offsets
  where windows start (empty windows dropped)."""
  m = config.spatial_merge_size
  size = config.window_size // m // config.patch_size
  order, bounds, offset = [], [0], 0
  for t, h, w in grid:
    gh, gw = h // m, w // m
    index = np.arange(t * gh * gw).reshape(t, gh, gw)
    pad_h, pad_w = size - gh % size, size - gw % size
    nh, nw = (gh + pad_h) // size, (gw + pad_w) // size
    padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
    padded = padded.reshape(t, nh, size, nw, size).transpose(0, 1, 3, 2, 4)
    padded = padded.reshape(t, nh * nw, size, size)
    counts = (padded != -100).sum((2, 3)).reshape(-1)
    flat = padded.reshape(-1)
    order.append(flat[flat != -100] + offset)
    bounds.extend((np.cumsum(counts) * m * m + bounds[-1]).tolist())
    offset += t * gh * gw
  bounds = np.array(bounds)
  keep = np.concatenate([[True], bounds[1:] != bounds[:-1]])
  return np.concatenate(order), bounds[keep]


def frame_bounds(grid: Grid) -> np.ndarray:
  """cu_seqlens of full attention: one segment per temporal slice of every video."""
  sizes = np.concatenate([np.full(t, h * w) for t, h, w in grid])
  return np.concatenate([[0], np.cumsum(sizes)])


class Segments(NamedTuple):
  """Packed positions regrouped as `[S segments, M slots]` (M the longest segment): attention runs
  per segment, in O(S M^2) memory rather than O(N^2) for a packed mask."""

  gather: np.ndarray  # [S, M] packed position of each slot (0 in padding slots)
  valid: np.ndarray  # [S, M] bool: a real position
  slot: np.ndarray  # [N] flat slot (s M + m) of each packed position


def segments(bounds: np.ndarray) -> Segments:
  """`Segments` of the cumulative bounds `[0, ..., N]` (cu_seqlens)."""
  sizes = np.diff(bounds)
  width = int(sizes.max())
  offsets = np.arange(width)[None]
  valid = offsets < sizes[:, None]
  gather = np.where(valid, bounds[:-1, None] + offsets, 0)
  slot = np.flatnonzero(valid.reshape(-1))  # row-major slots are in packed order
  return Segments(gather.astype(np.int32), valid, slot.astype(np.int32))


def rope_index(
  input_ids: np.ndarray,
  video_token_id: int,
  grids: Sequence[tuple[int, int, int]],
  *,
  merge: int = 2,
  tokens_per_second: float = 2.0,
  seconds_per_grid: Sequence[float] | None = None,
  rule: str = "max",
  temporal: Sequence[np.ndarray | None] | None = None,
) -> tuple[np.ndarray, int]:
  """M-RoPE ids `[3, L]` of one sequence `input_ids [L]` (every run of `video_token_id` is one
  video of `grids`, in order) and the rope delta (largest id + 1 - L: decoding continues at
  slot + delta). `rule`: where the text after a video continues (module docstring).
  `temporal[v]`: the temporal-patch coordinate of each of video v's `t` slices (default
  `0..t-1`; a merged slice has the mean of its sources, `core.token_merge`)."""
  if rule not in ("max", "grid"):
    raise ValueError(f"rope_index: rule must be 'max' or 'grid', got {rule!r}")
  ids = np.asarray(input_ids)
  is_video = ids == video_token_id
  parts, current, video, start = [], 0, 0, 0
  change = np.flatnonzero(np.diff(is_video.astype(np.int8))) + 1
  for begin, end in zip(np.r_[0, change], np.r_[change, len(ids)], strict=True):
    if not is_video[begin]:
      parts.append(np.broadcast_to(np.arange(end - begin) + current, (3, end - begin)))
      current += end - begin
      continue
    if video >= len(grids):
      raise ValueError(f"rope_index: more video token runs than the {len(grids)} grids")
    t, h, w = grids[video]
    seconds = 1.0 if seconds_per_grid is None else seconds_per_grid[video]
    gh, gw = h // merge, w // merge
    if end - begin != t * gh * gw:
      raise ValueError(
        f"rope_index: video {video} has {end - begin} tokens, its grid {(t, h, w)} gives {t * gh * gw}"
      )
    steps = np.arange(t) if temporal is None or temporal[video] is None else temporal[video]
    if len(steps) != t:
      raise ValueError(
        f"rope_index: video {video} has {t} temporal slices, temporal has {len(steps)}"
      )
    tt, hh, ww = np.meshgrid(
      (np.asarray(steps, np.float64) * tokens_per_second * seconds).astype(np.int64),
      np.arange(gh),
      np.arange(gw),
      indexing="ij",
    )
    start = current
    block = np.stack([tt, hh, ww]).reshape(3, -1) + start
    parts.append(block)
    current = block.max() + 1 if rule == "max" else start + max(gh, gw)
    video += 1
  if video != len(grids):
    raise ValueError(f"rope_index: {len(grids)} grids but {video} video token runs")
  positions = np.concatenate(parts, 1).astype(np.int32)
  return positions, int(positions.max()) + 1 - len(ids)


# ---------------------------------------------------------------------------------------------------
# The tower
# ---------------------------------------------------------------------------------------------------


def rotate(x: jax.Array, angles: jax.Array) -> jax.Array:
  """Rotate-half rotary of `x [N, H, D]` by `angles [N, D/2]` (pairs `(i, i + D/2)`)."""
  half = x.shape[-1] // 2
  cos, sin = jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


class VisionBlock(nn.Module):
  """`x + Attn(RMSNorm(x))`, then `+ SwiGLU(RMSNorm(x))` (`Qwen2_5_VLVisionBlock`)."""

  config: VisionConfig
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, angles, groups: Segments):
    c, n = self.config, x.shape[0]
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    norm = functools.partial(
      nn.RMSNorm, epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype
    )
    qkv = dense(3 * c.hidden_size, name="qkv")(norm(name="norm1")(x))
    q, k, v = qkv.reshape(n, 3, c.num_heads, c.head_dim).transpose(1, 0, 2, 3)
    q, k = rotate(q, angles), rotate(k, angles)
    q, k, v = (t[groups.gather] for t in (q, k, v))  # [S, M, heads, head_dim]
    out = attention_lib.attention(q, k, v, attention_lib.padding_mask(groups.valid))
    out = out.reshape(-1, c.hidden_size)[groups.slot]
    x = x + dense(c.hidden_size, name="proj")(out)
    h = norm(name="norm2")(x)
    h = nn.silu(dense(c.intermediate_size, name="gate")(h)) * dense(c.intermediate_size, name="up")(
      h
    )
    return x + dense(c.hidden_size, name="down")(h)


class VisionTower(nn.Module):
  """`pixel_values_videos [N, C 2 p p]` of the videos of `grid` -> merged visual tokens
  `[N / merge^2, out_hidden_size]` in the processor's order (what replaces the video's
  placeholder tokens)."""

  config: VisionConfig
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, pixels: jax.Array, grid: Grid) -> jax.Array:
    c = self.config
    unit = c.spatial_merge_size**2
    count = sum(t * h * w for t, h, w in grid)
    if pixels.shape != (count, c.patch_dim):
      raise ValueError(
        f"VisionTower: pixel_values must be [{count}, {c.patch_dim}] for grid {grid}, got {pixels.shape}"
      )
    order, window_bounds = window_index(grid, c)
    patch_order = (order[:, None] * unit + np.arange(unit)).reshape(-1)  # merged -> patch order
    x = nn.Dense(
      c.hidden_size,
      use_bias=False,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="patch_embed",
    )(jnp.asarray(pixels, self.dtype))[patch_order]
    angles = self._angles(grid)[patch_order]
    full, windows = segments(frame_bounds(grid)), segments(window_bounds)
    for layer in range(c.depth):
      groups = full if layer in c.fullatt_block_indexes else windows
      x = VisionBlock(c, self.dtype, self.param_dtype, name=f"block_{layer}")(x, angles, groups)
    x = nn.RMSNorm(
      epsilon=1e-6, dtype=self.dtype, param_dtype=self.param_dtype, name="merger_norm"
    )(x)
    x = x.reshape(-1, unit * c.hidden_size)
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    x = dense(unit * c.hidden_size, name="merger_in")(x)
    x = dense(c.out_hidden_size, name="merger_out")(nn.gelu(x, approximate=False))
    return x[np.argsort(order)]

  def _angles(self, grid: Grid) -> np.ndarray:
    """`[N, head_dim / 2]`: the row angles on the first quarter of pairs, the column angles on the
    second (`Qwen2_5_VLVisionRotaryEmbedding`, spatial dim head_dim / 2)."""
    spatial = self.config.head_dim // 2
    inv_freq = 1.0 / self.config.rope_theta ** (
      np.arange(0, spatial, 2, dtype=np.float32) / spatial
    )
    positions = vision_positions(grid, self.config.spatial_merge_size).astype(np.float32)
    return np.concatenate([positions[:, :1] * inv_freq, positions[:, 1:] * inv_freq], -1)
