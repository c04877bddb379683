"""Public entry point of shared-context + per-sample-buffer attention, choosing an implementation.

`buffer_attention(q, context_k, context_v, buffer_k, buffer_v, buffer_lengths)`: query `(b, q)`
attends, under one softmax, to every context key and to the buffer slots `s < buffer_lengths[b, q]`
of its own sample `b` (the target/buffer read of "Efficient Autoregressive Inference for Transformer
Probabilistic Models", ICLR 2026, App. A.1). The context is `[1, N, kv_heads, D]`, ONE copy shared
by every sample (or `[B, ...]`, one per sample); the buffer is `[B, S, kv_heads, D]`.

Implementations:
  "pallas"     the kernel of `pallas.py`: Triton on GPU, Mosaic on TPU, the Pallas interpreter on CPU
               (correctness only);
  "xla"        `reference.two_source_xla`: einsums against the shared context, no broadcast;
  "reference"  `reference.broadcast_reference`: context broadcast to every sample, dense mask;
  None         the kernel where the program runs on GPU/TPU, XLA on CPU.
The choice follows the platform the program is lowered for (`lax.platform_dependent`), not the
machine that traces it, so a program exported for GPU or TPU from a CPU host holds the kernel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels.buffer_attention import pallas, reference

IMPLEMENTATIONS = ("pallas", "xla", "reference")


def _xla(*args, scale, interpret):
  del interpret
  return reference.two_source_xla(*args, scale)


def _reference(*args, scale, interpret):
  del interpret
  return reference.broadcast_reference(*args, scale)


def _kernel(*args, scale, interpret):
  return pallas.buffer_attention_pallas(*args, scale=scale, interpret=interpret)


def _per_platform(*args, scale, interpret):
  """XLA when lowered for CPU, the kernel for every other platform."""
  kernel = functools.partial(_kernel, scale=scale, interpret=bool(interpret))
  xla = functools.partial(reference.two_source_xla, scale=scale)
  return jax.lax.platform_dependent(*args, cpu=xla, default=kernel)


# Jitted so that eager calls compile once instead of dispatching op by op; a no-op under an outer jit.
_IMPLEMENTATION_FNS = {
  name: jax.jit(fn, static_argnames=("scale", "interpret"))
  for name, fn in (
    ("pallas", _kernel),
    ("xla", _xla),
    ("reference", _reference),
    (None, _per_platform),
  )
}


def default_implementation() -> str:
  """What `implementation=None` runs on the default backend."""
  return "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"


def _check(q, context_k, context_v, buffer_k, buffer_v, buffer_lengths) -> None:
  arrays = dict(q=q, context_k=context_k, context_v=context_v, buffer_k=buffer_k, buffer_v=buffer_v)
  for name, x in arrays.items():
    if x.ndim != 4:
      raise ValueError(
        f"buffer_attention: {name} must have shape [batch, length, heads, head_dim], got {x.shape}"
      )
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype != q.dtype:
      raise TypeError(
        f"buffer_attention: {name} must have q's floating dtype {q.dtype}, got {x.dtype}"
      )
  batch, queries, heads, dim = q.shape
  context_batch, context, kv_heads, _ = context_k.shape
  if context_k.shape[3] != dim or context_batch not in (1, batch) or context == 0:
    raise ValueError(
      f"buffer_attention: context_k must have shape [1 or {batch}, N >= 1, kv_heads, {dim}], got "
      f"{context_k.shape}"
    )
  if heads % kv_heads:
    raise ValueError(
      f"buffer_attention: context_k has {kv_heads} heads, which do not divide q's {heads} heads"
    )
  if context_v.shape != context_k.shape:
    raise ValueError(
      f"buffer_attention: context_v must have context_k's shape {context_k.shape}, got "
      f"{context_v.shape}"
    )
  expected = (batch, buffer_k.shape[1], kv_heads, dim)
  for name, x in (("buffer_k", buffer_k), ("buffer_v", buffer_v)):
    if x.shape != expected:
      raise ValueError(
        f"buffer_attention: {name} must have shape [batch={batch}, slots, kv_heads={kv_heads}, "
        f"head_dim={dim}], got {x.shape}"
      )
  if buffer_lengths.shape != (batch, queries) or not jnp.issubdtype(
    buffer_lengths.dtype, jnp.integer
  ):
    raise ValueError(
      f"buffer_attention: buffer_lengths must be int [batch={batch}, queries={queries}], got "
      f"shape {buffer_lengths.shape} dtype {buffer_lengths.dtype}"
    )


def buffer_attention(
  q: jax.Array,
  context_k: jax.Array,
  context_v: jax.Array,
  buffer_k: jax.Array,
  buffer_v: jax.Array,
  buffer_lengths: jax.Array,
  *,
  scale: float | None = None,
  implementation: str | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """Attention of `q` over the shared context and each sample's visible buffer prefix.

  Args:
    q: `[batch, queries, heads, head_dim]`.
    context_k, context_v: `[1 or batch, N, kv_heads, head_dim]`; `kv_heads` divides `heads`.
    buffer_k, buffer_v: `[batch, slots, kv_heads, head_dim]`; `slots` may be 0.
    buffer_lengths: int `[batch, queries]` (or broadcastable to it): query `(b, q)` sees buffer
      slots `s < buffer_lengths[b, q]` (clipped to `[0, slots]`).
    scale: logit scale, default `1 / sqrt(head_dim)`.
    implementation: "pallas", "xla", "reference" or None (the kernel on GPU/TPU, XLA on CPU).
    interpret: for the kernel: True runs the Pallas interpreter on every platform, False the
      compiled kernel of the platform lowered for, None the interpreter on CPU only.

  Returns:
    `[batch, queries, heads, head_dim]` in q's dtype.
  """
  q, context_k, context_v = jnp.asarray(q), jnp.asarray(context_k), jnp.asarray(context_v)
  buffer_k, buffer_v = jnp.asarray(buffer_k), jnp.asarray(buffer_v)
  if q.ndim == 4:
    buffer_lengths = jnp.broadcast_to(jnp.asarray(buffer_lengths), q.shape[:2])
  _check(q, context_k, context_v, buffer_k, buffer_v, buffer_lengths)
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"buffer_attention: implementation must be one of {IMPLEMENTATIONS} or None, got "
      f"{implementation!r}"
    )
  if buffer_k.shape[1] == 0:  # no buffer yet: one masked slot keeps every implementation's shapes
    pad = ((0, 0), (0, 1), (0, 0), (0, 0))
    buffer_k, buffer_v = jnp.pad(buffer_k, pad), jnp.pad(buffer_v, pad)
    buffer_lengths = jnp.zeros_like(buffer_lengths)
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
  return _IMPLEMENTATION_FNS[implementation](
    q, context_k, context_v, buffer_k, buffer_v, buffer_lengths, scale=scale, interpret=interpret
  )


def broadcast_bytes(
  batch: int, context: int, kv_heads: int, head_dim: int, dtype=np.float32
) -> int:
  """Bytes of the `[batch, N, kv_heads, D]` K and V copies the broadcast reference makes."""
  return 2 * batch * context * kv_heads * head_dim * np.dtype(dtype).itemsize
