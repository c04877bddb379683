"""A transformer neural process with a causal autoregressive buffer.

"Efficient Autoregressive Inference for Transformer Probabilistic Models" (Hassan, Loka et al.,
ICLR 2026). A set-based transformer NP (TNP-D, Nguyen & Grover 2022) predicts each target
independently given the context C. The paper adds a causal *buffer*: realised targets
`b_k = (x*_k, y*_k)` that attend to the context and to earlier buffer entries, so that

  p(y*_{1:K} | x*_{1:K}, C) = prod_k p(y*_k | r_tgt(x*_k, [r_C(C), b_{1:k-1}]))

with the context encoded ONCE (its keys/values cached, read-only) instead of re-encoding
`C ∪ {(x*_i, y*_i)}_{i<k}` for every k as autoregressive TNP-D does (TNP-D-AR).

Tokens and the attention rules (the paper's method section and App. A.1), realised as masks of
the shared transformer (`core.nn.transformer.Transformer`, `use_rope=False`: permutation-
equivariant):
  context C   `MLP([x, y, 1]) + e_ctx`;              C -> C, all (never reads B or T)       (R1)
  buffer B_j  `MLP([x, y, 1]) + e_buf + pos_j`;      B_j -> C all, B_j -> B_i for i < j     (R2)
  target T_m  `MLP([x, 0, 0]) + e_tgt`;              T_m -> C all, T_m -> B_i for i < v_m  (R3)
  nothing attends to T; a target reads [context keys, visible buffer keys] under ONE softmax.
The head reads a target's final features: a Gaussian `N(mean, (softplus(s) + min_std)^2)`, or a
mixture of `num_components` Gaussians (log-softmax weights, means initialised on linspace(-1, 1),
standard deviations clamped at `max_std`), the head of the authors' tabular re-implementation.

What this module offers:
  `BufferTNP`                 the network (embedding, the shared transformer, the Gaussian head).
  `structured_mask` / `layout`  the [C, B, T] sequence and its boolean mask for a visible-prefix
                              vector `v` (training: half of the targets v = 0, half v ~ U{1..K},
                              `training_visible`; joint density: v_k = k).
  `Predictive`                the head's mixture (log density, sampling from explicit noise).
  `target_log_density`        one forward of [C, B, T]: per-target log densities.
  `joint_log_density`         the joint log density in ONE pass per block of K targets
                              (K >= M: one pass; K = 1: exactly AR re-encoding, "slow mode").
  `marginal_log_density`      independent marginals (v = 0 for every target; TNP-D).
  `reencode_log_density`      TNP-D-AR's joint density: a padded set-mode pass per target, scanned.
  `encode_context`, `decode_step`, `sample_joint`: the cached sampler. The context is prefilled
                              once (batch 1, shared by all B streams); each step feeds
                              [buffer token k-1, target k] of every stream through the layers
                              against [context cache, stream's buffer cache] (the 2-token decode of
                              AR-nanoTabPFN) and commits only the buffer token's K/V. With M > K
                              targets, context ∪ sampled points is re-encoded every K targets (per
                              stream).
  `sample_reencode`           the baseline TNP-D-AR: each step re-runs the set model on C ∪ the
                              stream's draws (identical in law to `sample_joint` with K = 1), every
                              step padded to N + M tokens so that one compiled step is scanned;
  `sample_reencode_unpadded`  the same at each step's true length N + k (steps unrolled, each
                              compiled for its own length).
  `cached_joint_log_density`  the one-pass density through the cached context: [B_1..B_K, T_1..T_K]
                              with the structured mask generated from indices in
                              `kernels.buffer_attention` (no dense mask).

Choices where the paper is open: strictly causal buffer (B_j sees B_{i<j}, as in the paper; the
authors' re-implementations use i <= j, the same factorisation); one input MLP for all roles with a
has-y flag; learned buffer position embeddings (the paper finds them immaterial, App. H.2; off with
`buffer_positions=False`); samplers driven by explicit noise (`sampling_noise`), so that two
samplers of the same law can be compared draw by draw.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.nn import attention
from core.nn.transformer import Transformer, init_cache

CONTEXT, BUFFER, TARGET = 0, 1, 2


class Predictive(NamedTuple):
  """A mixture of Gaussians per token (one component: a Gaussian); each field `[..., C]`."""

  mean: jax.Array
  std: jax.Array
  log_weight: jax.Array

  def log_density(self, y) -> jax.Array:
    """`log p(y)` per token, `y [...]`."""
    log_p = gaussian_log_density(y[..., None], self.mean, self.std)
    return jax.nn.logsumexp(self.log_weight + log_p, axis=-1)

  def sample(self, eps, gumbel) -> jax.Array:
    """`y` from standard normal `eps [...]` and Gumbel `gumbel [..., C]` noise (Gumbel-max picks
    the component)."""
    component = jnp.argmax(self.log_weight + gumbel, axis=-1)[..., None]
    pick = lambda a: jnp.take_along_axis(a, component, axis=-1)[..., 0]  # noqa: E731
    return pick(self.mean) + pick(self.std) * eps

  def at(self, index) -> Predictive:
    return Predictive(*(a[index] for a in self))


class BufferTNP(nn.Module):
  """Transformer neural process with a causal buffer (module docstring).

  Attributes:
    width, depth, num_heads, mlp_hidden: the shared transformer's sizes.
    max_buffer: buffer slots with a learned position embedding (the trained buffer size K).
    embed_hidden: hidden width of the input MLP.
    min_std: floor of the predictive standard deviation.
    num_components: Gaussians in the predictive mixture (1: a Gaussian head).
    max_std: with a mixture, the clamp of each component's softplus standard deviation.
    buffer_positions: add the learned buffer position embedding.
    attention_implementation: the transformer's attention (dense-mask passes).
    shared_attention_implementation: `kernels.buffer_attention` for cached decoding.
  """

  width: int = 64
  depth: int = 4
  num_heads: int = 4
  mlp_hidden: int = 128
  max_buffer: int = 16
  embed_hidden: int = 64
  min_std: float = 1e-3
  num_components: int = 1
  max_std: float = 2.0
  buffer_positions: bool = True
  attention_implementation: str | None = None
  shared_attention_implementation: str | None = None

  def setup(self):
    self.embed_hidden_layer = nn.Dense(self.embed_hidden)
    self.embed_out = nn.Dense(self.width)
    init = nn.initializers.normal(0.02)
    self.roles = self.param("roles", init, (3, self.width))
    self.positions = self.param("positions", init, (self.max_buffer, self.width))
    self.backbone = Transformer(
      vocab_size=0,
      width=self.width,
      depth=self.depth,
      num_heads=self.num_heads,
      mlp_hidden=self.mlp_hidden,
      use_rope=False,
      attention_implementation=self.attention_implementation,
      shared_attention_implementation=self.shared_attention_implementation,
    )
    self.head_hidden = nn.Dense(self.width)
    c = self.num_components
    means = jnp.linspace(-1.0, 1.0, c) if c > 1 else jnp.zeros((1,))
    bias = jnp.concatenate([means, jnp.zeros((2 * c,))])
    self.head_out = nn.Dense(3 * c, bias_init=lambda *_: bias)

  def embed(self, x, y, role, slot) -> jax.Array:
    """Tokens `[B, L, D]` of inputs `x [B, L, dx]`, outputs `y [B, L]`, roles and buffer slots."""
    has_y = role != TARGET
    features = jnp.concatenate(
      [x, jnp.where(has_y, y, 0.0)[..., None], has_y[..., None].astype(x.dtype)], axis=-1
    )
    # one-hot products rather than gathers: their gradients are matmuls, not scatters (slow on CPU)
    h = self.embed_out(nn.gelu(self.embed_hidden_layer(features)))
    h = h + jax.nn.one_hot(role, 3, dtype=h.dtype) @ self.roles
    if self.buffer_positions:
      in_buffer = (role == BUFFER)[..., None]
      h = h + in_buffer * (jax.nn.one_hot(slot, self.max_buffer, dtype=h.dtype) @ self.positions)
    return h

  def predict(self, features) -> Predictive:
    """The predictive mixture from final features `[..., D]`."""
    c = self.num_components
    out = self.head_out(nn.gelu(self.head_hidden(features)))
    mean, raw_std, logits = out[..., :c], out[..., c : 2 * c], out[..., 2 * c :]
    std = jax.nn.softplus(raw_std)
    if c > 1:
      std = jnp.minimum(std, self.max_std)
      return Predictive(mean, std + self.min_std, jax.nn.log_softmax(logits, axis=-1))
    return Predictive(mean, std + self.min_std, jnp.zeros_like(mean))

  def __call__(self, x, y, role, slot, mask) -> Predictive:
    """A dense-mask pass over any sequence of tokens: every token's predictive, `[B, L, C]`."""
    tokens = self.embed(x, y, role, slot)
    return self.predict(self.backbone(embeddings=tokens, mask=mask).features)

  def prefill(self, x, y):
    """Encodes a context `[Bc, N]` once; returns its per-layer K/V (`[depth, Bc, N, ...]`)."""
    batch, n = y.shape
    role = jnp.full((batch, n), CONTEXT)
    tokens = self.embed(x, y, role, jnp.zeros_like(role))
    cache = init_cache(self.backbone, batch, n)
    positions = jnp.arange(n, dtype=jnp.int32)[None]
    out = self.backbone(
      embeddings=tokens, positions=positions, mask=attention.bidirectional_mask(), cache=cache
    )
    return out.cache

  def decode(self, x, y, role, slot, write_slots, q_positions, cache, shared_cache):
    """Tokens `[B, L]` against `[shared context cache, own cache]`; own keys visible to a query are
    the cache slots `<= q_positions`; K/V are written at `write_slots` (past the end: dropped)."""
    tokens = self.embed(x, y, role, slot)
    out = self.backbone(
      embeddings=tokens,
      positions=write_slots,
      mask=attention.causal_mask(q_positions=q_positions),
      cache=cache,
      shared_cache=shared_cache,
    )
    return self.predict(out.features), out.cache


