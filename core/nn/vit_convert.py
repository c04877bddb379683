"""DINO ViT checkpoints as `core.nn.vit.ViT` parameters: a pure mapping of names and layouts, plus a
reader of the `.npz` the state dict is saved as.

DINO (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021)
releases backbone state dicts (`dino_deitsmall16_pretrain.pth`: ViT-S/16, github.com/facebookresearch/
dino) in the torch layout of its `vision_transformer.py`. Torch names and layouts -> here:

  cls_token [1, 1, D]                      cls_token
  pos_embed [1, 1 + n*n, D]                pos_embed [1, 1 + g*g, D]; resized when n != g (below)
  patch_embed.proj.weight [D, 3, p, p]     patch_embed/kernel [p, p, 3, D] (Conv2d -> NHWC conv)
  patch_embed.proj.bias [D]                patch_embed/bias
  blocks.N.norm1 / norm2 / norm .weight    blocks_N/norm1 / norm2, norm: scale (.bias: bias)
  blocks.N.attn.qkv.weight [3D, D]         blocks_N/attn/qkv/kernel [D, 3D] (fused, q|k|v head-major)
  blocks.N.attn.proj, mlp.fc1, mlp.fc2     blocks_N/attn/proj, mlp/fc1, mlp/fc2

Linear weights `[out, in]` become kernels `[in, out]`. Any missing or unexpected key, or a shape that
does not fit the model, raises `CheckpointError` naming the key.

Positions at another resolution: DINO trains at 224 px (a 14 x 14 grid at patch 16) and, for any
other input size, resizes the patch part of `pos_embed` in `interpolate_pos_encoding` with torch's
bicubic interpolation (`align_corners=False`, cubic coefficient A = -0.75, indices clamped at the
border) at scale factor `(g + 0.1) / n`; `interpolate_positions` computes the same resize once, at
conversion (the CLS entry is kept as is).

torch is not needed here: save the state dict once, offline, as named arrays:
`sd = torch.load("dino_deitsmall16_pretrain.pth", map_location="cpu");
np.savez("dino_vits16.npz", **{k: v.float().numpy() for k, v in sd.items()})`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from core.nn.convert import (
  CheckpointError,
  Rule,
  apply_rules,
  layer_norm,
  linear,
  param_shapes,
  read_npz,
)
from core.nn.vit import ViT

__all__ = ["CheckpointError", "dino_to_flax", "interpolate_positions", "read_npz"]

BICUBIC_A = -0.75  # torch's upsample_bicubic2d
DINO_OFFSET = 0.1  # DINO adds it to the new grid size "to avoid floating point error"


def dino_to_flax(state_dict: Mapping[str, np.ndarray], model: ViT, input_size: int) -> dict:
  """Converts a DINO ViT state dict (torch names, numpy arrays) into `model.init`'s
  `{"params": ...}` (float32) for `[B, input_size, input_size, 3]` inputs."""
  images = jnp.zeros((1, input_size, input_size, 3))
  expected = param_shapes(jax.eval_shape(model.init, jax.random.key(0), images))
  rules = _rules(expected, model)
  return apply_rules(
    state_dict, rules, expected, source="DINO ViT", shape_checked_by_rule=("pos_embed",)
  )


def interpolate_positions(table: np.ndarray, grid: int) -> np.ndarray:
  """`[n*n, D]` patch positions resized to `[grid*grid, D]` as DINO's `interpolate_pos_encoding`
  does it (module docstring); unchanged when `grid == n`."""
  n = math.isqrt(table.shape[0])
  if n * n != table.shape[0]:
    raise ValueError(f"interpolate_positions: {table.shape[0]} positions are not a square grid")
  if grid == n:
    return table
  square = table.reshape(n, n, -1).astype(np.float64)
  scale = n / (grid + DINO_OFFSET)  # torch maps output i to input (i + 0.5) * scale - 0.5
  square = _bicubic_axis(square, grid, scale, axis=0)
  return _bicubic_axis(square, grid, scale, axis=1).reshape(grid * grid, -1).astype(table.dtype)


def cubic_coefficients(t: np.ndarray, a: float = BICUBIC_A) -> list[np.ndarray]:
  """Keys' cubic-convolution weights of the 4 neighbours at offsets -1, 0, 1, 2 of a fractional
  position `t` in [0, 1) (torch's `get_cubic_upsample_coefficients`)."""

  def near(x):  # |x| <= 1
    return ((a + 2) * x - (a + 3)) * x * x + 1

  def far(x):  # 1 < |x| < 2
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

  return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _bicubic_axis(x: np.ndarray, size: int, scale: float, axis: int) -> np.ndarray:
  length = x.shape[axis]
  source = (np.arange(size) + 0.5) * scale - 0.5
  base = np.floor(source)
  shape = [1] * x.ndim
  shape[axis] = size
  out = np.zeros_like(np.take(x, np.zeros(size, int), axis=axis))
  for offset, weight in zip((-1, 0, 1, 2), cubic_coefficients(source - base), strict=True):
    index = np.clip(base + offset, 0, length - 1).astype(int)
    out += np.take(x, index, axis=axis) * weight.reshape(shape)
  return out


def _rules(expected, model: ViT) -> dict[str, Rule]:
  d, p = model.width, model.patch
  rules: dict[str, Rule] = {
    "cls_token": ((1, 1, d), lambda c: {("cls_token",): c}),
    "pos_embed": (expected[("pos_embed",)], _positions(expected[("pos_embed",)])),
    "patch_embed.proj.weight": (
      (d, 3, p, p),
      lambda w: {("patch_embed", "kernel"): w.transpose(2, 3, 1, 0)},
    ),
    "patch_embed.proj.bias": ((d,), lambda b: {("patch_embed", "bias"): b}),
  }
  rules |= layer_norm("norm", ("norm",), expected)
  for i in range(model.depth):
    block = f"blocks_{i}"
    rules |= layer_norm(f"blocks.{i}.norm1", (block, "norm1"), expected)
    rules |= layer_norm(f"blocks.{i}.norm2", (block, "norm2"), expected)
    for torch_name, path in (
      ("attn.qkv", ("attn", "qkv")),
      ("attn.proj", ("attn", "proj")),
      ("mlp.fc1", ("mlp", "fc1")),
      ("mlp.fc2", ("mlp", "fc2")),
    ):
      rules |= linear(f"blocks.{i}.{torch_name}", (block, *path), expected)
  return rules


def _positions(shape: tuple[int, ...]):
  """`pos_embed` of any square grid with the model's width, resized to the model's grid."""
  _, count, d = shape
  grid = math.isqrt(count - 1)

  def convert(value):
    value = np.asarray(value)
    n = math.isqrt(max(value.shape[1] - 1, 0)) if value.ndim == 3 else 0
    if value.ndim != 3 or value.shape[::2] != (1, d) or n < 1 or n * n + 1 != value.shape[1]:
      raise CheckpointError(
        f"pos_embed: expected shape (1, 1 + n*n, {d}) for this model, got {value.shape}"
      )
    patches = interpolate_positions(value[0, 1:], grid)
    return {("pos_embed",): np.concatenate([value[0, :1], patches])[None]}

  return convert
