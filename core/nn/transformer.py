"""One decoder-style transformer stack for every sequence model of the codebase.

`Transformer` is a stack of pre-norm blocks (Vaswani et al. 2017, "Attention Is All You Need", with
the norm before each sublayer as in GPT-2 / Xiong et al. 2020):

  x = embed(tokens) and/or project(embeddings)                               [B, L, D]
  for each block:  x = x + Attn(RMSNorm(x), positions, mask, cache)
                   x = x + MLP(RMSNorm(x))
  features = RMSNorm(x);  logits = features @ E^T (tied) or a separate head   [B, L, V] float32

Choices:
  * RMSNorm (Zhang & Sennrich 2019) with a learned scale, eps 1e-6, reductions in float32.
  * Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer", Eq. 34) on queries and keys, in the
    rotate-half layout of GPT-NeoX, base 10000, angles in float32. Positions are an input
    (`positions [B, L]`, default `0..L-1`), so cached decoding, left/right padding and packed
    segments (positions restarting per segment) need no other change.
  * MLP: SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", FFN_SwiGLU) or GELU; the SwiGLU
    hidden width defaults to 8D/3 (rounded up to a multiple of 8), parameter-matched to GELU's 4D.
  * Grouped-query attention (Ainslie et al. 2023) with `num_kv_heads` dividing `num_heads`; no biases
    in the projections unless `attention_bias` (query/key/value biases, the output projection
    without one, as in Qwen2 and Qwen2.5-VL's language model).
  * Multimodal RoPE (M-RoPE, Qwen2-VL / Qwen2.5-VL, transformers' `Qwen2_5_VLRotaryEmbedding`):
    with `mrope_section = (s_t, s_h, s_w)` (summing to head_dim / 2) the rotary frequency pairs are
    split in three consecutive groups that rotate by the temporal, height and width position ids
    `rope_positions [3, B, L]`; a text token has the three equal, which is plain RoPE. The rotary
    positions are an input of their own (`rope_positions`, default `positions`) because M-RoPE ids
    of visual tokens are not the sequence index that names the token's cache slot.
  * Masks are data: the caller passes an `attention.Mask` (causal, bidirectional, prefix-LM, packed
    segments, padding, arbitrary boolean `[B, 1 or H, Lq, Lk]`) or a boolean array; None = no mask.
  * Inputs: token ids `[B, L]`, continuous embeddings `[B, L, D]` (or `[B, L, input_dim]`, projected),
    or both: the embeddings are prepended, or replace the token embeddings where `embeddings_at`
    `[B, L]` is True (a VLM's visual tokens). `vocab_size = 0` makes a model without token tables
    (continuous inputs, `logits` None; read `features`).
  * Tied input/output embeddings by default; embedding init N(0, 1/D) so that tied logits start at
    unit scale. Logits are returned in float32 whatever the compute `dtype`.
  * KV cache (for `core/decoding.py`): `init_cache` makes `{"k", "v"}` of static shape
    `[depth, B, max_len, kv_heads, head_dim]`; with `cache=`, each token's keys and values are
    written at the cache slot equal to its position (`positions [B, Lq]`, so right-padded batches
    write each row at its own slot) and the queries attend over the whole cache under `mask`
    (`attention.causal_mask(q_positions=positions)` hides unwritten slots). The updated cache is
    returned. A cache holds one sequence per row: packed segments are for training only.
  * Sets instead of sequences: `use_rope = False` drops the rotary embedding, so attention is
    permutation-equivariant (transformer neural processes: "Efficient Autoregressive Inference for
    Transformer Probabilistic Models", ICLR 2026); `positions` then only name cache slots.
  * A shared read-only prefix (`shared_cache=`, same layout as a cache with batch 1 or B): every
    row's queries also see these per-layer keys/values, all of them, in the same softmax as their
    own keys (of `cache`, or of the call's tokens), to which `mask` applies. One encoded context
    serves many sample streams without being copied per row; the attention is
    `kernels.buffer_attention` (`shared_attention_implementation`) when `mask` is none or causal
    with query positions only (a prefix of each row's own keys), else the broadcast prefix under
    the dense mask.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core.nn import attention as attention_lib

MLP_KINDS = ("swiglu", "gelu")


class TransformerOutput(NamedTuple):
  logits: jax.Array | None  # [B, L, vocab] float32; None when vocab_size == 0
  features: jax.Array  # [B, L, D]: the final RMSNorm of the last block, what the head reads
  hidden_states: jax.Array | None  # [depth + 1, B, L, D]: the input, then each block's output
  cache: dict[str, jax.Array] | None  # the updated KV cache, when one was passed


def rope(
  x: jax.Array,
  positions: jax.Array,
  base: float = 10_000.0,
  sections: tuple[int, ...] | None = None,
) -> jax.Array:
  """Rotary embedding of `x [B, L, H, D]` at `positions [B or 1, L]` (Su et al. 2021, Eq. 34):
  channel pairs `(i, i + D/2)` rotate by `position * base^(-2i/D)`. With `sections` (M-RoPE),
  `positions` is `[len(sections), B or 1, L]` and pair `i` reads the position axis of the section
  it falls in (sections are consecutive runs of pairs summing to D/2)."""
  half = x.shape[-1] // 2
  freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  positions = positions.astype(jnp.float32)
  if sections is None:
    angles = positions[..., None, None] * freqs  # [B, L, 1, D/2]
  else:
    axis = np.repeat(np.arange(len(sections)), sections)  # pair -> position axis
    angles = (jnp.moveaxis(positions, 0, -1)[..., axis] * freqs)[..., None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def own_key_lengths(mask, batch: int, q_len: int, kv_len: int) -> jax.Array | None:
  """`[B, Lq]` counts of leading own keys each query sees, where `mask` says exactly that (none, or
  causal over default key positions with query positions only); None for any other mask."""
  mask = attention_lib.as_mask(mask)
  rest = () if mask is None else (mask.kv_positions, mask.prefix_lengths, mask.segment_ids)
  rest += () if mask is None else (mask.kv_valid, mask.dense)
  if any(part is not None for part in rest):
    return None
  if mask is None or not mask.causal:
    return jnp.full((batch, q_len), kv_len, jnp.int32)
  positions = jnp.broadcast_to(attention_lib._positions(mask.q_positions, q_len), (batch, q_len))
  return jnp.clip(positions + 1, 0, kv_len)


def shared_prefix_attention(q, shared_k, shared_v, k, v, mask, implementation=None) -> jax.Array:
  """Attention of `q [B, Lq, H, D]` over `[shared prefix (all visible), own keys under mask]`.

  `shared_k/v`: `[1 or B, N, kv_heads, D]`. Uses `kernels.buffer_attention` (no per-row copy of
  the prefix) when the mask is a prefix of the own keys (`own_key_lengths`), else broadcasts.
  """
  from kernels.buffer_attention import buffer_attention  # Pallas imports only when used

  batch, q_len = q.shape[:2]
  lengths = own_key_lengths(mask, batch, q_len, k.shape[1])
  shared_k, shared_v = shared_k.astype(q.dtype), shared_v.astype(q.dtype)
  if lengths is not None:
    return buffer_attention(q, shared_k, shared_v, k, v, lengths, implementation=implementation)

  def widen(prefix, own):
    return jnp.concatenate([jnp.broadcast_to(prefix, (batch,) + prefix.shape[1:]), own], axis=1)

  own_mask = attention_lib.as_mask(mask).to_dense(batch, q_len, k.shape[1])
  seen = jnp.ones(own_mask.shape[:3] + (shared_k.shape[1],), bool)
  dense = jnp.concatenate([seen, own_mask], axis=-1)
  return attention_lib.attention(q, widen(shared_k, k), widen(shared_v, v), dense)


def write_cache(cache, layer: int, k: jax.Array, v: jax.Array, positions: jax.Array):
  """Writes `k, v [B, L, kv_heads, head_dim]` of layer `layer` at slots `positions [B, L]`; slots
  past the cache's end are dropped."""
  rows = jnp.arange(k.shape[0])[:, None]
  return {
    "k": cache["k"].at[layer, rows, positions].set(k.astype(cache["k"].dtype), mode="drop"),
    "v": cache["v"].at[layer, rows, positions].set(v.astype(cache["v"].dtype), mode="drop"),
  }


