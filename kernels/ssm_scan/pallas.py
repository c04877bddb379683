"""Pallas kernel for the diagonal linear recurrence `h_t = a_t * h_{t-1} + b_t` (`core/nn/ssm.py`).

Which kernel runs follows the platform the program is lowered for, not the machine that traces it
(`lax.platform_dependent`): a program compiled or exported for TPU gets the Mosaic TPU kernel, one for
GPU the Triton kernel, one for CPU the Pallas interpreter. `interpret=True` forces the interpreter
everywhere, `interpret=False` the compiled kernels (lowering those for CPU fails). Under a context
mesh (`jax.set_mesh`) a compiled kernel runs per device, the batch split over the mesh
(`kernels/partitioning.py`): XLA cannot partition a Pallas call itself.

Layout. Complex inputs travel as separate real and imaginary float32 planes and the kernel does the
4-multiply complex FMA itself: Mosaic and Triton take no complex dtypes. Padded steps have `a = 1,
b = 0` (they keep the carry, so padding is harmless in both directions); padded lanes are sliced off.

Schedules and block sizes, per backend:
* TPU, Mosaic TPU (also the interpreter's default; `carry_in_grid=True`): grid `(batch, dim blocks,
  time chunks)` with the time axis last and "arbitrary" (sequential); the carry lives in a VMEM
  scratch row that persists across the time-chunk steps and is reset from `h0` on the first chunk.
  Blocks are `(1, chunk, lanes)`: `chunk` = `BlockSizes.time` (128) or T rounded up to 8, `lanes` =
  the whole `dim` when it fits `BlockSizes.dim` (a block may equal the full axis) else 128-lane
  blocks, so the last two block dims meet TPU's (8, 128) tiling for every shape. VMEM per step:
  2 buffers x 3 arrays x 2 planes x 128 x 128 x 4 B = 768 KiB (complex), far under the 16 MiB default.
* GPU, Triton (`carry_in_grid=False`): grid `(batch, dim blocks)`, because GPU programs run
  concurrently; each program walks all T rows in one `fori_loop` with the carry in registers. A
  Triton ref is a pointer into global memory: each step loads one `(1, lanes)` row of `a` and `b` and
  stores one of `h`, nothing is staged in shared memory, so any T fits (Mosaic GPU, which copies
  whole blocks into the 227 KiB of shared memory of an H100/H200, would need a pipeline over time
  chunks; at T = 256, dim = 128 the whole-axis blocks already need 385 KiB). Triton arrays must have
  power-of-two sizes: `lanes` is `dim` rounded up to a power of two, at most `BlockSizes.dim`; time
  is not padded. One warp per 32 lanes (at most 4).
Within a chunk (TPU) or the whole axis (GPU) a loop reads one row of `a`, `b`, updates the carry and
writes one row of `h`; `reverse=True` visits chunks and rows from the end (reversed `index_map`).

Backward (`jax.custom_vjp`). JAX's cotangents of a holomorphic map are the plain transpose of its JVP,
so for the forward recurrence with output cotangents `g`:
  lam_t = g_t + a_{t+1} lam_{t+1}      (the same kernel, reversed, on `a` shifted by one step)
  db_t = lam_t,   da_t = lam_t * h_{t-1},   dh0 = a_0 lam_0      (h_{-1} = h0),
and symmetrically for `reverse=True`. No conjugates appear; the tests check this against autodiff of
`reference.sequential_scan` for real and complex inputs.
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


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Steps per time chunk (a multiple of 8) and lanes per program (a multiple of 128)."""

  time: int = 128
  dim: int = 128

  def __post_init__(self):
    if self.time <= 0 or self.time % 8:
      raise ValueError(f"BlockSizes.time must be a positive multiple of 8, got {self.time}")
    if self.dim <= 0 or self.dim % 128:
      raise ValueError(f"BlockSizes.dim must be a positive multiple of 128, got {self.dim}")


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _complex_fma(a, h, b):
  """`a * h + b` on (real,) or (real, imag) planes."""
  if len(a) == 1:
    return (a[0] * h[0] + b[0],)
  (ar, ai), (hr, hi), (br, bi) = a, h, b
  return (ar * hr - ai * hi + br, ar * hi + ai * hr + bi)


def _scan_rows(a_refs, b_refs, h_refs, carry, *, start, steps, reverse):
  """Runs `steps` rows beginning at row `start` of the refs; returns the new carry."""

  def body(i, carry):
    row = start + (steps - 1 - i if reverse else i)
    a = tuple(r[0, pl.ds(row, 1), :] for r in a_refs)
    b = tuple(r[0, pl.ds(row, 1), :] for r in b_refs)
    carry = _complex_fma(a, carry, b)
    for ref, value in zip(h_refs, carry, strict=True):
      ref[0, pl.ds(row, 1), :] = value
    return carry

  return jax.lax.fori_loop(0, steps, body, carry)