def _with_feature_axis(x) -> jax.Array:
  x = jnp.asarray(x, jnp.float32)
  return x[..., None] if x.ndim == 2 else x


# ---------------------------------------------------------------------------------------------------
# The [C, B, T] sequence and its mask
# ---------------------------------------------------------------------------------------------------


def structured_mask(ctx_valid, num_buffer: int, visible) -> jax.Array:
  """Boolean `[B, 1, L, L]` mask (True = attend) of the sequence [C (N), B (K), T (M)].

  Args:
    ctx_valid: `[B, N]` bool, False for padding context slots (seen by nobody).
    num_buffer: K.
    visible: `[B, M]` int, target m sees buffer entries `i < visible[:, m]`.
  """
  batch, n = ctx_valid.shape
  m = visible.shape[1]
  length = n + num_buffer + m
  index = jnp.arange(length)
  is_buffer = (index >= n) & (index < n + num_buffer)
  slot = index - n
  # buffer row j sees buffer i < j; target row m sees buffer i < visible[m]; context rows see none
  row_limit = jnp.concatenate(
    [
      jnp.zeros((batch, n), jnp.int32),
      jnp.broadcast_to(jnp.arange(num_buffer), (batch, num_buffer)),
    ]
    + [visible.astype(jnp.int32)],
    axis=1,
  )
  sees_buffer = is_buffer[None, None, :] & (slot[None, None, :] < row_limit[:, :, None])
  valid = jnp.concatenate([ctx_valid, jnp.zeros((batch, num_buffer + m), bool)], axis=1)
  return (valid[:, None, :] | sees_buffer)[:, None]


