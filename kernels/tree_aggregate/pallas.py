"""Pallas kernels for the two-pass tree aggregation (bottom-up S, top-down H; see `xla.py`).

Both take a batch of K trees in BFS row order (`layout.py`) and run on a grid `(tree, feature block)`:
each program owns the `[rows, lanes]` columns of x, S and H of one tree and sweeps them twice. Which
kernel runs follows the platform the program is lowered for (`lax.platform_dependent`): the
interpreter for CPU (unless `interpret=False`), `_level_kernel` on Triton for GPU, `_row_kernel` on
Mosaic TPU for TPU. Under a context mesh (`jax.set_mesh`) the compiled kernel runs per device, the
trees split over the mesh (`kernels/partitioning.py`).

GPU, Triton: `_level_kernel`. Each sweep walks the depth levels and each level's contiguous rows in
blocks of `block` (16 or 32) rows:
* bottom-up (deepest level first): messages `w_up * S` of a block are summed per parent with a
  `block x block` equality matrix (`same[i, j] = parent[i] == parent[j]`, one small matmul at full
  f32 precision), so rows that share a parent write the same total and the indexed read-modify-write
  `S[parent] += total` has no write conflict (no atomics);
* top-down (root level first): `H = S + w_down * (H[parent] - w_up * S)`, a row gather from the
  finished level above.
A Triton ref points into global memory, so the columns are never staged in shared memory (any n
fits; Mosaic GPU would need all of them in its 227 KiB) and a barrier after each block makes one
block's writes visible to the next. Lanes: `f` rounded up to a power of two, at least 16 (the
matmul's minimum) and at most 128.

TPU, Mosaic TPU: `_row_kernel`. Mosaic has no vector-indexed (gather/scatter) access to VMEM, so the
sweeps go one row at a time with scalar parent indices read from SMEM: bottom-up in reverse BFS
order `S[parent(i)] += w_up[i] * S[i]`, top-down in BFS order. 2n dependent row updates of one
`(1, lanes)` vector each per program. Lanes: `f` whole up to 128 (a block may equal the full axis),
else 128-lane blocks. The columns of x, S, H (and per-channel weights) live in VMEM, double
buffered, lanes padded to 128: 3 KiB per row (5 KiB with per-channel weights). The scoped limit is
raised to fit, so n is bounded by the chip's VMEM: some 40k nodes (25k) on a 128 MiB v5e/v6e core,
10k (6k) on a 32 MiB v4 core. Parent rows and per-edge weights of all K trees sit whole in SMEM:
12 B per row of its 1 MiB, so K * n up to some 80k (the FGL forest: 8 trees of 1.5k nodes).

The interpreter runs `_level_kernel` by default (`kernel="row"` runs the TPU one), without barriers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from kernels import partitioning

KERNELS = ("level", "row")
_VMEM_ROW_BYTES = 128 * 4  # a row of f32 lanes padded to 128 in VMEM


def _level_kernel(meta_ref, parent_ref, x_ref, up_ref, down_ref, s_ref, h_ref, *, block, barrier):
  rows = x_ref.shape[0]
  dummy = rows - 1
  num_levels = meta_ref[0]
  offsets = lax.iota(jnp.int32, block)

  def for_blocks(level, body):
    start, end = meta_ref[1 + level], meta_ref[2 + level]

    def step(b, carry):
      body(start + b * block, end)
      barrier()
      return carry

    lax.fori_loop(0, (end - start + block - 1) // block, step, 0)

  def copy(src, dst):
    def body(b, c):
      dst[pl.ds(b * block, block), :] = src[pl.ds(b * block, block), :]
      return c

    lax.fori_loop(0, rows // block, body, 0)
    barrier()

  def up_block(start, end):
    valid = start + offsets < end
    rows_ = pl.ds(start, block)
    message = jnp.where(valid[:, None], up_ref[rows_, :] * s_ref[rows_, :], 0.0)
    target = jnp.where(valid, parent_ref[rows_], dummy)
    same = (target[:, None] == target[None, :]).astype(message.dtype)
    total = jnp.dot(
      same, message, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    ).astype(message.dtype)
    s_ref[target, :] = s_ref[target, :] + total

  def down_block(start, end):
    valid = start + offsets < end
    rows_ = pl.ds(start, block)
    s_rows = s_ref[rows_, :]
    parent_h = h_ref[jnp.where(valid, parent_ref[rows_], dummy), :]
    new = s_rows + down_ref[rows_, :] * (parent_h - up_ref[rows_, :] * s_rows)
    h_ref[rows_, :] = jnp.where(valid[:, None], new, h_ref[rows_, :])

  def bottom_up(i, carry):
    for_blocks(num_levels - 1 - i, up_block)
    return carry

  def top_down(level, carry):
    for_blocks(level, down_block)
    return carry

  copy(x_ref, s_ref)
  lax.fori_loop(0, num_levels - 1, bottom_up, 0)
  copy(s_ref, h_ref)
  lax.fori_loop(1, num_levels, top_down, 0)


def _row_kernel(parent_ref, x_ref, up_ref, down_ref, s_ref, h_ref, *, n, per_channel):
  tree = pl.program_id(0)

  def weight(ref, i):
    return ref[pl.ds(i, 1), :] if per_channel else ref[tree, i]

  def up(k, carry):
    i = n - 1 - k
    parent = pl.ds(parent_ref[tree, i], 1)
    s_ref[parent, :] = s_ref[parent, :] + weight(up_ref, i) * s_ref[pl.ds(i, 1), :]
    return carry

  def down(i, carry):
    s_i = s_ref[pl.ds(i, 1), :]
    outside = h_ref[pl.ds(parent_ref[tree, i], 1), :] - weight(up_ref, i) * s_i
    h_ref[pl.ds(i, 1), :] = s_i + weight(down_ref, i) * outside
    return carry

  s_ref[...] = x_ref[...]
  lax.fori_loop(0, n, up, 0)
  h_ref[...] = s_ref[...]
  lax.fori_loop(0, n, down, 0)


def lanes(f: int, target: str) -> int:
  """Feature columns per program (see the module docstring); f is padded to a multiple."""
  if target == "gpu":
    return max(16, min(128, pl.next_power_of_2(f)))
  return f if f <= 128 else 128


def _pad_columns(x, width: int):
  return jnp.pad(x, ((0, 0), (0, 0), (0, width - x.shape[2])))


def _level_call(x, up, down, parent_row, level_ptr, num_levels, *, block, target):
  trees, rows, width = x.shape
  fb = lanes(width, target)
  meta = jnp.concatenate([num_levels[:, None], level_ptr], axis=1).astype(jnp.int32)
  tile = pl.BlockSpec((None, rows, fb), lambda k, j: (k, 0, j))
  weight_spec = tile if up.shape[2] != 1 else pl.BlockSpec((None, rows, 1), lambda k, j: (k, 0, 0))
  gpu = target == "gpu"
  kernel = functools.partial(
    _level_kernel, block=block, barrier=pltriton.debug_barrier if gpu else lambda: None
  )
  return pl.pallas_call(
    kernel,
    grid=(trees, width // fb),
    in_specs=[
      pl.BlockSpec((None, meta.shape[1]), lambda k, j: (k, 0)),
      pl.BlockSpec((None, rows), lambda k, j: (k, 0)),
      tile,
      weight_spec,
      weight_spec,
    ],
    out_specs=[tile, tile],
    out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2,
    compiler_params=pltriton.CompilerParams(num_warps=4) if gpu else None,
    interpret=not gpu,
    name="tree_aggregate_levels",
  )(meta, parent_row, x, up, down)


def _row_call(x, up, down, parent_row, level_ptr, num_levels, *, block, target):
  del block, num_levels
  trees, rows, width = x.shape
  fb = lanes(width, target)
  per_channel = up.shape[2] != 1
  tile = pl.BlockSpec((None, rows, fb), lambda k, j: (k, 0, j))
  scalars = pl.BlockSpec(memory_space=pltpu.SMEM)  # whole [K, rows] arrays
  if not per_channel:
    up, down = up[..., 0], down[..., 0]
  weight_spec = tile if per_channel else scalars
  vmem_bytes = 2 * (5 if per_channel else 3) * rows * _VMEM_ROW_BYTES
  kernel = functools.partial(_row_kernel, n=level_ptr.shape[1] - 1, per_channel=per_channel)
  return pl.pallas_call(
    kernel,
    grid=(trees, width // fb),
    in_specs=[scalars, tile, weight_spec, weight_spec],
    out_specs=[tile, tile],
    out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2,
    compiler_params=pltpu.CompilerParams(
      dimension_semantics=("parallel", "parallel"),
      vmem_limit_bytes=max(32 << 20, vmem_bytes + (8 << 20)),
    ),
    interpret=target == "interpret",
    name="tree_aggregate_rows",
  )(parent_row, x, up, down)


def _two_pass(x, up, down, parent_row, level_ptr, num_levels, *, block, target, kernel):
  """Pads the feature columns to whole lane blocks, runs `kernel` for `target`, slices back."""
  f = x.shape[2]
  fb = lanes(f, target)
  width = -(-f // fb) * fb
  x = _pad_columns(x, width)
  if up.shape[2] != 1:
    up, down = _pad_columns(up, width), _pad_columns(down, width)
  call = _level_call if kernel == "level" else _row_call
  s, h = call(x, up, down, parent_row, level_ptr, num_levels, block=block, target=target)
  return s[..., :f], h[..., :f]


def _compiled(kernel):
  """A compiled kernel, per device under a context mesh (`kernels/partitioning.py`)."""
  return functools.partial(partitioning.split_leading_axis, kernel)


@functools.partial(jax.jit, static_argnames=("block", "interpret", "kernel"))
def pallas_two_pass(
  x,
  weight_up,
  weight_down,
  parent_row,
  level_ptr,
  num_levels,
  *,
  block: int,
  interpret: bool | None = None,
  kernel: str = "level",
):
  """Two-pass aggregation of K trees' BFS-sorted rows; returns (S, H), each [K, rows, f].

  `x` is [K, rows, f], the weights [K, rows, 1 or f], `parent_row` [K, rows], `level_ptr` [K, n + 1],
  `num_levels` [K]. `interpret`: True: the interpreter running `kernel` ("level" or "row") on every
  platform; False: the compiled kernel of the platform lowered for; None: the interpreter when
  lowered for CPU, compiled otherwise.
  """
  if kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  args = (x, weight_up, weight_down, parent_row, level_ptr, num_levels)
  run = functools.partial(_two_pass, block=block)
  interpreter = functools.partial(run, target="interpret", kernel=kernel)
  if interpret:
    return interpreter(*args)
  gpu = _compiled(functools.partial(run, target="gpu", kernel="level"))
  tpu = _compiled(functools.partial(run, target="tpu", kernel="row"))
  branches = dict(cuda=gpu, rocm=gpu, default=tpu)

  if interpret is None:
    branches["cpu"] = interpreter
  return lax.platform_dependent(*args, **branches)