class SelfAttention(nn.Module):
  """Multi-head (grouped-query) attention with RoPE and an optional KV cache."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  layer: int
  rope_base: float = 10_000.0
  implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_rope: bool = True
  shared_implementation: str | None = None
  attention_bias: bool = False
  mrope_section: tuple[int, ...] | None = None

  @nn.compact
  def __call__(self, x, positions, mask, cache, shared_cache=None, rope_positions=None):
    dense = functools.partial(
      nn.DenseGeneral, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype
    )
    projection = functools.partial(dense, use_bias=self.attention_bias)
    q = projection((self.num_heads, self.head_dim), name="query")(x)
    k = projection((self.num_kv_heads, self.head_dim), name="key")(x)
    v = projection((self.num_kv_heads, self.head_dim), name="value")(x)
    if self.use_rope:
      rotary = functools.partial(
        rope,
        positions=positions if rope_positions is None else rope_positions,
        base=self.rope_base,
        sections=self.mrope_section,
      )
      q, k = rotary(q), rotary(k)
    if cache is not None:
      cache = write_cache(cache, self.layer, k, v, positions)
      k, v = cache["k"][self.layer].astype(q.dtype), cache["v"][self.layer].astype(q.dtype)
    if shared_cache is None:
      out = attention_lib.attention(q, k, v, mask, implementation=self.implementation)
    else:
      shared_k, shared_v = shared_cache["k"][self.layer], shared_cache["v"][self.layer]
      out = shared_prefix_attention(q, shared_k, shared_v, k, v, mask, self.shared_implementation)
    return dense(x.shape[-1], axis=(-2, -1), name="out")(out), cache


class Mlp(nn.Module):
  """SwiGLU `W2 (silu(W1 x) * W3 x)` or GELU `W2 gelu(W1 x)`."""

  kind: str
  hidden: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dense = functools.partial(
      nn.Dense, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype
    )
    if self.kind == "swiglu":
      h = nn.silu(dense(self.hidden, name="gate")(x)) * dense(self.hidden, name="up")(x)
    else:
      h = nn.gelu(dense(self.hidden, name="up")(x))
    return dense(x.shape[-1], name="down")(h)


class Block(nn.Module):
  """`x + Attn(RMSNorm(x))`, then `+ MLP(RMSNorm(x))`."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp: str
  mlp_hidden: int
  layer: int
  rope_base: float = 10_000.0
  norm_eps: float = 1e-6
  implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_rope: bool = True
  shared_implementation: str | None = None
  attention_bias: bool = False
  mrope_section: tuple[int, ...] | None = None

  @nn.compact
  def __call__(self, x, positions, mask, cache, shared_cache=None, rope_positions=None):
    norm = functools.partial(
      nn.RMSNorm, epsilon=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype
    )
    h, cache = SelfAttention(
      self.num_heads,
      self.num_kv_heads,
      self.head_dim,
      self.layer,
      self.rope_base,
      self.implementation,
      self.dtype,
      self.param_dtype,
      self.use_rope,
      self.shared_implementation,
      self.attention_bias,
      self.mrope_section,
      name="attention",
    )(norm(name="attention_norm")(x), positions, mask, cache, shared_cache, rope_positions)
    x = x + h
    mlp = Mlp(self.mlp, self.mlp_hidden, self.dtype, self.param_dtype, name="mlp")
    return x + mlp(norm(name="mlp_norm")(x)), cache


