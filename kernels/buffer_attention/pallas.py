"""Pallas kernel: decode attention over one shared context K/V and per-sample buffer K/V.

The autoregressive buffer of "Efficient Autoregressive Inference for Transformer Probabilistic
Models" (ICLR 2026) samples B joint streams from ONE encoded context: each decode query of
stream b reads the context's cached K/V (shared by every stream) and the K/V of stream b's own
buffer, under one softmax (App. A.1). Broadcasting the context to the B streams costs B x N x D
memory traffic per head; this kernel never materialises it: one program takes a block of streams,
walks the shared context once in tiles with an online softmax (Milakov & Gimelshein 2018; the
running max / sum of FlashAttention-2 and of JAX's `pallas/ops/gpu/decode_attention.py`, whose
update this follows), then merges the block's buffers into the same running softmax.

Layout (per kv head; `G` query heads share a kv head, as in grouped-query attention):
  rows     the `Q x G` queries of a stream, padded to a power of two `R`, for `b_blk` streams per
           program: a `[b_blk R, D]` block of queries; a query's visible buffer length rides along as
           a `[b_blk R, 1]` int32 block.
  context  `[N, D]` per kv head (or per stream when every stream has its own context, then
           `b_blk = 1`), one block; the kernel loops over `block_n`-key tiles of it with
           `fori_loop`, masking keys past N.
  buffer   the `b_blk` streams' buffers flattened to `[b_blk S, D]` (S padded to a power of two):
           one dot for the whole block, with the in-kernel mask "same stream and slot < length"
           (row >> log2 R == key >> log2 S, key & (S - 1) < length), so no dense mask array exists.
Grid `(kv_heads, stream blocks)`, both parallel. Every block dimension is a power of two >= 16 (what
Triton's `tl.dot` needs; also a multiple of TPU's 8 sublanes, and D and N are whole-array block
dims, which Mosaic accepts). Padding: D with zeros (no effect on logits; sliced off), streams and
rows with zero queries of length 0, context keys masked by index. Accumulation in float32.

Which kernel runs follows the platform the program is lowered for (`lax.platform_dependent`): the
Triton kernel for cuda/rocm, the Mosaic kernel for TPU, the Pallas interpreter for CPU (tests).
Choices: a whole-context block per program, so VMEM (TPU) holds `2 x 2 x N x D` floats, about 1 MiB
at N = 2048, D = 32; longer contexts would move the tile loop into the grid. No VJP: the kernel
serves inference (sampling and joint densities); training uses the dense-mask transformer pass.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from kernels.buffer_attention.reference import MASK_VALUE

MIN_BLOCK = 16  # Triton's tl.dot needs every dimension >= 16


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Query rows per program and context keys per inner step (powers of two >= 16)."""

  rows: int = 16
  context: int = 128

  def __post_init__(self):
    for name in ("rows", "context"):
      value = getattr(self, name)
      if value < MIN_BLOCK or value & (value - 1):
        raise ValueError(f"BlockSizes.{name} must be a power of two >= {MIN_BLOCK}, got {value}")