def _grid_carry_kernel(*refs, planes, chunk, reverse):
  """One (batch, dim block, time chunk) grid step; the carry persists in scratch across chunks."""
  a_refs, b_refs, h0_refs = refs[:planes], refs[planes : 2 * planes], refs[2 * planes : 3 * planes]
  h_refs, carry_refs = refs[3 * planes : 4 * planes], refs[4 * planes :]

  @pl.when(pl.program_id(2) == 0)
  def _():
    for carry_ref, h0_ref in zip(carry_refs, h0_refs, strict=True):
      carry_ref[...] = h0_ref[0]

  carry = tuple(r[...] for r in carry_refs)
  carry = _scan_rows(a_refs, b_refs, h_refs, carry, start=0, steps=chunk, reverse=reverse)
  for carry_ref, value in zip(carry_refs, carry, strict=True):
    carry_ref[...] = value


def _looped_kernel(*refs, planes, time, reverse):
  """One (batch, dim block) program walking every time step itself (GPU schedule)."""
  a_refs, b_refs, h0_refs = refs[:planes], refs[planes : 2 * planes], refs[2 * planes : 3 * planes]
  h_refs = refs[3 * planes :]
  carry = tuple(r[0] for r in h0_refs)
  _scan_rows(a_refs, b_refs, h_refs, carry, start=0, steps=time, reverse=reverse)


def _pad(x, time: int, dim: int, value: float):
  _, t, d = x.shape
  return jnp.pad(x, ((0, 0), (0, time - t), (0, dim - d)), constant_values=value)


def _planes(x) -> tuple[jax.Array, ...]:
  if jnp.iscomplexobj(x):
    return (jnp.real(x).astype(jnp.float32), jnp.imag(x).astype(jnp.float32))
  return (x.astype(jnp.float32),)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Blocks of one call: `chunk` steps per time block, `lanes` per dim block, padded extents."""

  chunk: int
  padded_time: int
  lanes: int
  padded_dim: int

  @property
  def num_chunks(self) -> int:
    return self.padded_time // self.chunk


def tpu_layout(time: int, dim: int, block_sizes: BlockSizes = BlockSizes()) -> Layout:
  """(multiple of 8, multiple of 128 or the full dim) blocks; time padded to whole chunks."""
  chunk = min(block_sizes.time, _round_up(time, 8))
  lanes = dim if dim <= block_sizes.dim else block_sizes.dim
  return Layout(chunk, _round_up(time, chunk), lanes, _round_up(dim, lanes))


def gpu_layout(time: int, dim: int, block_sizes: BlockSizes = BlockSizes()) -> Layout:
  """One block over the whole time axis (never loaded whole); power-of-two lanes."""
  lanes = min(block_sizes.dim, pl.next_power_of_2(dim))
  return Layout(time, time, lanes, _round_up(dim, lanes))


def _grid_carry_call(layout: Layout, batch: int, planes: int, reverse: bool, interpret: bool):
  last = layout.num_chunks - 1

  def time_block(i, j, c):
    return (i, last - c if reverse else c, j)

  seq_spec = pl.BlockSpec((1, layout.chunk, layout.lanes), time_block)
  h0_spec = pl.BlockSpec((1, 1, layout.lanes), lambda i, j, c: (i, 0, j))
  shape = (batch, layout.padded_time, layout.padded_dim)
  return pl.pallas_call(
    functools.partial(_grid_carry_kernel, planes=planes, chunk=layout.chunk, reverse=reverse),
    out_shape=[jax.ShapeDtypeStruct(shape, jnp.float32)] * planes,
    grid=(batch, layout.padded_dim // layout.lanes, layout.num_chunks),
    in_specs=[seq_spec] * (2 * planes) + [h0_spec] * planes,
    out_specs=[seq_spec] * planes,
    scratch_shapes=[pltpu.VMEM((1, layout.lanes), jnp.float32)] * planes,
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    interpret=interpret,
    name="ssm_scan_tpu",
  )


def _looped_call(layout: Layout, batch: int, planes: int, reverse: bool, interpret: bool):
  seq_spec = pl.BlockSpec((1, layout.padded_time, layout.lanes), lambda i, j: (i, 0, j))
  h0_spec = pl.BlockSpec((1, 1, layout.lanes), lambda i, j: (i, 0, j))
  shape = (batch, layout.padded_time, layout.padded_dim)
  kernel = functools.partial(
    _looped_kernel, planes=planes, time=layout.padded_time, reverse=reverse
  )
  return pl.pallas_call(
    kernel,
    out_shape=[jax.ShapeDtypeStruct(shape, jnp.float32)] * planes,
    grid=(batch, layout.padded_dim // layout.lanes),
    in_specs=[seq_spec] * (2 * planes) + [h0_spec] * planes,
    out_specs=[seq_spec] * planes,
    compiler_params=None
    if interpret
    else pltriton.CompilerParams(num_warps=max(1, min(4, layout.lanes // 32))),
    interpret=interpret,
    name="ssm_scan_gpu",
  )


def _scan_planes(a, b, h0, *, reverse, block_sizes, interpret, carry_in_grid):
  """One schedule on `[batch, time, dim]` arrays of one dtype; returns `h` in that dtype."""
  batch, time, dim = a.shape
  layout = (tpu_layout if carry_in_grid else gpu_layout)(time, dim, block_sizes)
  t, d = layout.padded_time, layout.padded_dim
  # A padded step has a = 1 (real part 1, imaginary part 0) and b = 0: it keeps the carry.
  a_planes = [_pad(p, t, d, 0.0 if k else 1.0) for k, p in enumerate(_planes(a))]
  b_planes = [_pad(p, t, d, 0.0) for p in _planes(b)]
  h0_planes = [_pad(p[:, None, :], 1, d, 0.0) for p in _planes(h0)]
  planes = len(a_planes)
  make_call = _grid_carry_call if carry_in_grid else _looped_call
  h = make_call(layout, batch, planes, reverse, interpret)(*a_planes, *b_planes, *h0_planes)
  h = [p[:, :time, :dim] for p in h]
  out = h[0] if planes == 1 else jax.lax.complex(h[0], h[1])
  return out.astype(a.dtype)


def _compiled(kernel):
  """A compiled kernel, per device under a context mesh (`kernels/partitioning.py`)."""
  return functools.partial(partitioning.split_leading_axis, kernel)


def _per_platform(a, b, h0, reverse, block_sizes, interpret, carry_in_grid):
  """The schedule of the platform the program is lowered for (see the module docstring)."""
  run = functools.partial(_scan_planes, reverse=reverse, block_sizes=block_sizes)
  interpreter = functools.partial(
    run, interpret=True, carry_in_grid=True if carry_in_grid is None else carry_in_grid
  )
  if interpret:
    return interpreter(a, b, h0)
  gpu = _compiled(functools.partial(run, interpret=False, carry_in_grid=False))
  tpu = _compiled(functools.partial(run, interpret=False, carry_in_grid=True))
  branches = dict(cuda=gpu, rocm=gpu, default=tpu)
  if interpret is None:
    branches["cpu"] = interpreter
  return jax.lax.platform_dependent(a, b, h0, **branches)


def _shifted_a(a, reverse: bool):
  """`a` of the step after each step in scan order (0 past the end): the adjoint recurrence's `a`."""
  zero = jnp.zeros_like(a[:, :1])
  return jnp.concatenate([zero, a[:, :-1]], 1) if reverse else jnp.concatenate([a[:, 1:], zero], 1)