class Transformer(nn.Module):
  """The shared decoder-style stack (module docstring).

  Attributes:
    vocab_size: token vocabulary; 0 for a model on continuous inputs only (no logits).
    width: model width D.
    depth: number of blocks; 0 gives `logits = head(RMSNorm(embed(token)))`, a context-1 (bigram)
      model with the same tables and head as the deeper stacks.
    num_heads: query heads; divides `width`, and `width / num_heads` is even (RoPE).
    num_kv_heads: key/value heads (grouped-query attention); None = `num_heads`.
    mlp: "swiglu" or "gelu".
    mlp_hidden: MLP hidden width; None = 8D/3 rounded up to a multiple of 8 (SwiGLU) or 4D (GELU).
    tie_embeddings: logits from the input embedding table (else a separate `unembed` head).
    input_dim: width of continuous `embeddings` when they are not already `width` wide (projected).
    rope_base: RoPE's base period.
    norm_eps: RMSNorm epsilon.
    attention_implementation: see `core.nn.attention.attention`.
    remat: recompute each block's activations in the backward pass (memory for compute).
    dtype: compute dtype (e.g. bfloat16); param_dtype: storage dtype of the parameters.
    use_rope: rotary position embeddings; False for set inputs (positions then only name slots).
    shared_attention_implementation: `kernels.buffer_attention`'s implementation for calls with
      a `shared_cache` (None: the kernel on GPU/TPU, XLA on CPU).
    attention_bias: biases on the query, key and value projections (Qwen2); none on the output.
    mrope_section: M-RoPE's `(temporal, height, width)` split of the head_dim / 2 rotary pairs
      (Qwen2.5-VL: (16, 24, 24)); None = plain RoPE.
  """

  vocab_size: int
  width: int
  depth: int
  num_heads: int
  num_kv_heads: int | None = None
  mlp: str = "swiglu"
  mlp_hidden: int | None = None
  tie_embeddings: bool = True
  input_dim: int | None = None
  rope_base: float = 10_000.0
  norm_eps: float = 1e-6
  attention_implementation: str | None = None
  remat: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_rope: bool = True
  shared_attention_implementation: str | None = None
  attention_bias: bool = False
  mrope_section: tuple[int, ...] | None = None

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  @property
  def hidden_width(self) -> int:
    if self.mlp_hidden is not None:
      return self.mlp_hidden
    return -(-8 * self.width // 3 // 8) * 8 if self.mlp == "swiglu" else 4 * self.width

  def check(self) -> None:
    """Raises ValueError naming the attribute that cannot work."""
    for name in ("width", "num_heads", "kv_heads"):
      if getattr(self, name) <= 0:
        raise ValueError(f"Transformer: {name} must be positive, got {getattr(self, name)}")
    if self.depth < 0:
      raise ValueError(f"Transformer: depth must be >= 0, got {self.depth}")
    if self.width % self.num_heads:
      raise ValueError(f"Transformer: num_heads={self.num_heads} must divide width={self.width}")
    if self.head_dim % 2:
      raise ValueError(f"Transformer: head dim width/num_heads={self.head_dim} must be even (RoPE)")
    if self.num_heads % self.kv_heads:
      raise ValueError(
        f"Transformer: num_kv_heads={self.kv_heads} must divide num_heads={self.num_heads}"
      )
    if self.mlp not in MLP_KINDS:
      raise ValueError(f"Transformer: mlp must be one of {MLP_KINDS}, got {self.mlp!r}")
    if self.mrope_section is not None and sum(self.mrope_section) != self.head_dim // 2:
      raise ValueError(
        f"Transformer: mrope_section={tuple(self.mrope_section)} must sum to head_dim / 2 = "
        f"{self.head_dim // 2}"
      )

  @nn.compact
  def __call__(
    self,
    tokens: jax.Array | None = None,
    embeddings: jax.Array | None = None,
    *,
    embeddings_at: jax.Array | None = None,
    positions: jax.Array | None = None,
    mask: attention_lib.Mask | jax.Array | None = None,
    cache: dict[str, jax.Array] | None = None,
    shared_cache: dict[str, jax.Array] | None = None,
    logits_at: jax.Array | None = None,
    return_hidden: bool = False,
    rope_positions: jax.Array | None = None,
  ) -> TransformerOutput:
    """Runs the stack.

    Args:
      tokens: int `[B, L]` token ids.
      embeddings: float `[B, Le, D or input_dim]`; prepended to the token embeddings, or (with
        `embeddings_at`) replacing them.
      embeddings_at: bool `[B, L]`: where `embeddings [B, L, .]` replace the token embeddings.
      positions: int `[B or 1, L]` RoPE positions, and cache slots with `cache`; default `0..L-1`.
      mask: an `attention.Mask` or boolean `[B or 1, 1 or H, L, L_keys]`; None = no mask.
      cache: `init_cache(...)`'s dict; the keys are then the cache's `max_len` slots.
      shared_cache: a read-only `{"k", "v"}` of `[depth, 1 or B, N, kv_heads, head_dim]` (e.g. the
        `cache` a prefill returned) that every query also sees, whole (module docstring).
      logits_at: int `[B, K]` positions: the head runs on those positions' features only and
        `logits` is `[B, K, V]` (a prefill's last token, a chain's predictions: with a large
        vocabulary the `[B, L, V]` logits of a long prompt never exist).
      return_hidden: also return every block's output, `[depth + 1, B, L, D]`.
      rope_positions: int rotary positions when they differ from `positions`: `[B or 1, L]`, or
        with `mrope_section` `[3, B or 1, L]` (M-RoPE's temporal / height / width ids; a 2-D
        array gives all three axes the same ids). Default: `positions`.
    """
    self.check()
    table = None
    if self.vocab_size:
      table = nn.Embed(
        self.vocab_size,
        self.width,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        embedding_init=nn.initializers.normal(self.width**-0.5),
        name="embed",
      )
    x = self._inputs(table, tokens, embeddings, embeddings_at)
    batch, length = x.shape[:2]
    positions = self._positions(positions, batch, length)
    rope_positions = self._rope_positions(rope_positions, positions, batch, length)
    mask = attention_lib.as_mask(mask)
    if cache is not None:
      self._check_cache(cache, batch)
      if mask is None:
        raise ValueError(
          "Transformer: mask is required with a cache (e.g. causal_mask(q_positions=positions))"
        )
    if shared_cache is not None:
      self._check_cache(shared_cache, batch, shared=True)
    block = nn.remat(Block) if self.remat else Block
    hidden = [x]
    for layer in range(self.depth):
      x, cache = block(
        self.num_heads,
        self.kv_heads,
        self.head_dim,
        self.mlp,
        self.hidden_width,
        layer,
        self.rope_base,
        self.norm_eps,
        self.attention_implementation,
        self.dtype,
        self.param_dtype,
        self.use_rope,
        self.shared_attention_implementation,
        self.attention_bias,
        None if self.mrope_section is None else tuple(self.mrope_section),
        name=f"block_{layer}",
      )(x, positions, mask, cache, shared_cache, rope_positions)
      hidden.append(x)
    features = nn.RMSNorm(
      epsilon=self.norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, name="final_norm"
    )(x)
    logits = None
    if table is not None:
      head_input = features
      if logits_at is not None:
        head_input = jnp.take_along_axis(features, jnp.asarray(logits_at)[..., None], axis=1)
      if self.tie_embeddings:
        logits = table.attend(head_input)
      else:
        logits = nn.Dense(
          self.vocab_size,
          use_bias=False,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name="unembed",
        )(head_input)
      logits = logits.astype(jnp.float32)
    return TransformerOutput(logits, features, jnp.stack(hidden) if return_hidden else None, cache)

  def _inputs(self, table, tokens, embeddings, embeddings_at) -> jax.Array:
    if tokens is None and embeddings is None:
      raise ValueError("Transformer: pass tokens [B, L], embeddings [B, L, D], or both")
    parts = []
    if tokens is not None:
      if table is None:
        raise ValueError("Transformer: tokens need vocab_size > 0")
      if np.ndim(tokens) != 2 or not jnp.issubdtype(jnp.asarray(tokens).dtype, jnp.integer):
        raise ValueError(f"Transformer: tokens must be int [batch, length], got {_spec(tokens)}")
      parts.append(table(tokens))
    if embeddings is not None:
      embeddings = self._project(embeddings, None if tokens is None else np.shape(tokens)[0])
      if embeddings_at is not None:
        return self._replace(parts[0] if parts else None, embeddings, embeddings_at)
      parts.insert(0, embeddings)
    elif embeddings_at is not None:
      raise ValueError("Transformer: embeddings_at needs embeddings")
    return jnp.concatenate(parts, axis=1).astype(self.dtype) if len(parts) > 1 else parts[0]

  def _project(self, embeddings, batch: int | None) -> jax.Array:
    width = self.input_dim or self.width
    shape = np.shape(embeddings)
    if len(shape) != 3 or shape[-1] != width or (batch is not None and shape[0] != batch):
      raise ValueError(
        f"Transformer: embeddings must have shape [{batch or 'batch'}, length, {width}], got "
        f"{shape}"
      )
    embeddings = jnp.asarray(embeddings, self.dtype)
    if self.input_dim is None:
      return embeddings
    return nn.Dense(
      self.width, dtype=self.dtype, param_dtype=self.param_dtype, name="input_projection"
    )(embeddings)

  @staticmethod
  def _replace(token_embeddings, embeddings, embeddings_at) -> jax.Array:
    if token_embeddings is None:
      raise ValueError("Transformer: embeddings_at needs tokens as well")
    if np.shape(embeddings_at) != token_embeddings.shape[:2] or (
      embeddings.shape != token_embeddings.shape
    ):
      raise ValueError(
        f"Transformer: embeddings_at {np.shape(embeddings_at)} and embeddings "
        f"{embeddings.shape} must match the tokens' [batch, length] {token_embeddings.shape[:2]}"
      )
    return jnp.where(jnp.asarray(embeddings_at)[..., None], embeddings, token_embeddings)

  @staticmethod
  def _positions(positions, batch: int, length: int) -> jax.Array:
    if positions is None:
      return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if (
      np.ndim(positions) != 2
      or np.shape(positions)[0] not in (1, batch)
      or (np.shape(positions)[1] != length)
    ):
      raise ValueError(
        f"Transformer: positions must have shape [{batch} or 1, {length}], got "
        f"{np.shape(positions)}"
      )
    return jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (batch, length))

  def _rope_positions(self, rope_positions, positions, batch: int, length: int):
    """`[B, L]` (plain RoPE) or `[3, B, L]` (M-RoPE) rotary positions."""
    if rope_positions is None:
      rope_positions = positions
    axes = () if self.mrope_section is None else (3,)
    shape = np.shape(rope_positions)
    if len(shape) == 2 and axes:
      rope_positions, shape = jnp.asarray(rope_positions)[None], (1,) + shape
    if len(shape) != 2 + len(axes) or shape[-2] not in (1, batch) or shape[-1] != length:
      raise ValueError(
        f"Transformer: rope_positions must have shape [{'3, ' if axes else ''}{batch} or 1, "
        f"{length}], got {np.shape(rope_positions)}"
      )
    if axes and shape[0] not in (1, 3):
      raise ValueError(f"Transformer: M-RoPE rope_positions need 3 axes, got {shape}")
    return jnp.broadcast_to(jnp.asarray(rope_positions, jnp.int32), axes + (batch, length))

  def _check_cache(self, cache, batch: int, shared: bool = False) -> None:
    what = "shared_cache" if shared else "cache"
    if not isinstance(cache, dict) or set(cache) != {"k", "v"}:
      raise ValueError(f"Transformer: {what} must be init_cache(...)'s dict with keys 'k' and 'v'")
    rows = (1, batch) if shared else (batch,)
    for name, array in cache.items():
      shape = np.shape(array)
      ok = len(shape) == 5 and shape[1] in rows and shape[2] >= (1 if shared else 0)
      if not ok or (shape[0], shape[3], shape[4]) != (self.depth, self.kv_heads, self.head_dim):
        raise ValueError(
          f"Transformer: {what}['{name}'] must have shape [depth={self.depth}, batch="
          f"{' or '.join(map(str, rows))}, max_len, kv_heads={self.kv_heads}, head_dim="
          f"{self.head_dim}], got {shape}"
        )


def _spec(x) -> str:
  return f"shape {np.shape(x)} dtype {getattr(x, 'dtype', type(x).__name__)}"


def init_cache(
  model: Transformer, batch_size: int, max_len: int, dtype=None
) -> dict[str, jax.Array]:
  """An empty KV cache `{"k", "v"}`, each `[depth, batch, max_len, kv_heads, head_dim]`."""
  shape = (model.depth, batch_size, max_len, model.kv_heads, model.head_dim)
  dtype = dtype or model.dtype
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
