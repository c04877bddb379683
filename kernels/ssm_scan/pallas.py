"""Pallas kernel for the diagonal linear recurrence `h_t = a_t * h_{t-1} + b_t` (spec Sec. 8).

Layout. Inputs `[batch, time, dim]` are padded to whole blocks: `dim` to `BlockSizes.dim` lanes (a
single block when `dim` fits, as TPU allows a block equal to the full axis), `time` to whole chunks of
`BlockSizes.time` steps with `a = 1, b = 0` (a padded step leaves the carry unchanged, so padding is
harmless in both directions). Complex inputs travel as separate real and imaginary float32 planes and
the kernel does the 4-multiply complex FMA itself: Mosaic (TPU) and Triton (GPU) lowerings take no
complex dtypes.

Two schedules of the same chunk loop:
* `carry_in_grid=True` (TPU, and interpret mode on CPU): grid `(batch, dim blocks, time chunks)` with
  the time axis last and "arbitrary" (sequential); the carry lives in a VMEM scratch buffer that
  persists across the time-chunk grid steps and is reset from `h0` on the first chunk.
* `carry_in_grid=False` (GPU): grid `(batch, dim blocks)`, because Triton runs grid programs
  concurrently; each program walks its chunks in a `fori_loop` with the carry held in registers.
Within a chunk a `fori_loop` over its steps reads one row of `a`, `b`, updates the carry and writes one
row of `h`; `reverse=True` visits chunks and rows from the end (reversed `index_map`).

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


def _scan_chunk(a_refs, b_refs, h_refs, carry, *, start, steps, reverse):
  """Runs `steps` rows of one chunk beginning at row `start` of the refs; returns the new carry."""

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
  carry = _scan_chunk(a_refs, b_refs, h_refs, carry, start=0, steps=chunk, reverse=reverse)
  for carry_ref, value in zip(carry_refs, carry, strict=True):
    carry_ref[...] = value


def _looped_kernel(*refs, planes, chunk, num_chunks, reverse):
  """One (batch, dim block) program walking every time chunk itself (GPU schedule)."""
  a_refs, b_refs, h0_refs = refs[:planes], refs[planes : 2 * planes], refs[2 * planes : 3 * planes]
  h_refs = refs[3 * planes :]

  def over_chunks(c, carry):
    index = num_chunks - 1 - c if reverse else c
    start = pl.multiple_of(index * chunk, chunk)
    return _scan_chunk(a_refs, b_refs, h_refs, carry, start=start, steps=chunk, reverse=reverse)

  carry = tuple(r[0] for r in h0_refs)
  jax.lax.fori_loop(0, num_chunks, over_chunks, carry)


def _pad(x, time: int, dim: int, value: float):
  _, t, d = x.shape
  return jnp.pad(x, ((0, 0), (0, time - t), (0, dim - d)), constant_values=value)


def _planes(x) -> tuple[jax.Array, ...]:
  if jnp.iscomplexobj(x):
    return (jnp.real(x).astype(jnp.float32), jnp.imag(x).astype(jnp.float32))
  return (x.astype(jnp.float32),)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Chunking and padding of one call: `chunk` steps per chunk, `num_chunks` visited chunks."""

  chunk: int
  num_chunks: int
  padded_time: int
  block_dim: int
  padded_dim: int


def _layout(time: int, dim: int, block_sizes: BlockSizes, carry_in_grid: bool) -> _Layout:
  if carry_in_grid:  # TPU: blocks of (multiple of 8, multiple of 128 or the full dim)
    chunk = min(block_sizes.time, _round_up(time, 8))
    block_dim = dim if dim <= block_sizes.dim else block_sizes.dim
  else:  # GPU: the whole (power-of-two padded) time axis is one block; chunks never visited are padding
    chunk = min(block_sizes.time, max(8, pl.next_power_of_2(time)))
    block_dim = block_sizes.dim
  num_chunks = -(-time // chunk)
  padded_chunks = num_chunks if carry_in_grid else pl.next_power_of_2(num_chunks)
  return _Layout(chunk, num_chunks, chunk * padded_chunks, block_dim, _round_up(dim, block_dim))


def _grid_carry_call(layout: _Layout, batch: int, planes: int, reverse: bool, interpret: bool):
  last = layout.num_chunks - 1

  def time_block(i, j, c):
    return (i, last - c if reverse else c, j)

  seq_spec = pl.BlockSpec((1, layout.chunk, layout.block_dim), time_block)
  h0_spec = pl.BlockSpec((1, 1, layout.block_dim), lambda i, j, c: (i, 0, j))
  shape = (batch, layout.padded_time, layout.padded_dim)
  return pl.pallas_call(
    functools.partial(_grid_carry_kernel, planes=planes, chunk=layout.chunk, reverse=reverse),
    out_shape=[jax.ShapeDtypeStruct(shape, jnp.float32)] * planes,
    grid=(batch, layout.padded_dim // layout.block_dim, layout.num_chunks),
    in_specs=[seq_spec] * (2 * planes) + [h0_spec] * planes,
    out_specs=[seq_spec] * planes,
    scratch_shapes=[pltpu.VMEM((1, layout.block_dim), jnp.float32)] * planes,
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    interpret=interpret,
  )


def _looped_call(layout: _Layout, batch: int, planes: int, reverse: bool, interpret: bool):
  seq_spec = pl.BlockSpec((1, layout.padded_time, layout.block_dim), lambda i, j: (i, 0, j))
  h0_spec = pl.BlockSpec((1, 1, layout.block_dim), lambda i, j: (i, 0, j))
  shape = (batch, layout.padded_time, layout.padded_dim)
  kernel = functools.partial(
    _looped_kernel, planes=planes, chunk=layout.chunk, num_chunks=layout.num_chunks, reverse=reverse
  )
  return pl.pallas_call(
    kernel,
    out_shape=[jax.ShapeDtypeStruct(shape, jnp.float32)] * planes,
    grid=(batch, layout.padded_dim // layout.block_dim),
    in_specs=[seq_spec] * (2 * planes) + [h0_spec] * planes,
    out_specs=[seq_spec] * planes,
    interpret=interpret,
  )


def _scan_planes(a, b, h0, *, reverse, block_sizes, interpret, carry_in_grid):
  """The kernel on `[batch, time, dim]` arrays of one dtype; returns `h` in that dtype."""
  batch, time, dim = a.shape
  layout = _layout(time, dim, block_sizes, carry_in_grid)
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
  return _scan_planes(
    a,
    b,
    h0,
    reverse=reverse,
    block_sizes=block_sizes,
    interpret=interpret,
    carry_in_grid=carry_in_grid,
  )


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
    interpret: run the kernel in the Pallas interpreter; default: on CPU only.
    carry_in_grid: the TPU/interpret schedule (carry in scratch across grid steps) rather than the GPU
      one (each program loops over chunks); default: False on GPU, True elsewhere.
  """
  backend = jax.default_backend()
  if interpret is None:
    interpret = backend == "cpu"
  if carry_in_grid is None:
    carry_in_grid = backend != "gpu"
  return _scan(a, b, h0, reverse, block_sizes, interpret, carry_in_grid)