def _previous_h(h, h0, reverse: bool):
  """The state each step read (`h_{t-1}`, or `h_{t+1}` for `reverse`), with `h0` at the start."""
  h0 = h0[:, None, :]
  return jnp.concatenate([h[:, 1:], h0], 1) if reverse else jnp.concatenate([h0, h[:, :-1]], 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _scan(a, b, h0, reverse, block_sizes, interpret, carry_in_grid):
  return _per_platform(a, b, h0, reverse, block_sizes, interpret, carry_in_grid)


def _scan_fwd(a, b, h0, reverse, block_sizes, interpret, carry_in_grid):
  h = _scan(a, b, h0, reverse, block_sizes, interpret, carry_in_grid)
  return h, (a, h, h0)


def _scan_bwd(reverse, block_sizes, interpret, carry_in_grid, residuals, g):
  a, h, h0 = residuals
  lam = _scan(
    _shifted_a(a, reverse),
    g,
    jnp.zeros_like(h0),
    not reverse,
    block_sizes,
    interpret,
    carry_in_grid,
  )
  da = lam * _previous_h(h, h0, reverse)
  first = -1 if reverse else 0
  dh0 = a[:, first] * lam[:, first]
  return da, lam, dh0


_scan.defvjp(_scan_fwd, _scan_bwd)


def ssm_scan_pallas(
  a: jax.Array,
  b: jax.Array,
  h0: jax.Array,
  *,
  reverse: bool = False,
  block_sizes: BlockSizes = BlockSizes(),
  interpret: bool | None = None,
  carry_in_grid: bool | None = None,
) -> jax.Array:
  """The Pallas scan on validated arrays of one dtype (see `kernels.ssm_scan.api.ssm_scan`).

  Args:
    a, b: `[batch, time, dim]`, float or complex, same dtype.
    h0: `[batch, dim]`, same dtype.
    reverse: run from the last step to the first.
    block_sizes: chunk length and lane block.
    interpret: True: the Pallas interpreter on every platform; False: the compiled kernel of the
      platform lowered for (Triton on GPU, Mosaic on TPU; none exists for CPU); None: the
      interpreter when lowered for CPU, the compiled kernel otherwise.
    carry_in_grid: the interpreter's schedule: the TPU one (carry in scratch across grid steps,
      default) or, False, the GPU one (each program loops over time). Compiled kernels always use
      their platform's schedule.
  """
  return _scan(a, b, h0, reverse, block_sizes, interpret, carry_in_grid)
