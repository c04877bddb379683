"""Scaled dot-product attention with one entry point and masks as data.

`attention(q, k, v, mask)` computes `softmax(q k^T / sqrt(d) + log mask) v` (Vaswani et al. 2017,
"Attention Is All You Need", Eq. 1) per head, in the `[batch, length, heads, head_dim]` layout of
`jax.nn.dot_product_attention`. Keys and values may have fewer heads than queries (grouped-query
attention, Ainslie et al. 2023: query head `h` reads key head `h // (heads / kv_heads)`).

Masks. A `Mask` is a pytree that says which keys each query sees, as the AND of its parts:
  causal          key position <= query position, OR key position < `prefix_lengths` (prefix-LM);
  segment_ids     packed sequences: query and key carry the same id (self-attention, Lq == Lk);
  kv_valid        per-key validity (padding);
  dense           any boolean `[B or 1, 1 or H, Lq, Lk]` array.
Positions default to `0..L-1`; a KV cache passes the query's positions (its cache slots) so that the
causal part compares slots. The helpers `causal_mask`, `bidirectional_mask`, `prefix_lm_mask`,
`segment_mask`, `padding_mask`, `dense_mask` build them, `Mask.to_dense` gives the boolean
`[B, 1 or H, Lq, Lk]` array, and a raw boolean array is accepted wherever a `Mask` is. A query that sees
no key gets the mean of the values (every implementation uses a large finite negative logit).

Implementations (`implementation=`):
  "xla"        `jax.nn.dot_product_attention(..., implementation="xla")` with the dense mask; every
               backend.
  "cudnn"      `jax.nn.dot_product_attention(..., implementation="cudnn")`, GPU only, fp16/bf16 and a
               head dim that is a multiple of 8 (<= 128); a plain causal mask goes as `is_causal`
               (cuDNN skips the masked blocks), any other mask as a dense mask.
  "pallas"     the flash-attention kernels JAX ships: on GPU `jax.experimental.pallas.ops.gpu.
               attention.mha` (Triton), on TPU `jax.experimental.pallas.ops.tpu.flash_attention`.
               Both take a causal flag and segment ids only, so causal, segment and causal+segment
               masks (and no mask) are translated; lengths are padded to the kernels' block sizes
               with a padding segment. Masks they cannot express (prefix-LM, explicit positions as in
               a KV cache, padding, dense) fall back to "xla". `pallas_gpu_attention` and
               `pallas_tpu_attention` take `interpret=True` to run the kernels on CPU (tests only).
  "chunked"    exact attention `CHUNK` queries at a time, each block through "xla": the scores held
               at once are `[B, H, CHUNK, Lk]` rather than `[B, H, Lq, Lk]`, and under a plain causal
               mask (default positions, nothing else) a block reads only the keys up to its last
               query, skipping the masked upper triangle (about half the work of a dense causal
               product); every backend.
  "reference"  plain jnp: float32 `softmax(q k^T * scale)` then `@ v`; every backend.
  None         by backend: cpu -> chunked for more than `CHUNK` queries, else xla;
               gpu -> cudnn where it supports the dtype and head dim and the
               mask is none or plain causal over equal lengths, else xla; tpu -> pallas.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("xla", "chunked", "cudnn", "pallas", "reference")
_BACKEND_IMPLEMENTATIONS = {
  "cpu": ("xla", "chunked", "reference"),
  "gpu": ("xla", "chunked", "cudnn", "pallas", "reference"),
  "tpu": ("xla", "chunked", "pallas", "reference"),
}
# Queries per block of "chunked" (experiments/bench_decode.py times it beside "xla" on CPU)
CHUNK = 256
# The kernels' masked logit: finite, so a query that sees no key averages the values instead of NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_PADDING_SEGMENT = -1


# ---------------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------------


@flax.struct.dataclass
class Mask:
  """Which keys each query sees: the AND of the parts that are set (see the module docstring).

  Attributes:
    causal: key position <= query position (static).
    q_positions: `[B or 1, Lq]` int positions of the queries (default `0..Lq-1`).
    kv_positions: `[B or 1, Lk]` int positions of the keys (default `0..Lk-1`).
    prefix_lengths: `[B]` with `causal`: keys before this position are seen by every query.
    segment_ids: `[B, L]` packed-sequence ids of queries and keys (self-attention, Lq == Lk).
    kv_valid: `[B, Lk]` bool, False for padding keys.
    dense: `[B or 1, 1 or H, Lq, Lk]` bool, ANDed with the rest.
  """

  causal: bool = flax.struct.field(pytree_node=False, default=False)
  q_positions: jax.Array | None = None
  kv_positions: jax.Array | None = None
  prefix_lengths: jax.Array | None = None
  segment_ids: jax.Array | None = None
  kv_valid: jax.Array | None = None
  dense: jax.Array | None = None

  def to_dense(self, batch: int, q_len: int, kv_len: int) -> jax.Array:
    """The boolean `[B, 1 or H, Lq, Lk]` array (True = attend)."""
    allowed = jnp.ones((batch, q_len, kv_len), bool)
    if self.causal:
      q_pos = _positions(self.q_positions, q_len)[:, :, None]
      kv_pos = _positions(self.kv_positions, kv_len)[:, None, :]
      seen = kv_pos <= q_pos
      if self.prefix_lengths is not None:
        seen = seen | (kv_pos < jnp.asarray(self.prefix_lengths)[:, None, None])
      allowed = allowed & seen
    if self.segment_ids is not None:
      ids = jnp.asarray(self.segment_ids)
      allowed = allowed & (ids[:, :, None] == ids[:, None, :])
    if self.kv_valid is not None:
      allowed = allowed & jnp.asarray(self.kv_valid, bool)[:, None, :]
    allowed = allowed[:, None]
    if self.dense is not None:
      allowed = allowed & jnp.asarray(self.dense, bool)
    return allowed

  @property
  def is_plain_causal(self) -> bool:
    """Causal over `0..L-1` with nothing else: what `is_causal` flags express."""
    return self.causal and self._only_causal_and_segments() and self.segment_ids is None

  def _only_causal_and_segments(self) -> bool:
    rest = (self.q_positions, self.kv_positions, self.prefix_lengths, self.kv_valid, self.dense)
    return all(part is None for part in rest)


def _positions(positions, length: int) -> jax.Array:
  if positions is None:
    return jnp.arange(length, dtype=jnp.int32)[None]
  return jnp.asarray(positions, jnp.int32)


def causal_mask(q_positions=None, kv_positions=None) -> Mask:
  """Each query sees keys at its position or before (a KV cache passes the queries' slots)."""
  return Mask(causal=True, q_positions=q_positions, kv_positions=kv_positions)


def bidirectional_mask() -> Mask:
  """Every query sees every key."""
  return Mask()


def prefix_lm_mask(prefix_lengths, q_positions=None, kv_positions=None) -> Mask:
  """Prefix-LM (Raffel et al. 2020): the first `prefix_lengths[b]` tokens see each other; later ones
  are causal and see the whole prefix."""
  return Mask(
    causal=True,
    q_positions=q_positions,
    kv_positions=kv_positions,
    prefix_lengths=jnp.asarray(prefix_lengths, jnp.int32),
  )


def segment_mask(segment_ids, causal: bool = False) -> Mask:
  """Packed sequences: tokens see only tokens of their own segment (and, if causal, not later ones)."""
  return Mask(causal=causal, segment_ids=jnp.asarray(segment_ids, jnp.int32))


def padding_mask(kv_valid, causal: bool = False) -> Mask:
  """Padding keys (False in `kv_valid [B, Lk]`) are seen by nobody."""
  return Mask(causal=causal, kv_valid=jnp.asarray(kv_valid, bool))


def dense_mask(mask) -> Mask:
  """An arbitrary boolean `[B or 1, 1 or H, Lq, Lk]` mask."""
  return Mask(dense=jnp.asarray(mask))


def as_mask(mask) -> Mask | None:
  """`None`, a `Mask`, or a boolean array (taken as `dense_mask`)."""
  if mask is None or isinstance(mask, Mask):
    return mask
  return dense_mask(mask)


# ---------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------


def _check_shape(name: str, array, expected: tuple[Any, ...]) -> None:
  """`expected` holds an int, a tuple of allowed ints, or None (any) per axis."""
  shape = tuple(np.shape(array))
  ok = len(shape) == len(expected) and all(
    e is None or (s in e if isinstance(e, tuple) else s == e)
    for s, e in zip(shape, expected, strict=True)
  )
  if not ok:
    raise ValueError(f"attention: {name} must have shape {_describe(expected)}, got {shape}")


def _describe(expected) -> str:
  axes = (
    "*" if e is None else "|".join(map(str, sorted(set(e)))) if isinstance(e, tuple) else str(e)
    for e in expected
  )
  return "(" + ", ".join(axes) + ")"


def check_inputs(q, k, v, mask: Mask | None) -> None:
  """Shapes and dtypes of `attention`'s arguments, with errors that name the argument."""
  for name, x in (("q", q), ("k", k), ("v", v)):
    if np.ndim(x) != 4:
      raise ValueError(
        f"attention: {name} must have shape [batch, length, heads, head_dim], got {np.shape(x)}"
      )
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f"attention: {name} must be floating point, got dtype {x.dtype}")
  b, q_len, heads, head_dim = q.shape
  _, kv_len, kv_heads, _ = k.shape
  _check_shape("k", k, (b, None, None, head_dim))
  _check_shape("v", v, k.shape)
  if k.dtype != q.dtype or v.dtype != q.dtype:
    raise TypeError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  if heads % kv_heads:
    raise ValueError(f"attention: k has {kv_heads} heads, which do not divide q's {heads} heads")
  if mask is None:
    return
  if mask.q_positions is not None:
    _check_shape("mask.q_positions", mask.q_positions, ((1, b), q_len))
  if mask.kv_positions is not None:
    _check_shape("mask.kv_positions", mask.kv_positions, ((1, b), kv_len))
  if mask.prefix_lengths is not None:
    if not mask.causal:
      raise ValueError("attention: mask.prefix_lengths needs mask.causal (prefix-LM)")
    _check_shape("mask.prefix_lengths", mask.prefix_lengths, (b,))
  if mask.segment_ids is not None:
    if q_len != kv_len:
      raise ValueError(
        f"attention: mask.segment_ids needs as many queries as keys, got {q_len} and {kv_len}"
      )
    _check_shape("mask.segment_ids", mask.segment_ids, (b, q_len))
  if mask.kv_valid is not None:
    _check_shape("mask.kv_valid", mask.kv_valid, (b, kv_len))
  if mask.dense is not None:
    _check_shape("mask", mask.dense, ((1, b), (1, heads), q_len, kv_len))
    if mask.dense.dtype != jnp.bool_:
      raise TypeError(f"attention: mask must be boolean, got dtype {mask.dense.dtype}")