def layout(x_ctx, y_ctx, x_buf, y_buf, x_tgt):
  """`(x [B, L, dx], y [B, L], role [B, L], slot [B, L])` of the sequence [C, B, T]."""
  x_ctx, x_buf, x_tgt = map(_with_feature_axis, (x_ctx, x_buf, x_tgt))
  batch, n = x_ctx.shape[:2]
  k, m = x_buf.shape[1], x_tgt.shape[1]
  x = jnp.concatenate([x_ctx, x_buf, x_tgt], axis=1)
  y = jnp.concatenate([y_ctx, y_buf, jnp.zeros((batch, m), y_ctx.dtype)], axis=1)
  role = jnp.concatenate([jnp.full((n,), CONTEXT), jnp.full((k,), BUFFER), jnp.full((m,), TARGET)])
  slot = jnp.concatenate([jnp.zeros((n,), jnp.int32), jnp.arange(k), jnp.zeros((m,), jnp.int32)])
  return (
    x,
    y,
    jnp.broadcast_to(role, (batch, n + k + m)),
    jnp.broadcast_to(slot, (batch, n + k + m)),
  )


def training_visible(rng, batch: int, num_targets: int, num_buffer: int) -> jax.Array:
  """`[B, M]` visible buffer prefixes of the paper's training mix: the first half of the targets
  see only the context (v = 0, set mode), the rest a prefix `v ~ U{1..K}` (buffer mode)."""
  drawn = jax.random.randint(rng, (batch, num_targets), 1, num_buffer + 1)
  return jnp.where(jnp.arange(num_targets)[None] < num_targets // 2, 0, drawn)


def gaussian_log_density(y, mean, std) -> jax.Array:
  return -0.5 * ((y - mean) / std) ** 2 - jnp.log(std) - 0.5 * math.log(2 * math.pi)


def sampling_noise(rng, num_samples: int, num_targets: int, num_components: int = 1):
  """`(eps [B, M], gumbel [B, M, C])`: the noise every sampler here turns into draws."""
  k_eps, k_gumbel = jax.random.split(rng)
  eps = jax.random.normal(k_eps, (num_samples, num_targets))
  return eps, jax.random.gumbel(k_gumbel, (num_samples, num_targets, num_components))


def target_log_density(
  model: BufferTNP, params, x_ctx, y_ctx, x_buf, y_buf, x_tgt, y_tgt, visible, ctx_valid=None
) -> jax.Array:
  """`[B, M]` log densities `log p(y_m | x_m, C, B_{<v_m})` from one dense-mask pass."""
  if ctx_valid is None:
    ctx_valid = jnp.ones(y_ctx.shape, bool)
  x, y, role, slot = layout(x_ctx, y_ctx, x_buf, y_buf, x_tgt)
  mask = structured_mask(ctx_valid, y_buf.shape[1], visible)
  predictive = model.apply(params, x, y, role, slot, mask)
  m = y_tgt.shape[1]
  return predictive.at((slice(None), slice(-m, None))).log_density(y_tgt)


def marginal_log_density(model: BufferTNP, params, x_ctx, y_ctx, x_tgt, y_tgt, ctx_valid=None):
  """`[B]` sum of independent marginals `sum_m log p(y_m | x_m, C)` (TNP-D, empty buffer)."""
  batch, m = y_tgt.shape
  empty_x = jnp.zeros((batch, 0) + _with_feature_axis(x_tgt).shape[2:])
  visible = jnp.zeros((batch, m), jnp.int32)
  log_p = target_log_density(
    model, params, x_ctx, y_ctx, empty_x, jnp.zeros((batch, 0)), x_tgt, y_tgt, visible, ctx_valid
  )
  return log_p.sum(-1)


def blocks(num_targets: int, buffer_size: int) -> list[tuple[int, int]]:
  """`(start, size)` of the successive buffers of at most `buffer_size` targets."""
  return [(s, min(buffer_size, num_targets - s)) for s in range(0, num_targets, buffer_size)]


def joint_log_density(
  model: BufferTNP, params, x_ctx, y_ctx, x_tgt, y_tgt, buffer_size: int, ctx_valid=None
) -> jax.Array:
  """`[B]` autoregressive `log p(y_1..y_M | x, C)` in the targets' given order, one pass per block
  of `buffer_size` targets: the block's true (x, y) are the buffer, its x the targets, target k
  seeing buffer entries < k; after a block, context ∪ block is re-encoded (the paper's
  fast mode for M > K)."""
  x_ctx, x_tgt = _with_feature_axis(x_ctx), _with_feature_axis(x_tgt)
  if ctx_valid is None:
    ctx_valid = jnp.ones(y_ctx.shape, bool)
  total = jnp.zeros(y_tgt.shape[:1])
  for start, size in blocks(y_tgt.shape[1], buffer_size):
    x_blk, y_blk = x_tgt[:, start : start + size], y_tgt[:, start : start + size]
    xc = jnp.concatenate([x_ctx, x_tgt[:, :start]], axis=1)
    yc = jnp.concatenate([y_ctx, y_tgt[:, :start]], axis=1)
    valid = jnp.concatenate([ctx_valid, jnp.ones((y_tgt.shape[0], start), bool)], axis=1)
    visible = jnp.broadcast_to(jnp.arange(size), y_blk.shape)
    log_p = target_log_density(model, params, xc, yc, x_blk, y_blk, x_blk, y_blk, visible, valid)
    total = total + log_p.sum(-1)
  return total


def reencode_log_density(
  model: BufferTNP, params, x_ctx, y_ctx, x_tgt, y_tgt, ctx_valid=None
) -> jax.Array:
  """`[B]` the TNP-D-AR joint density `sum_k log p(y_k | x_k, C ∪ {(x_i, y_i)}_{i<k})` with one
  compiled set-mode pass (context padded to N + M - 1, masked) scanned over k; equal to
  `joint_log_density(..., buffer_size=1)`."""
  x_ctx, x_tgt = _with_feature_axis(x_ctx), _with_feature_axis(x_tgt)
  batch, m = y_tgt.shape
  if ctx_valid is None:
    ctx_valid = jnp.ones(y_ctx.shape, bool)
  xc = jnp.concatenate([x_ctx, x_tgt[:, : m - 1]], axis=1)
  yc = jnp.concatenate([y_ctx, y_tgt[:, : m - 1]], axis=1)
  no_buffer = jnp.zeros((batch, 0, x_ctx.shape[2]))

  def step(total, k):
    earlier = jnp.arange(m - 1) < k
    valid = jnp.concatenate([ctx_valid, jnp.broadcast_to(earlier, (batch, m - 1))], axis=1)
    x_k = jax.lax.dynamic_slice_in_dim(x_tgt, k, 1, axis=1)
    y_k = jax.lax.dynamic_slice_in_dim(y_tgt, k, 1, axis=1)
    visible = jnp.zeros((batch, 1), jnp.int32)
    log_p = target_log_density(
      model, params, xc, yc, no_buffer, jnp.zeros((batch, 0)), x_k, y_k, visible, valid
    )
    return total + log_p[:, 0], None

  total, _ = jax.lax.scan(step, jnp.zeros((batch,)), jnp.arange(m))
  return total


# ---------------------------------------------------------------------------------------------------
# Cached inference: context encoded once, a per-stream buffer cache
# ---------------------------------------------------------------------------------------------------


def encode_context(model: BufferTNP, params, x_ctx, y_ctx):
  """Per-layer K/V `{"k", "v"}: [depth, Bc, N, kv_heads, head_dim]` of a context `[Bc, N]`."""
  return model.apply(params, _with_feature_axis(x_ctx), y_ctx, method=BufferTNP.prefill)


def decode_step(model: BufferTNP, params, context_cache, buffer_cache, x_prev, y_prev, x_next, k):
  """Step k of a block: commits buffer token k-1 `(x_prev, y_prev)` (none at k = 0) and predicts
  target k at `x_next`, for every stream. `x_prev, x_next [B, dx]`, `y_prev [B]`.

  Returns `(the target's Predictive [B, C], buffer_cache)`."""
  batch = y_prev.shape[0]
  slots = buffer_cache["k"].shape[2]
  x = jnp.stack([x_prev, x_next], axis=1)
  y = jnp.stack([y_prev, jnp.zeros_like(y_prev)], axis=1)
  role = jnp.broadcast_to(jnp.asarray([BUFFER, TARGET]), (batch, 2))
  slot = jnp.broadcast_to(jnp.stack([k - 1, jnp.zeros_like(k)]), (batch, 2))
  write = jnp.stack([jnp.where(k > 0, k - 1, slots), jnp.asarray(slots)])[None].astype(jnp.int32)
  q_positions = jnp.stack([k - 2, k - 1])[None].astype(jnp.int32)
  predictive, buffer_cache = model.apply(
    params,
    x,
    y,
    role,
    slot,
    write,
    q_positions,
    buffer_cache,
    context_cache,
    method=BufferTNP.decode,
  )
  return predictive.at((slice(None), 1)), buffer_cache


def _sample_block(model, params, context_cache, x_blk, noise):
  """Samples one buffer block of targets `x_blk [size, dx]` for every stream from `noise` (the
  block's part of `sampling_noise`): `(y, log_p)`, each `[B, size]`."""
  num_samples, size = noise[0].shape
  buffer_cache = init_cache(_backbone(model), num_samples, size)
  x_prev_all = jnp.concatenate([x_blk[:1], x_blk[:-1]], axis=0)

  def step(carry, inputs):
    cache, y_prev = carry
    k, x_prev, x_next, eps, gumbel = inputs
    broadcast = lambda v: jnp.broadcast_to(v, (num_samples,) + v.shape)  # noqa: E731
    predictive, cache = decode_step(
      model, params, context_cache, cache, broadcast(x_prev), y_prev, broadcast(x_next), k
    )
    y = predictive.sample(eps, gumbel)
    return (cache, y), (y, predictive.log_density(y))

  eps, gumbel = noise
  inputs = (jnp.arange(size), x_prev_all, x_blk, eps.T, gumbel.transpose(1, 0, 2))
  carry = (buffer_cache, jnp.zeros((num_samples,)))
  _, (y, log_p) = jax.lax.scan(step, carry, inputs)
  return y.T, log_p.T


def _backbone(model: BufferTNP) -> Transformer:
  """The transformer `model.setup` builds, as a plain module (for `init_cache`'s shapes)."""
  return Transformer(
    vocab_size=0,
    width=model.width,
    depth=model.depth,
    num_heads=model.num_heads,
    mlp_hidden=model.mlp_hidden,
    use_rope=False,
  )


def sample_joint(model: BufferTNP, params, x_ctx, y_ctx, x_tgt, noise, buffer_size: int):
  """Joint draws of the targets of ONE task with the buffer: `(y [B, M], log_p [B])`.

  Args:
    x_ctx `[N, dx]` or `[N]`, y_ctx `[N]`: the context; x_tgt `[M, dx]` or `[M]`: the targets, in
      decoding order; noise: `sampling_noise(rng, B, M, C)` for B streams.
    buffer_size: K; blocks of K targets share one encoded context (the first block: the given
      context, encoded once for all streams; later ones: context ∪ each stream's draws,
      re-encoded per stream). K = 1 is AR re-encoding, as `sample_reencode`.
  """
  x_ctx, x_tgt = _with_feature_axis(x_ctx[None])[0], _with_feature_axis(x_tgt[None])[0]
  num_samples = noise[0].shape[0]
  draws, log_ps = [], []
  for start, size in blocks(x_tgt.shape[0], buffer_size):
    xc = jnp.concatenate([x_ctx, x_tgt[:start]], axis=0)
    yc = jnp.concatenate([jnp.broadcast_to(y_ctx, (num_samples, y_ctx.shape[0]))] + draws, 1)
    if start == 0:  # one context for every stream
      xc, yc = xc[None], y_ctx[None]
    else:
      xc = jnp.broadcast_to(xc, (num_samples,) + xc.shape)
    context_cache = encode_context(model, params, xc, yc)
    block_noise = tuple(a[:, start : start + size] for a in noise)
    y, log_p = _sample_block(model, params, context_cache, x_tgt[start : start + size], block_noise)
    draws.append(y)
    log_ps.append(log_p)
  return jnp.concatenate(draws, axis=1), jnp.concatenate(log_ps, axis=1).sum(-1)


def sample_reencode(model: BufferTNP, params, x_ctx, y_ctx, x_tgt, noise):
  """The TNP-D-AR baseline: for k = 1..M, every stream re-runs the set model on
  [C ∪ its draws y_{<k}, target k] (one dense pass of N + M tokens per stream and step, the context
  padded to N + M - 1 and masked, so that one compiled step serves all k). `(y [B, M], log_p [B])`."""
  x_ctx, x_tgt = _with_feature_axis(x_ctx[None]), _with_feature_axis(x_tgt[None])
  num_samples, m = noise[0].shape
  n = x_ctx.shape[1]
  xc = jnp.broadcast_to(
    jnp.concatenate([x_ctx, x_tgt[:, : m - 1]], axis=1), (num_samples, n + m - 1, x_ctx.shape[2])
  )
  no_buffer = jnp.zeros((num_samples, 0, x_ctx.shape[2]))
  y0 = jnp.zeros((num_samples, n + m - 1)).at[:, :n].set(y_ctx[None])

  def step(yc, inputs):
    k, x_next, eps, gumbel = inputs
    valid = jnp.broadcast_to(jnp.arange(n + m - 1) < n + k, yc.shape)
    xt = jnp.broadcast_to(x_next, (num_samples, 1, x_next.shape[-1]))
    x, y, role, slot = layout(xc, yc, no_buffer, jnp.zeros((num_samples, 0)), xt)
    mask = structured_mask(valid, 0, jnp.zeros((num_samples, 1), jnp.int32))
    predictive = model.apply(params, x, y, role, slot, mask).at((slice(None), -1))
    draw = predictive.sample(eps, gumbel)
    yc = jax.lax.dynamic_update_slice_in_dim(yc, draw[:, None], jnp.minimum(n + k, n + m - 2), 1)
    return yc, (draw, predictive.log_density(draw))

  eps, gumbel = noise
  inputs = (jnp.arange(m), x_tgt[0], eps.T, gumbel.transpose(1, 0, 2))
  _, (y, log_p) = jax.lax.scan(step, y0, inputs)
  return y.T, log_p.sum(0)


def sample_reencode_unpadded(model: BufferTNP, params, x_ctx, y_ctx, x_tgt, noise):
  """TNP-D-AR at each step's true length: step k (1-based) runs [C ∪ the stream's draws y_{<k},
  target k], N + k tokens per stream, with no padding. The steps are unrolled in Python, so one
  jitted sampler holds M forward passes, each compiled for its own length (compile time grows with
  M; run time is what `sample_reencode`'s padding to N + M tokens per step costs on top). Same law
  and, for the same noise, the same draws as `sample_reencode`. `(y [B, M], log_p [B])`."""
  x_ctx, x_tgt = _with_feature_axis(x_ctx[None]), _with_feature_axis(x_tgt[None])
  num_samples, m = noise[0].shape
  eps, gumbel = noise
  no_buffer = jnp.zeros((num_samples, 0, x_ctx.shape[2]))
  xc = jnp.broadcast_to(x_ctx, (num_samples,) + x_ctx.shape[1:])
  yc = jnp.broadcast_to(y_ctx[None], (num_samples, y_ctx.shape[0]))
  draws, log_ps = [], []
  for k in range(m):
    xt = jnp.broadcast_to(x_tgt[:, k : k + 1], (num_samples, 1, x_tgt.shape[2]))
    x, y, role, slot = layout(xc, yc, no_buffer, jnp.zeros((num_samples, 0)), xt)
    mask = structured_mask(jnp.ones(yc.shape, bool), 0, jnp.zeros((num_samples, 1), jnp.int32))
    predictive = model.apply(params, x, y, role, slot, mask).at((slice(None), -1))
    draw = predictive.sample(eps[:, k], gumbel[:, k])
    draws.append(draw)
    log_ps.append(predictive.log_density(draw))
    xc = jnp.concatenate([xc, xt], axis=1)
    yc = jnp.concatenate([yc, draw[:, None]], axis=1)
  return jnp.stack(draws, axis=1), jnp.stack(log_ps, axis=1).sum(-1)


def cached_joint_log_density(model: BufferTNP, params, x_ctx, y_ctx, x_tgt, y_tgt):
  """`[B]` joint log density of targets `[B, M]` (M <= max_buffer) against ONE shared context
  `[N]`, in one pass of [B_1..B_M, T_1..T_M] over the cached context: buffer j sees buffer slots
  < j, target k buffer slots < k, generated from indices (`kernels.buffer_attention`)."""
  x_ctx = _with_feature_axis(x_ctx[None])
  x_tgt = _with_feature_axis(x_tgt)
  batch, m = y_tgt.shape
  context_cache = encode_context(model, params, x_ctx, y_ctx[None])
  x = jnp.concatenate([x_tgt, x_tgt], axis=1)
  y = jnp.concatenate([y_tgt, jnp.zeros_like(y_tgt)], axis=1)
  role = jnp.broadcast_to(
    jnp.concatenate([jnp.full((m,), BUFFER), jnp.full((m,), TARGET)]), (batch, 2 * m)
  )
  slot = jnp.broadcast_to(
    jnp.concatenate([jnp.arange(m), jnp.zeros((m,), jnp.int32)]), (batch, 2 * m)
  )
  # own keys are the call's 2M tokens at positions 0..2M-1; q position p sees positions <= p
  q_positions = jnp.concatenate([jnp.arange(m) - 1, jnp.arange(m) - 1])[None]

  def features_of(module):
    return module.backbone(
      embeddings=module.embed(x, y, role, slot),
      mask=attention.causal_mask(q_positions=q_positions),
      shared_cache=context_cache,
    ).features

  features = nn.apply(features_of, model)(params)
  predictive = model.apply(params, features[:, m:], method=BufferTNP.predict)
  return predictive.log_density(y_tgt).sum(-1)
