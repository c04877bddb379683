"""A video diffusion transformer (Latte / Open-Sora-style DiT) whose blocks can be run one at a time.

`x (B, F, H, W, C)` -> patchify `(pt, ph, pw)` -> tokens `(B, L, D)`, `L = F' * S` ordered frame-major
(`S` tokens per frame) + fixed 3D sin-cos positions -> N AdaLN-Zero blocks conditioned on the timestep
-> final AdaLN + linear -> unpatchify to the input's shape.

Blocks attend over all `L` tokens (`attention="full"`) or alternate spatial (within a frame) and
temporal (across frames at one position) attention (`"alternating"`, as Latte and Open-Sora do).

The forward is split so that samplers can cache block outputs (BWCache):
`embed(x, t) -> (h0, c)`, `run_blocks(h0, c) -> (h_N, all block outputs (N, B, L, D))`,
`head(h, c) -> velocity`, and `block_input_modulation(h0, c)` (block 0's AdaLN-modulated input, the
signal TeaCache-style indicators read).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


def timestep_embedding(t: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
  """Sinusoidal features of `t` (B,) scaled to [0, 1000] as in DiT; returns (B, dim)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half) / half)
  angles = 1000.0 * t[:, None] * freqs[None]
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


def modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
  return x * (1.0 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
  """`h' = h + g1 Attn(AdaLN(h))`, `h'' = h' + g2 MLP(AdaLN(h'))`, modulation from `c`, zero-initialised."""

  hidden: int
  heads: int
  mlp_ratio: int
  tokens_per_frame: int
  attention: str  # "full" | "spatial" | "temporal"

  def setup(self):
    self.modulation = nn.Dense(6 * self.hidden, kernel_init=nn.initializers.zeros)
    self.norm1 = nn.LayerNorm(use_bias=False, use_scale=False)
    self.norm2 = nn.LayerNorm(use_bias=False, use_scale=False)
    self.attn = nn.MultiHeadDotProductAttention(num_heads=self.heads, qkv_features=self.hidden)
    self.mlp_in = nn.Dense(self.mlp_ratio * self.hidden)
    self.mlp_out = nn.Dense(self.hidden)

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
    shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(
      self.modulation(nn.silu(c)), 6, axis=-1
    )
    h = h + gate1[:, None] * self._attend(modulate(self.norm1(h), shift1, scale1))
    mlp = self.mlp_out(nn.gelu(self.mlp_in(modulate(self.norm2(h), shift2, scale2))))
    return h + gate2[:, None] * mlp


class VideoDiT(nn.Module):
  """Velocity (or noise) prediction for videos `(B, F, H, W, C)` at times `t` (B,) in [0, 1]."""

  video_shape: tuple[int, int, int, int]  # (F, H, W, C)
  patch: tuple[int, int, int] = (1, 4, 4)
  hidden: int = 64
  depth: int = 6
  heads: int = 4
  mlp_ratio: int = 4
  attention: str = "full"  # "full" | "alternating"

  def setup(self):
    f, h, w, _ = self.video_shape
    pt, ph, pw = self.patch
    if f % pt or h % ph or w % pw:
      raise ValueError(f"video_shape {self.video_shape} is not divisible by patch {self.patch}")
    if self.attention not in ("full", "alternating"):
      raise ValueError(f"attention must be 'full' or 'alternating', got {self.attention!r}")
    self.grid = (f // pt, h // ph, w // pw)
    self.patch_embed = nn.Dense(self.hidden)
    self.time_in = nn.Dense(self.hidden)
    self.time_out = nn.Dense(self.hidden)
    kinds = (
      ["full"] * self.depth if self.attention == "full" else ["spatial", "temporal"] * self.depth
    )
    self.blocks = [
      DiTBlock(self.hidden, self.heads, self.mlp_ratio, self.grid[1] * self.grid[2], kinds[i])
      for i in range(self.depth)
    ]
    self.final_modulation = nn.Dense(2 * self.hidden, kernel_init=nn.initializers.zeros)
    self.final_norm = nn.LayerNorm(use_bias=False, use_scale=False)
    self.final_linear = nn.Dense(
      pt * ph * pw * self.video_shape[3], kernel_init=nn.initializers.zeros
    )

  def patchify(self, x: jax.Array) -> jax.Array:
    b, (gf, gh, gw), (pt, ph, pw) = x.shape[0], self.grid, self.patch
    x = x.reshape(b, gf, pt, gh, ph, gw, pw, -1).transpose(0, 1, 3, 5, 2, 4, 6, 7)
    return x.reshape(b, gf * gh * gw, -1)

  def unpatchify(self, tokens: jax.Array) -> jax.Array:
    b, (gf, gh, gw), (pt, ph, pw) = tokens.shape[0], self.grid, self.patch
    x = tokens.reshape(b, gf, gh, gw, pt, ph, pw, -1).transpose(0, 1, 4, 2, 5, 3, 6, 7)
    return x.reshape(b, gf * pt, gh * ph, gw * pw, -1)

  def embed(self, x: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Tokens with positions `(B, L, D)` and the timestep condition `(B, D)`."""
    if x.shape[1:] != tuple(self.video_shape) or t.shape != x.shape[:1]:
      raise ValueError(
        f"expected x (B, *{tuple(self.video_shape)}) and t (B,), got {x.shape} and {t.shape}"
      )
    h = self.patch_embed(self.patchify(x)) + sincos_3d(*self.grid, self.hidden)[None]
    c = self.time_out(nn.silu(self.time_in(timestep_embedding(t, self.hidden))))
    return h, c

  def run_blocks(self, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The last block's output and every block's output stacked `(N, B, L, D)`."""
    outputs = []
    for block in self.blocks:
      h = block(h, c)
      outputs.append(h)
    return h, jnp.stack(outputs)

  def block_input_modulation(self, h: jax.Array, c: jax.Array) -> jax.Array:
    return self.blocks[0].modulated_input(h, c)

  def head(self, h: jax.Array, c: jax.Array) -> jax.Array:
    shift, scale = jnp.split(self.final_modulation(nn.silu(c)), 2, axis=-1)
    return self.unpatchify(self.final_linear(modulate(self.final_norm(h), shift, scale)))

  def __call__(self, x: jax.Array, t: jax.Array) -> jax.Array:
    h, c = self.embed(x, t)
    h, _ = self.run_blocks(h, c)
    return self.head(h, c)
