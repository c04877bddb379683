"""A video diffusion transformer (Latte / Open-Sora-style DiT) whose blocks can be run one at a time.

`x (B, F, H, W, C)` -> patchify `(pt, ph, pw)` -> tokens `(B, L, D)`, `L = F' * S` ordered frame-major
(`S` tokens per frame, row-major within a frame) + fixed sin-cos positions -> N AdaLN-Zero blocks
conditioned on the timestep (and optionally a class label) -> final AdaLN + linear -> unpatchify to the
input's shape.

Positions: `"sincos3d"` adds one 3D sin-cos table to the tokens; `"latte"` is Latte's layout (Ma et al.
2024, Sec. 3): a 2D sin-cos table per frame (first half of the channels encodes the column, second half
the row) added to the tokens, and a 1D sin-cos table over frames added to the input of the first
temporal block (block 1). With `learn_sigma` the final linear predicts `2C` channels per pixel (eps and
the variance interpolation of improved DDPM) and the head keeps the first `C`: deterministic DDIM uses
only eps. `core/nn/dit_convert.py` maps a Latte state dict onto this module.

Blocks attend over all `L` tokens (`attention="full"`) or alternate spatial (within a frame) and
temporal (across frames at one position) attention (`"alternating"`, as Latte and Open-Sora do).

The forward is split so that samplers can cache block outputs (BWCache):
`embed(x, t) -> (h0, c)`, `run_blocks(h0, c) -> (h_N, all block outputs (N, B, L, D))`,
`head(h, c) -> velocity`, and `block_input_modulation(h0, c)` (block 0's AdaLN-modulated input, the
signal TeaCache-style indicators read); `blockwise(net)` hands these to `core.block_cache`'s samplers.

Precision (`dtype`, `param_dtype`; float32 by default): with `dtype = bfloat16` every dense layer
and both attention products run in bfloat16 on bfloat16 activations; parameters stay `param_dtype`.
Float32 whatever `dtype`, as under torch autocast: the residual stream (the tokens `embed` returns,
each block's gated residual sum, hence the block outputs a cache stores: they accumulate 2N updates),
the sinusoidal time and position tables, the LayerNorm statistics (flax reduces in float32), the
attention softmax (`softmax_in_float32`), the head's output (the sampler's state) and block 0's
modulated input (TeaCache sums its relative change).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.block_cache import BlockwiseModel


def timestep_embedding(
  t: jax.Array, dim: int, max_period: float = 10_000.0, scale: float = 1000.0
) -> jax.Array:
  """Sinusoidal features `[cos, sin]` of `scale * t` (B,) as in DiT; returns (B, dim).

  `scale = 1000` maps `t` in [0, 1] to DiT's range; `scale = 1` for integer DDPM steps `t in [0, 1000)`.
  """
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half) / half)
  angles = scale * t[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def _sincos_1d(positions: jax.Array, dim: int) -> jax.Array:
  omega = 1.0 / 10_000 ** (jnp.arange(dim // 2) / (dim // 2))
  angles = positions[:, None] * omega[None]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def sincos_3d(frames: int, height: int, width: int, dim: int) -> jax.Array:
  """Fixed 3D sin-cos positions (frames*height*width, dim), frame-major; per-axis widths are even."""
  spatial = 2 * (dim // 6)
  temporal = dim - 2 * spatial
  if temporal % 2 or temporal <= 0:
    raise ValueError(f"hidden size {dim} cannot be split into even (t, y, x) position widths")
  f, y, x = jnp.meshgrid(jnp.arange(frames), jnp.arange(height), jnp.arange(width), indexing="ij")
  return jnp.concatenate(
    [
      _sincos_1d(f.reshape(-1).astype(jnp.float32), temporal),
      _sincos_1d(y.reshape(-1).astype(jnp.float32), spatial),
      _sincos_1d(x.reshape(-1).astype(jnp.float32), spatial),
    ],
    axis=-1,
  )


def latte_spatial_positions(height: int, width: int, dim: int) -> jax.Array:
  """Latte's per-frame table (height*width, dim), row-major tokens: `[sincos(col), sincos(row)]`,
  each `dim / 2` wide (MAE's 2D sin-cos, which Latte stores as `pos_embed`)."""
  row, col = jnp.meshgrid(jnp.arange(height), jnp.arange(width), indexing="ij")
  return jnp.concatenate(
    [
      _sincos_1d(col.reshape(-1).astype(jnp.float32), dim // 2),
      _sincos_1d(row.reshape(-1).astype(jnp.float32), dim // 2),
    ],
    axis=-1,
  )


def latte_temporal_positions(frames: int, dim: int) -> jax.Array:
  """Latte's frame table (frames, dim), stored as `temp_embed`: 1D sin-cos of the frame index."""
  return _sincos_1d(jnp.arange(frames, dtype=jnp.float32), dim)


def softmax_in_float32(query: jax.Array, key: jax.Array, value: jax.Array, dtype=None) -> jax.Array:
  """Scaled dot-product attention (no mask, no dropout) with the softmax in float32 and its weights
  cast back to the values' dtype for the second product; an `attention_fn` of flax's attention."""
  weights = nn.dot_product_attention_weights(query, key, dtype=dtype, force_fp32_for_softmax=True)
  return jnp.einsum("...hqk,...khd->...qhd", weights.astype(value.dtype), value)


def modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
  return x * (1.0 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
  """`h' = h + g1 Attn(AdaLN(h))`, `h'' = h' + g2 MLP(AdaLN(h'))`, modulation from `c`, zero-initialised."""

  hidden: int
  heads: int
  mlp_ratio: int
  tokens_per_frame: int
  attention: str  # "full" | "spatial" | "temporal"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    precision = {"dtype": self.dtype, "param_dtype": self.param_dtype}
    dense = functools.partial(nn.Dense, **precision)
    self.modulation = dense(6 * self.hidden, kernel_init=nn.initializers.zeros)
    self.norm1 = nn.LayerNorm(use_bias=False, use_scale=False, **precision)
    self.norm2 = nn.LayerNorm(use_bias=False, use_scale=False, **precision)
    self.attn = nn.MultiHeadDotProductAttention(
      num_heads=self.heads,
      qkv_features=self.hidden,
      attention_fn=softmax_in_float32,
      **precision,
    )
    self.mlp_in = dense(self.mlp_ratio * self.hidden)
    self.mlp_out = dense(self.hidden)

  def modulated_input(self, h: jax.Array, c: jax.Array) -> jax.Array:
    shift, scale = jnp.split(self.modulation(nn.silu(c)), 6, axis=-1)[:2]
    return modulate(self.norm1(h), shift, scale)

  def _attend(self, x: jax.Array) -> jax.Array:
    b, length, d = x.shape
    s = self.tokens_per_frame
    if self.attention == "full":
      return self.attn(x)
    frames = x.reshape(b, length // s, s, d)
    if self.attention == "spatial":
      return self.attn(frames.reshape(b * (length // s), s, d)).reshape(b, length, d)
    across = frames.transpose(0, 2, 1, 3).reshape(b * s, length // s, d)
    return (
      self.attn(across).reshape(b, s, length // s, d).transpose(0, 2, 1, 3).reshape(b, length, d)
    )

  def __call__(self, h: jax.Array, c: jax.Array) -> jax.Array:
    """`h` is the float32 residual stream; the sublayers' outputs join it in float32."""
    shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(
      self.modulation(nn.silu(c)), 6, axis=-1
    )
    h = h + gate1[:, None] * self._attend(modulate(self.norm1(h), shift1, scale1))
    hidden = nn.gelu(self.mlp_in(modulate(self.norm2(h), shift2, scale2)), approximate=True)
    mlp = self.mlp_out(hidden)
    return h + gate2[:, None] * mlp


class VideoDiT(nn.Module):
  """Velocity (or noise) prediction for videos `(B, F, H, W, C)` at times `t` (B,).

  `t` is in [0, 1] with the default `time_scale = 1000`; DDPM models take the integer step with
  `time_scale = 1`. With `num_classes > 0`, labels (B,) in `[0, num_classes]` are embedded and added to
  the timestep condition; label `num_classes` (the default) is the unconditional (classifier-free) one.
  """

  video_shape: tuple[int, int, int, int]  # (F, H, W, C)
  patch: tuple[int, int, int] = (1, 4, 4)
  hidden: int = 64
  depth: int = 6
  heads: int = 4
  mlp_ratio: int = 4
  attention: str = "full"  # "full" | "alternating"
  positions: str = "sincos3d"  # "sincos3d" | "latte"
  learn_sigma: bool = False  # the final linear also predicts a variance half, which is dropped
  num_classes: int = 0  # > 0: class-conditional, table of num_classes + 1 rows (the last: no label)
  time_frequencies: int = 0  # sinusoid width of the timestep embedding; 0 = hidden (Latte: 256)
  time_scale: float = 1000.0  # the sinusoid sees time_scale * t
  dtype: Any = jnp.float32  # compute dtype (module docstring: what stays float32)
  param_dtype: Any = jnp.float32

  def setup(self):
    f, h, w, _ = self.video_shape
    pt, ph, pw = self.patch
    if f % pt or h % ph or w % pw:
      raise ValueError(f"video_shape {self.video_shape} is not divisible by patch {self.patch}")
    if self.attention not in ("full", "alternating"):
      raise ValueError(f"attention must be 'full' or 'alternating', got {self.attention!r}")
    if self.positions not in ("sincos3d", "latte"):
      raise ValueError(f"positions must be 'sincos3d' or 'latte', got {self.positions!r}")
    if self.positions == "latte" and (self.attention != "alternating" or self.hidden % 4):
      raise ValueError("positions='latte' needs attention='alternating' and hidden divisible by 4")
    self.grid = (f // pt, h // ph, w // pw)
    precision = {"dtype": self.dtype, "param_dtype": self.param_dtype}
    dense = functools.partial(nn.Dense, **precision)
    self.patch_embed = dense(self.hidden)
    self.time_in = dense(self.hidden)
    self.time_out = dense(self.hidden)
    kinds = (
      ["full"] * self.depth if self.attention == "full" else ["spatial", "temporal"] * self.depth
    )
    self.blocks = [
      DiTBlock(
        self.hidden,
        self.heads,
        self.mlp_ratio,
        self.grid[1] * self.grid[2],
        kinds[i],
        **precision,
      )
      for i in range(self.depth)
    ]
    self.final_modulation = dense(2 * self.hidden, kernel_init=nn.initializers.zeros)
    self.final_norm = nn.LayerNorm(use_bias=False, use_scale=False, **precision)
    self.final_linear = dense(
      pt * ph * pw * self.video_shape[3] * (2 if self.learn_sigma else 1),
      kernel_init=nn.initializers.zeros,
    )
    if self.num_classes:
      self.class_embed = nn.Embed(self.num_classes + 1, self.hidden, **precision)

  def patchify(self, x: jax.Array) -> jax.Array:
    b, (gf, gh, gw), (pt, ph, pw) = x.shape[0], self.grid, self.patch
    x = x.reshape(b, gf, pt, gh, ph, gw, pw, -1).transpose(0, 1, 3, 5, 2, 4, 6, 7)
    return x.reshape(b, gf * gh * gw, -1)

  def unpatchify(self, tokens: jax.Array) -> jax.Array:
    b, (gf, gh, gw), (pt, ph, pw) = tokens.shape[0], self.grid, self.patch
    x = tokens.reshape(b, gf, gh, gw, pt, ph, pw, -1).transpose(0, 1, 4, 2, 5, 3, 6, 7)
    return x.reshape(b, gf * pt, gh * ph, gw * pw, -1)

  def token_positions(self) -> jax.Array:
    """The table added to the patch embeddings, `(L, D)`."""
    if self.positions == "sincos3d":
      return sincos_3d(*self.grid, self.hidden)
    gf, gh, gw = self.grid
    return jnp.tile(latte_spatial_positions(gh, gw, self.hidden), (gf, 1))

  def frame_positions(self) -> jax.Array:
    """Latte's frame table repeated over each frame's tokens, `(L, D)`; added before block 1."""
    gf, gh, gw = self.grid
    return jnp.repeat(latte_temporal_positions(gf, self.hidden), gh * gw, axis=0)

  def embed(
    self, x: jax.Array, t: jax.Array, labels: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """Tokens with positions `(B, L, D)` and the condition `(B, D)` (timestep, plus class if any)."""
    if x.shape[1:] != tuple(self.video_shape) or t.shape != x.shape[:1]:
      raise ValueError(
        f"expected x (B, *{tuple(self.video_shape)}) and t (B,), got {x.shape} and {t.shape}"
      )
    tokens = self.patch_embed(self.patchify(x)).astype(jnp.float32)  # the residual stream
    h = tokens + self.token_positions()[None]
    frequencies = timestep_embedding(t, self.time_frequencies or self.hidden, scale=self.time_scale)
    c = self.time_out(nn.silu(self.time_in(frequencies)))
    if self.num_classes:
      labels = jnp.full(t.shape, self.num_classes) if labels is None else labels
      c = c + self.class_embed(labels)
    return h, c.astype(jnp.float32)

  def run_blocks(self, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The last block's output and every block's output stacked `(N, B, L, D)`."""
    outputs = []
    for i, block in enumerate(self.blocks):
      if i == 1 and self.positions == "latte":
        h = h + self.frame_positions()[None]
      h = block(h, c)
      outputs.append(h)
    return h, jnp.stack(outputs)

  def block_input_modulation(self, h: jax.Array, c: jax.Array) -> jax.Array:
    return self.blocks[0].modulated_input(h, c).astype(jnp.float32)

  def head(self, h: jax.Array, c: jax.Array) -> jax.Array:
    """The final AdaLN + linear, unpatchified to `(B, F, H, W, C)` (the eps half with `learn_sigma`)."""
    shift, scale = jnp.split(self.final_modulation(nn.silu(c)), 2, axis=-1)
    out = self.unpatchify(self.final_linear(modulate(self.final_norm(h), shift, scale)))
    return out[..., : self.video_shape[3]].astype(jnp.float32)

  def __call__(self, x: jax.Array, t: jax.Array, labels: jax.Array | None = None) -> jax.Array:
    h, c = self.embed(x, t, labels)
    h, _ = self.run_blocks(h, c)
    return self.head(h, c)


def blockwise(net: VideoDiT, label: int | None = None) -> BlockwiseModel:
  """`net`'s forward split for the caching samplers of `core.block_cache`; every function takes the
  parameters first. `label` (a class in `[0, num_classes]`, `num_classes` = unconditional) conditions
  every sample of a class-conditional DiT; None for an unconditional one."""

  def labels(x):
    return None if label is None else jnp.full((x.shape[0],), label)

  return BlockwiseModel(
    embed=lambda p, x, t: net.apply(p, x, t, labels(x), method=VideoDiT.embed),
    run_blocks=lambda p, h, c: net.apply(p, h, c, method=VideoDiT.run_blocks),
    head=lambda p, h, c: net.apply(p, h, c, method=VideoDiT.head),
    modulation=lambda p, h, c: net.apply(p, h, c, method=VideoDiT.block_input_modulation),
    depth=net.depth,
  )