@dataclasses.dataclass(frozen=True)
class Layout:
  """Blocks of one call (module docstring)."""

  rows_per_stream: int  # R: the Q x G queries of a stream, padded to a power of two
  streams_per_block: int  # b_blk
  padded_batch: int
  slots: int  # S: buffer slots per stream, a power of two
  head_dim: int
  block_n: int
  padded_context: int
  per_stream_context: bool

  @property
  def rows_per_block(self) -> int:
    return self.rows_per_stream * self.streams_per_block

  @property
  def keys_per_block(self) -> int:
    return self.slots * self.streams_per_block


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def make_layout(
  batch: int,
  rows: int,
  context: int,
  slots: int,
  head_dim: int,
  per_stream_context: bool,
  block_sizes: BlockSizes = BlockSizes(),
) -> Layout:
  """Block sizes for `batch` streams of `rows` queries (per kv head) against `context` keys and
  `slots` buffer slots; every block dimension a power of two >= 16."""
  rows_per_stream = pl.next_power_of_2(rows)
  streams = 1
  if not per_stream_context:
    streams = min(max(1, block_sizes.rows // rows_per_stream), pl.next_power_of_2(batch))
  rows_per_stream = max(rows_per_stream, MIN_BLOCK // streams)
  slots = max(pl.next_power_of_2(max(slots, 1)), MIN_BLOCK // streams)
  block_n = min(block_sizes.context, max(MIN_BLOCK, pl.next_power_of_2(context)))
  return Layout(
    rows_per_stream=rows_per_stream,
    streams_per_block=streams,
    padded_batch=_round_up(batch, streams),
    slots=slots,
    head_dim=max(MIN_BLOCK, pl.next_power_of_2(head_dim)),
    block_n=block_n,
    padded_context=_round_up(context, block_n),
    per_stream_context=per_stream_context,
  )


def _dot(a, b, contract_b: int):
  """`a @ b` (`contract_b = 0`) or `a @ b.T` (`contract_b = 1`), accumulated in float32."""
  precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return jax.lax.dot_general(
    a,
    b,
    (((1,), (contract_b,)), ((), ())),
    precision=precision,
    preferred_element_type=jnp.float32,
  )


def _online_update(carry, logits, values):
  """One step of the streaming softmax: rescale the running sum and output by `exp(m - m_new)`."""
  m, total, acc = carry
  m_next = jnp.maximum(m, jnp.max(logits, axis=1, keepdims=True))
  correction = jnp.exp(m - m_next)
  weights = jnp.exp(logits - m_next)
  total = correction * total + jnp.sum(weights, axis=1, keepdims=True)
  acc = correction * acc + _dot(weights.astype(values.dtype), values, 0)
  return m_next, total, acc


def _kernel(q_ref, ck_ref, cv_ref, bk_ref, bv_ref, lengths_ref, o_ref, *, scale, context, layout):
  q = q_ref[...]
  rows, block_n = layout.rows_per_block, layout.block_n
  carry = (
    jnp.full((rows, 1), MASK_VALUE, jnp.float32),
    jnp.zeros((rows, 1), jnp.float32),
    jnp.zeros((rows, layout.head_dim), jnp.float32),
  )

  def context_tile(t, carry):
    start = pl.multiple_of(t * block_n, block_n)
    logits = _dot(q, ck_ref[pl.ds(start, block_n), :], 1) * scale
    if layout.padded_context != context:
      index = start + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
      logits = jnp.where(index < context, logits, MASK_VALUE)
    return _online_update(carry, logits, cv_ref[pl.ds(start, block_n), :])

  carry = jax.lax.fori_loop(0, layout.padded_context // block_n, context_tile, carry)
  logits = _dot(q, bk_ref[...], 1) * scale
  row = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 0)
  key = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
  row_shift = layout.rows_per_stream.bit_length() - 1
  key_shift = layout.slots.bit_length() - 1
  visible = ((row >> row_shift) == (key >> key_shift)) & (
    (key & (layout.slots - 1)) < lengths_ref[...]
  )
  logits = jnp.where(visible, logits, MASK_VALUE)
  _, total, acc = _online_update(carry, logits, bv_ref[...])
  o_ref[...] = (acc / total).astype(o_ref.dtype)


def _compiler_params(target: str):
  if target == "gpu":
    return pltriton.CompilerParams(num_warps=4, num_stages=2)
  if target == "tpu":
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
  return None


def _call(layout: Layout, kv_heads: int, dtype, scale: float, context: int, target: str):
  rows, keys, dim = layout.rows_per_block, layout.keys_per_block, layout.head_dim
  if layout.per_stream_context:
    context_index = lambda h, i: (h, i, 0, 0)  # noqa: E731
  else:
    context_index = lambda h, i: (h, 0, 0, 0)  # noqa: E731
  row_spec = pl.BlockSpec((None, rows, dim), lambda h, i: (h, i, 0))
  context_spec = pl.BlockSpec((None, None, layout.padded_context, dim), context_index)
  buffer_spec = pl.BlockSpec((None, keys, dim), lambda h, i: (h, i, 0))
  kernel = functools.partial(_kernel, scale=scale, context=context, layout=layout)
  return pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct(
      (kv_heads, layout.padded_batch * layout.rows_per_stream, dim), dtype
    ),
    grid=(kv_heads, layout.padded_batch // layout.streams_per_block),
    in_specs=[
      row_spec,
      context_spec,
      context_spec,
      buffer_spec,
      buffer_spec,
      pl.BlockSpec((rows, 1), lambda h, i: (i, 0)),
    ],
    out_specs=row_spec,
    compiler_params=_compiler_params(target),
    interpret=target == "interpret",
    name=f"buffer_attention_{target}",
  )


def _pad_to(x, shape):
  return jnp.pad(x, [(0, s - d) for s, d in zip(shape, x.shape, strict=True)])


def _run(
  q, context_k, context_v, buffer_k, buffer_v, buffer_lengths, *, scale, block_sizes, target
):
  """The kernel on validated arrays (see `kernels.buffer_attention.api.buffer_attention`)."""
  batch, queries, heads, head_dim = q.shape
  context_batch, context, kv_heads, _ = context_k.shape
  slots, group = buffer_k.shape[1], heads // kv_heads
  layout = make_layout(
    batch, queries * group, context, slots, head_dim, context_batch > 1, block_sizes
  )
  b, r, s, d = layout.padded_batch, layout.rows_per_stream, layout.slots, layout.head_dim
  rows = q.reshape(batch, queries, kv_heads, group, head_dim).transpose(2, 0, 1, 3, 4)
  rows = _pad_to(rows.reshape(kv_heads, batch, queries * group, head_dim), (kv_heads, b, r, d))
  lengths = jnp.clip(buffer_lengths.astype(jnp.int32), 0, slots)
  lengths = jnp.repeat(lengths, group, axis=1)
  lengths = _pad_to(lengths, (b, r)).reshape(b * r, 1)

  def heads_first(x, batch_to, length_to):
    x = x.transpose(2, 0, 1, 3)
    return _pad_to(x, (kv_heads, batch_to, length_to, d))

  context_rows = b if context_batch > 1 else 1
  ck = heads_first(context_k, context_rows, layout.padded_context)
  cv = heads_first(context_v, context_rows, layout.padded_context)
  bk = heads_first(buffer_k, b, s).reshape(kv_heads, b * s, d)
  bv = heads_first(buffer_v, b, s).reshape(kv_heads, b * s, d)
  call = _call(layout, kv_heads, q.dtype, scale, context, target)
  out = call(rows.reshape(kv_heads, b * r, d), ck, cv, bk, bv, lengths)
  out = out.reshape(kv_heads, b, r, d)[:, :batch, : queries * group, :head_dim]
  out = out.reshape(kv_heads, batch, queries, group, head_dim).transpose(1, 2, 0, 3, 4)
  return out.reshape(batch, queries, heads, head_dim)


def buffer_attention_pallas(
  q,
  context_k,
  context_v,
  buffer_k,
  buffer_v,
  buffer_lengths,
  *,
  scale: float,
  block_sizes: BlockSizes = BlockSizes(),
  interpret: bool | None = None,
):
  """The kernel of the platform lowered for (module docstring) on validated arrays.

  `interpret`: True runs the Pallas interpreter on every platform; False the compiled kernel of the
  platform lowered for (Triton on GPU, Mosaic on TPU; none exists for CPU); None the interpreter
  when lowered for CPU, the compiled kernel otherwise.
  """
  args = (q, context_k, context_v, buffer_k, buffer_v, buffer_lengths)
  run = functools.partial(_run, scale=scale, block_sizes=block_sizes)
  if interpret:
    return run(*args, target="interpret")
  branches = dict(
    cuda=functools.partial(run, target="gpu"),
    rocm=functools.partial(run, target="gpu"),
    default=functools.partial(run, target="tpu"),
  )
  if interpret is None:
    branches["cpu"] = functools.partial(run, target="interpret")
  return jax.lax.platform_dependent(*args, **branches)