# ---------------------------------------------------------------------------------------------------
# Implementations
# ---------------------------------------------------------------------------------------------------


def _repeat_kv(x: jax.Array, heads: int) -> jax.Array:
  return jnp.repeat(x, heads // x.shape[2], axis=2)


def reference_attention(q, k, v, mask: Mask | None, scale: float) -> jax.Array:
  """`softmax(q k^T * scale)` with masked logits at `MASK_VALUE`, in float32, then `@ v`."""
  b, q_len, heads, _ = q.shape
  k, v = _repeat_kv(k, heads), _repeat_kv(v, heads)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
  if mask is not None:
    logits = jnp.where(mask.to_dense(b, q_len, k.shape[1]), logits, MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, v.astype(jnp.float32)).astype(q.dtype)


def xla_attention(q, k, v, mask: Mask | None, scale: float) -> jax.Array:
  dense = None if mask is None else mask.to_dense(q.shape[0], q.shape[1], k.shape[1])
  return jax.nn.dot_product_attention(q, k, v, mask=dense, scale=scale, implementation="xla")


def chunked_attention(q, k, v, mask: Mask | None, scale: float, block: int = CHUNK) -> jax.Array:
  """ "xla" attention over blocks of `block` queries (a static loop; exact, no online softmax: each block
  sees all of its keys at once). Under a plain causal mask a block stops at the key of its last query."""
  batch, q_len, _, _ = q.shape
  kv_len = k.shape[1]
  if q_len <= block:
    return xla_attention(q, k, v, mask, scale)
  plain_causal = mask is not None and mask.is_plain_causal
  dense = None if mask is None or plain_causal else mask.to_dense(batch, q_len, kv_len)
  outputs = []
  for start in range(0, q_len, block):
    stop = min(start + block, q_len)
    keys = min(stop, kv_len) if plain_causal else kv_len
    if plain_causal:
      seen = jnp.arange(keys)[None, :] <= jnp.arange(start, stop)[:, None]
      block_mask = seen[None, None]
    else:
      block_mask = None if dense is None else dense[:, :, start:stop]
    outputs.append(
      jax.nn.dot_product_attention(
        q[:, start:stop],
        k[:, :keys],
        v[:, :keys],
        mask=block_mask,
        scale=scale,
        implementation="xla",
      )
    )
  return jnp.concatenate(outputs, axis=1)


def cudnn_supported(q) -> bool:
  """Whether cuDNN's fused attention takes this dtype and head dim (conservative: pre-Hopper limits)."""
  head_dim = q.shape[-1]
  return q.dtype in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128


def cudnn_attention(q, k, v, mask: Mask | None, scale: float) -> jax.Array:
  if not cudnn_supported(q):
    raise ValueError(
      "attention: implementation 'cudnn' needs q in float16/bfloat16 with a head dim that is a "
      f"multiple of 8 and <= 128, got dtype {q.dtype} and head dim {q.shape[-1]}"
    )
  if mask is not None and mask.is_plain_causal and q.shape[1] == k.shape[1]:
    return jax.nn.dot_product_attention(
      q, k, v, scale=scale, is_causal=True, implementation="cudnn"
    )
  dense = None if mask is None else mask.to_dense(q.shape[0], q.shape[1], k.shape[1])
  return jax.nn.dot_product_attention(q, k, v, mask=dense, scale=scale, implementation="cudnn")


def _kernel_mask(
  mask: Mask | None, q_len: int, kv_len: int
) -> tuple[bool, jax.Array | None] | None:
  """`(causal, segment_ids or None)` where the flash kernels can express `mask`, else None."""
  if mask is None:
    return False, None
  if q_len != kv_len or not mask._only_causal_and_segments():
    return None
  return mask.causal, mask.segment_ids


def _padded_length(length: int) -> int:
  """GPU kernel blocks: a power of two (>= 32, the backward pass's block) up to 128, then 128s."""
  if length <= 128:
    return max(32, 1 << (length - 1).bit_length())
  return -(-length // 128) * 128


def _pad_for_kernel(q, k, v, segment_ids, length: int):
  """Pads the length axis to `length`; padding tokens form their own segment, seen by no real token."""
  b, current = q.shape[:2]
  if segment_ids is None and length == current:
    return q, k, v, None
  ids = jnp.zeros((b, current), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
  pad = length - current
  widths = ((0, 0), (0, pad), (0, 0), (0, 0))
  ids = jnp.pad(ids, ((0, 0), (0, pad)), constant_values=_PADDING_SEGMENT)
  return jnp.pad(q, widths), jnp.pad(k, widths), jnp.pad(v, widths), ids


def pallas_gpu_attention(q, k, v, mask: Mask | None, scale: float, interpret: bool = False):
  """`jax.experimental.pallas.ops.gpu.attention.mha` (Triton flash attention) where the mask is
  causal and/or segments, else `xla_attention`."""
  parts = _kernel_mask(mask, q.shape[1], k.shape[1])
  if parts is None:
    return xla_attention(q, k, v, mask, scale)
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention

  causal, segment_ids = parts
  length, heads = q.shape[1], q.shape[2]
  k, v = _repeat_kv(k, heads), _repeat_kv(v, heads)
  q, k, v, ids = _pad_for_kernel(q, k, v, segment_ids, _padded_length(length))
  out = gpu_attention.mha(q, k, v, ids, sm_scale=scale, causal=causal, interpret=interpret)
  return out[:, :length]


def pallas_tpu_attention(q, k, v, mask: Mask | None, scale: float, interpret: bool = False):
  """`jax.experimental.pallas.ops.tpu.flash_attention` where the mask is causal and/or segments,
  else `xla_attention`. Lengths are padded to multiples of its 128 blocks."""
  parts = _kernel_mask(mask, q.shape[1], k.shape[1])
  if parts is None:
    return xla_attention(q, k, v, mask, scale)
  import contextlib

  from jax.experimental.pallas import tpu as pltpu
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_attention

  causal, segment_ids = parts
  length, heads = q.shape[1], q.shape[2]
  k, v = _repeat_kv(k, heads), _repeat_kv(v, heads)
  q, k, v, ids = _pad_for_kernel(q, k, v, segment_ids, -(-length // 128) * 128)
  segments = None if ids is None else tpu_attention.SegmentIds(q=ids, kv=ids)
  heads_first = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
  context = pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()
  with context:
    out = tpu_attention.flash_attention(
      heads_first(q),
      heads_first(k),
      heads_first(v),
      segment_ids=segments,
      causal=causal,
      sm_scale=scale,
    )
  return heads_first(out)[:, :length]


def pallas_attention(q, k, v, mask: Mask | None, scale: float) -> jax.Array:
  if jax.default_backend() == "tpu":
    return pallas_tpu_attention(q, k, v, mask, scale)
  return pallas_gpu_attention(q, k, v, mask, scale)


_IMPLEMENTATION_FNS = {
  "xla": xla_attention,
  "chunked": chunked_attention,
  "cudnn": cudnn_attention,
  "pallas": pallas_attention,
  "reference": reference_attention,
}


def available_implementations(backend: str | None = None) -> tuple[str, ...]:
  """The implementations that run on `backend` (default: JAX's default backend)."""
  return _BACKEND_IMPLEMENTATIONS.get(backend or jax.default_backend(), ("xla", "reference"))


def default_implementation(q, k, mask: Mask | None) -> str:
  """tpu: pallas; gpu: cudnn for supported dtypes on self-attention with no mask or a plain causal
  one (its fused kernel's case), else xla; cpu: chunked past `CHUNK` queries, else xla."""
  backend = jax.default_backend()
  if backend == "tpu":
    return "pallas"
  plain = mask is None or mask.is_plain_causal
  if backend == "gpu" and cudnn_supported(q) and plain and q.shape[1] == k.shape[1]:
    return "cudnn"
  if backend == "cpu" and q.shape[1] > CHUNK:
    return "chunked"
  return "xla"


def attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: Mask | jax.Array | None = None,
  *,
  scale: float | None = None,
  implementation: str | None = None,
) -> jax.Array:
  """Multi-head (or grouped-query) scaled dot-product attention.

  Args:
    q: `[batch, q_len, heads, head_dim]` queries.
    k: `[batch, kv_len, kv_heads, head_dim]` keys; `kv_heads` divides `heads`.
    v: values, shaped like `k`; q, k, v share one floating dtype.
    mask: a `Mask`, a boolean `[B or 1, 1 or heads, q_len, kv_len]` array (True = attend), or None
      (every query sees every key).
    scale: logit scale, default `1 / sqrt(head_dim)`.
    implementation: "xla", "chunked", "cudnn", "pallas", "reference" or None (by backend, module
      docstring).

  Returns:
    `[batch, q_len, heads, head_dim]` in q's dtype.
  """
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  mask = as_mask(mask)
  check_inputs(q, k, v, mask)
  if implementation is None:
    implementation = default_implementation(q, k, mask)
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"attention: implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}"
    )
  available = available_implementations()
  if implementation not in available:
    raise ValueError(
      f"attention: implementation {implementation!r} is not available on backend "
      f"{jax.default_backend()!r}; available: {', '.join(available)}"
    )
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
  return _IMPLEMENTATION_FNS[implementation](q, k, v, mask, scale)
