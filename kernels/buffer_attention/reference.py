"""Two jnp versions of shared-context + per-sample-buffer attention (the kernel's references).

Both compute, per query `(b, q)` and head `h`, ONE softmax over the concatenation of the context
keys (all visible) and the buffer slots `s < buffer_lengths[b, q]` of sample `b` ("Efficient
Autoregressive Inference for Transformer Probabilistic Models", ICLR 2026, App. A.1:
a target reads `[r_C(C), b_{1:k-1}]` with one softmax).

  `broadcast_reference`  the plain reading: the context K/V broadcast to every sample, concatenated
                         with the buffer, a boolean mask, float32 softmax. Memory `B x (N + S)` per
                         head: what the kernel avoids.
  `two_source_xla`       the same numbers without the broadcast: context logits from one einsum
                         against the shared `[N, kv_heads, D]` copy, buffer logits per sample, one
                         softmax over both; XLA's choice on CPU.

A masked logit is `MASK_VALUE` (finite), so a query that sees no key averages the values; every query
sees at least the context here, so that case never arises.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def _grouped(q, kv_heads: int):
  """`[B, Q, H, D] -> [B, Q, kv_heads, H / kv_heads, D]`: query head h reads key head h // group."""
  b, length, heads, dim = q.shape
  return q.reshape(b, length, kv_heads, heads // kv_heads, dim)


def _buffer_visible(buffer_lengths, slots: int) -> jax.Array:
  """`[B, Q, S]` bool: slot s is visible to query (b, q)."""
  return jnp.arange(slots)[None, None, :] < buffer_lengths[:, :, None]


def broadcast_reference(q, context_k, context_v, buffer_k, buffer_v, buffer_lengths, scale):
  """Broadcast context, concatenate, mask, float32 softmax: `[B, Q, H, D]` in q's dtype."""
  b, length, heads, _ = q.shape
  n = context_k.shape[1]
  keys = jnp.concatenate([jnp.broadcast_to(context_k, (b,) + context_k.shape[1:]), buffer_k], 1)
  values = jnp.concatenate([jnp.broadcast_to(context_v, (b,) + context_v.shape[1:]), buffer_v], 1)
  group = heads // keys.shape[2]
  keys = jnp.repeat(keys, group, axis=2).astype(jnp.float32)
  values = jnp.repeat(values, group, axis=2).astype(jnp.float32)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), keys) * scale
  visible = jnp.concatenate(
    [jnp.ones((b, length, n), bool), _buffer_visible(buffer_lengths, buffer_k.shape[1])], -1
  )
  logits = jnp.where(visible[:, None], logits, MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, values).astype(q.dtype)


def two_source_xla(q, context_k, context_v, buffer_k, buffer_v, buffer_lengths, scale):
  """The same attention with the context read once per head, never broadcast over samples."""
  kv_heads, n = context_k.shape[2], context_k.shape[1]
  qg = _grouped(q.astype(jnp.float32), kv_heads)  # [B, Q, G_kv, G, D]
  ck, cv = context_k.astype(jnp.float32), context_v.astype(jnp.float32)
  bk, bv = buffer_k.astype(jnp.float32), buffer_v.astype(jnp.float32)
  if ck.shape[0] == 1:
    context_logits = jnp.einsum("bqkgd,nkd->bqkgn", qg, ck[0]) * scale
  else:
    context_logits = jnp.einsum("bqkgd,bnkd->bqkgn", qg, ck) * scale
  buffer_logits = jnp.einsum("bqkgd,bskd->bqkgs", qg, bk) * scale
  visible = _buffer_visible(buffer_lengths, bk.shape[1])[:, :, None, None, :]
  buffer_logits = jnp.where(visible, buffer_logits, MASK_VALUE)
  weights = jax.nn.softmax(jnp.concatenate([context_logits, buffer_logits], -1), -1)
  to_context, to_buffer = weights[..., :n], weights[..., n:]
  if cv.shape[0] == 1:
    out = jnp.einsum("bqkgn,nkd->bqkgd", to_context, cv[0])
  else:
    out = jnp.einsum("bqkgn,bnkd->bqkgd", to_context, cv)
  out = out + jnp.einsum("bqkgs,bskd->bqkgd", to_buffer, bv)
  return out.reshape(q.shape).astype(q.dtype)
