"""Pallas kernel: one pass over each block's features computes both L1 sums and overwrites the store.

Each program reads one tile of `current` and `previous`, writes its two partial L1 sums folded to an
`(8, width)` slab (rows added in groups of 8: vector adds only, no cross-lane reduction), and writes
`current` into the output that aliases `previous` (`input_output_aliases`), so the stored features are
updated in place. The wrapper adds the slabs of each block. Zero padding adds nothing to either sum.

Which kernel runs follows the platform the program is lowered for (`lax.platform_dependent`): the
interpreter for CPU (unless `interpret=False`), Mosaic TPU for TPU, Triton for GPU; under a context
mesh (`jax.set_mesh`) the compiled kernel runs per device, the cache blocks split over the mesh
(`kernels/partitioning.py`). Views and tiles:
* TPU, Mosaic TPU: `(N, B, L, D)` is viewed as `(N, B * L, D)` (free in TPU's tiled layout when L is
  a multiple of 8, as the configs' token counts are) and tiled `(tile, D)`: `D` whole (a block may
  equal the full axis), `tile` a multiple of 8 sublanes (16 for 16-bit, 32 for 8-bit dtypes) sized
  so one block holds about 1 MiB (`D` padded to 128 lanes in VMEM): 3 arrays x 2 buffers = 6 MiB of
  VMEM, under the 16 MiB scoped default of every TPU generation. Rows are padded to whole tiles.
* GPU, Triton: `(N, B * L * D)` is viewed as lane-dense `(N, R, 128)` rows (free for GPU's row-major
  arrays; Triton needs power-of-two tiles and `D` rarely is one) with `GPU_TILE_ROWS` = 64-row tiles
  over `GPU_WARPS` = 8 warps: 32 values per thread per input, in registers. Not Mosaic GPU: its
  block copies need 16-byte row strides, and (jax 0.10.2) it does not lower the row reduction ("No
  support for axes yet").
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from kernels import partitioning
from kernels.block_cache.reference import _ratio

LANES = 128
TPU_BLOCK_BYTES = 1 << 20
GPU_TILE_ROWS = 64
GPU_WARPS = 8
FOLD = 8  # rows of the partial-sum slab each program writes


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Layout:
  """`(blocks, rows, width)` view of `(N, B, L, D)`, tiled `(tile, width)`, rows padded to tiles."""

  rows: int
  width: int
  tile: int
  lane_dense: bool  # the flat (R, 128) view rather than (B * L, D)

  @property
  def padded_rows(self) -> int:
    return _round_up(self.rows, self.tile)

  @property
  def tiles(self) -> int:
    return self.padded_rows // self.tile


def _sublanes(dtype) -> int:
  """Rows of one TPU tile of `dtype`: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit values."""
  return FOLD * max(1, 4 // jnp.dtype(dtype).itemsize)


def tpu_layout(shape, dtype, tile_rows: int | None = None) -> Layout:
  rows, width = shape[1] * shape[2], shape[3]
  sublanes = _sublanes(dtype)
  if tile_rows is None:
    row_bytes = _round_up(width, LANES) * jnp.dtype(dtype).itemsize
    tile_rows = max(sublanes, TPU_BLOCK_BYTES // row_bytes // sublanes * sublanes)
  return Layout(rows, width, min(_round_up(tile_rows, sublanes), _round_up(rows, sublanes)), False)


def gpu_layout(shape, dtype, tile_rows: int | None = None) -> Layout:
  del dtype
  rows = -(-shape[1] * shape[2] * shape[3] // LANES)
  tile = min(tile_rows or GPU_TILE_ROWS, pl.next_power_of_2(max(rows, FOLD)))
  return Layout(rows, LANES, pl.next_power_of_2(max(tile, FOLD)), True)


def _fold(x):
  """`(tile, w)` -> `(8, w)`: row groups of 8 added."""
  return jnp.sum(x.reshape(x.shape[0] // FOLD, FOLD, x.shape[1]), axis=0)


def _kernel(current_ref, previous_ref, new_previous_ref, diff_ref, norm_ref):
  current = current_ref[0].astype(jnp.float32)
  previous = previous_ref[0].astype(jnp.float32)
  diff_ref[0, 0] = _fold(jnp.abs(current - previous))
  norm_ref[0, 0] = _fold(jnp.abs(previous))
  new_previous_ref[...] = current_ref[...]


def _as_view(x, layout: Layout):
  blocks = x.shape[0]
  x = x.reshape(blocks, -1) if layout.lane_dense else x.reshape(blocks, layout.rows, layout.width)
  if layout.lane_dense:
    x = jnp.pad(x, ((0, 0), (0, layout.padded_rows * LANES - x.shape[1])))
    return x.reshape(blocks, layout.padded_rows, LANES)
  return jnp.pad(x, ((0, 0), (0, layout.padded_rows - layout.rows), (0, 0)))


def _from_view(x, shape, layout: Layout):
  if layout.lane_dense:
    return x.reshape(shape[0], -1)[:, : shape[1] * shape[2] * shape[3]].reshape(shape)
  return x[:, : layout.rows].reshape(shape)


def _compiler_params(target: str):
  if target == "tpu":
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
  if target == "gpu":
    return pltriton.CompilerParams(num_warps=GPU_WARPS)
  return None


def fused_update(current, previous, *, layout: Layout, target: str):
  """The kernel for `target` ("tpu", "gpu" or "interpret") on `layout`'s view."""
  blocks, shape = current.shape[0], current.shape
  feature_spec = pl.BlockSpec((1, layout.tile, layout.width), lambda n, r: (n, r, 0))
  sum_spec = pl.BlockSpec((1, 1, FOLD, layout.width), lambda n, r: (n, r, 0, 0))
  sums = jax.ShapeDtypeStruct((blocks, layout.tiles, FOLD, layout.width), jnp.float32)
  new_previous, diff, norm = pl.pallas_call(
    _kernel,
    grid=(blocks, layout.tiles),
    in_specs=[feature_spec, feature_spec],
    out_specs=[feature_spec, sum_spec, sum_spec],
    out_shape=[
      jax.ShapeDtypeStruct((blocks, layout.padded_rows, layout.width), previous.dtype),
      sums,
      sums,
    ],
    input_output_aliases={1: 0},
    compiler_params=_compiler_params(target),
    interpret=target == "interpret",
    name=f"relative_l1_update_{target}",
  )(_as_view(current, layout), _as_view(previous, layout))
  indicator = _ratio(diff.sum(axis=(1, 2, 3)), norm.sum(axis=(1, 2, 3)))
  return indicator, _from_view(new_previous, shape, layout)


def _for_target(target: str, tile_rows: int | None):
  make_layout = gpu_layout if target == "gpu" else tpu_layout

  def run(current, previous):
    layout = make_layout(current.shape, current.dtype, tile_rows)
    return fused_update(current, previous, layout=layout, target=target)

  return run


@functools.partial(jax.jit, static_argnames=("tile_rows", "interpret"))
def relative_l1_update(
  current: jax.Array,
  previous: jax.Array,
  *,
  tile_rows: int | None = None,
  interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
  """The fused kernel on `[blocks, batch, tokens, dim]` arrays of one shape.

  Args:
    tile_rows: rows per tile of the platform's view (see the module docstring); default: sized
      per platform.
    interpret: True: the Pallas interpreter (TPU view) everywhere; False: the compiled kernel of the
      platform lowered for; None: the interpreter when lowered for CPU, compiled otherwise.
  """
  if interpret:
    return _for_target("interpret", tile_rows)(current, previous)
  gpu = functools.partial(partitioning.split_leading_axis, _for_target("gpu", tile_rows))
  tpu = functools.partial(partitioning.split_leading_axis, _for_target("tpu", tile_rows))
  branches = dict(cuda=gpu, rocm=gpu, default=tpu)
  if interpret is None:
    branches["cpu"] = _for_target("interpret", tile_rows)
  return jax.lax.platform_dependent(current, previous, **branches)
