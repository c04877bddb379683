r"""Stable Diffusion 1.5's UNet in Flax, with AnimateDiff's motion modules: the networks of LightCtrl
("LightCtrl: Training-free Controllable Video Relighting", ICLR 2026; official code GVCLab/LightCtrl,
`relight.py`: Realistic Vision 5.1 + IC-Light fc as the relighter, the same UNet + AnimateDiff's motion
adapter v1-5-3 as the video prior).

A port of diffusers' `UNet2DConditionModel` (`models/unets/unet_2d_condition.py`) as SD-1.5 configures
it, and of `UNetMotionModel` / `MotionAdapter` (`models/unets/unet_motion_model.py`; AnimateDiff,
Guo et al., ICLR 2024, guoyww/AnimateDiff `animatediff/models/motion_module.py`):

  conv_in 3x3 -> down blocks: (ResnetBlock2D -> Transformer2DModel [-> motion module]) x layers_per_block,
  Downsample2D (3x3 stride 2, padding 1) on all but the last; the last down block has no attention
  (CrossAttnDownBlock2D x (n-1) + DownBlock2D) -> mid: resnet, transformer [, motion module], resnet
  -> up blocks (UpBlock2D + CrossAttnUpBlock2D x (n-1)), layers_per_block + 1 resnets each on the
  skip-concatenated features, nearest 2x Upsample2D + 3x3 conv on all but the last -> GroupNorm, SiLU,
  conv_out 3x3.
  ResnetBlock2D: GN, SiLU, conv, + Dense(SiLU(temb)), GN, SiLU, conv, 1x1 shortcut when widths differ.
  Transformer2DModel (use_linear_projection False): GN (eps 1e-6), 1x1 conv in, BasicTransformerBlock
  (LN, self-attention; LN, cross-attention on the text states; LN, GEGLU feed-forward x4), 1x1 conv
  out, residual. SD-1.5's `attention_head_dim = 8` is diffusers' historical name for the number of
  heads (head width = channels / 8); `UNetConfig.heads` says so.
  Time: sinusoidal features of width block_out_channels[0] (flip_sin_to_cos True: [cos, sin],
  freq_shift 0), Dense -> SiLU -> Dense to 4x that width.
  Motion module (AnimateDiffTransformer3D): GroupNorm over (channels/G, frames, h, w) of each video
  (eps 1e-6), Dense in, a block of two temporal self-attentions (sinusoidal frame positions added to
  the normed input of each, max 32 frames) and GEGLU, Dense out, residual. Attention runs over the
  frames at each pixel. v1-5-3 has no motion module in the mid block (`use_motion_mid_block` False in
  its diffusers config, AnimateDiff v3's `motion_module_mid_block: false`); `motion_mid_block` says.

Inputs are NHWC: `x (B*F, h, w, C_in)` with `num_frames = F` (frames of a video are consecutive rows,
as in `UNetMotionModel` after its reshape), `t` scalar, `(B,)` or `(B*F,)`, text states `(B, L, D)` or
`(B*F, L, D)`; returns eps `(B*F, h, w, C_out)`. Without motion modules `num_frames` only repeats `t`
and the text states. Parameters are float32; `dtype` is the compute dtype of convolutions and Dense
layers, and attention logits and softmax are always float32 (diffusers' `upcast_softmax`), so a
bfloat16 run on an accelerator does not overflow in the attention.

`UNetConfig.sd15()` is SD-1.5 / Realistic Vision 5.1 (in_channels 8 for IC-Light fc), `tiny()` the same
layout at toy widths for tests; `from_diffusers(config.json dict)` reads diffusers' `unet/config.json`
and `with_motion(adapter config.json dict)` adds a `MotionAdapter`'s. Weights: `core/nn/sd_unet_convert.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

SD15_DOWN = ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D")
SD15_UP = ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")


@dataclasses.dataclass(frozen=True)
class UNetConfig:
  """SD-1.5's UNet layout; every down block but the last has cross-attention (and the mirrored up
  blocks). `heads` is per block (diffusers' `attention_head_dim`). Motion fields are AnimateDiff's
  `MotionAdapter` config; `motion = False` builds the plain 2D UNet."""

  in_channels: int = 4
  out_channels: int = 4
  block_out_channels: tuple[int, ...] = (320, 640, 1280, 1280)
  layers_per_block: int = 2
  heads: tuple[int, ...] = (8, 8, 8, 8)
  cross_attention_dim: int = 768
  norm_num_groups: int = 32
  norm_eps: float = 1e-5
  motion: bool = False
  motion_heads: tuple[int, ...] = (8, 8, 8, 8)
  motion_norm_num_groups: int = 32
  motion_max_seq_length: int = 32
  motion_mid_block: bool = False

  @classmethod
  def sd15(cls, in_channels: int = 4, motion: bool = False) -> UNetConfig:
    """SD-1.5 (Realistic Vision 5.1); `in_channels = 8` for IC-Light fc, `motion` for AnimateDiff
    v1-5-3 (no mid-block motion module)."""
    return cls(in_channels=in_channels, motion=motion)

  @classmethod
  def tiny(cls, in_channels: int = 4, motion: bool = False, motion_mid_block: bool = False):
    """The same layout at toy widths: 2 levels (CrossAttnDown + Down), groups of 8, 2 heads."""
    return cls(
      in_channels=in_channels,
      block_out_channels=(32, 64),
      layers_per_block=1,
      heads=(2, 2),
      cross_attention_dim=16,
      norm_num_groups=8,
      motion=motion,
      motion_heads=(2, 2),
      motion_norm_num_groups=8,
      motion_max_seq_length=8,
      motion_mid_block=motion_mid_block,
    )

  @classmethod
  def from_diffusers(cls, cfg: Mapping[str, Any]) -> UNetConfig:
    """From diffusers' `UNet2DConditionModel` config.json; layouts other than SD-1.5's raise."""
    n = len(cfg["block_out_channels"])
    down = tuple(cfg.get("down_block_types", SD15_DOWN))
    up = tuple(cfg.get("up_block_types", SD15_UP))
    want_down = ("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",)
    want_up = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1)
    for name, got, want in (("down_block_types", down, want_down), ("up_block_types", up, want_up)):
      if got != want:
        raise ValueError(f"unet config {name}: {got} is not SD-1.5's layout {want}")
    for name, want in (
      ("use_linear_projection", False),
      ("upcast_attention", False),
      ("class_embed_type", None),
      ("addition_embed_type", None),
      ("time_embedding_type", "positional"),
      ("mid_block_type", "UNetMidBlock2DCrossAttn"),
    ):
      if cfg.get(name, want) != want:
        raise ValueError(
          f"unet config {name}: {cfg[name]!r} is not supported (SD-1.5 has {want!r})"
        )
    if not cfg.get("flip_sin_to_cos", True) or cfg.get("freq_shift", 0) != 0:
      raise ValueError(
        "unet config flip_sin_to_cos / freq_shift: only SD-1.5's (True, 0) is ported"
      )
    heads = cfg.get("num_attention_heads") or cfg.get("attention_head_dim", 8)
    heads = tuple(heads) if isinstance(heads, Sequence) else (int(heads),) * n
    layers = cfg.get("layers_per_block", 2)
    if not isinstance(layers, int):
      raise ValueError(f"unet config layers_per_block: {layers!r} must be one int")
    return cls(
      in_channels=int(cfg.get("in_channels", 4)),
      out_channels=int(cfg.get("out_channels", 4)),
      block_out_channels=tuple(int(c) for c in cfg["block_out_channels"]),
      layers_per_block=layers,
      heads=heads,
      cross_attention_dim=int(cfg.get("cross_attention_dim", 768)),
      norm_num_groups=int(cfg.get("norm_num_groups", 32)),
      norm_eps=float(cfg.get("norm_eps", 1e-5)),
    )

  def with_motion(self, adapter: Mapping[str, Any]) -> UNetConfig:
    """This UNet with a diffusers `MotionAdapter` config.json's motion modules (one transformer
    layer each, `motion_layers_per_block == layers_per_block`, no conv_in, as v1-5-3)."""
    n = len(self.block_out_channels)
    if tuple(adapter.get("block_out_channels", self.block_out_channels)) != self.block_out_channels:
      raise ValueError(
        f"motion adapter block_out_channels {adapter['block_out_channels']} != the UNet's "
        f"{self.block_out_channels}"
      )
    for name, want in (
      ("motion_layers_per_block", self.layers_per_block),
      ("motion_transformer_layers_per_block", 1),
      ("motion_mid_block_layers_per_block", 1),
      ("motion_transformer_layers_per_mid_block", 1),
      ("conv_in_channels", None),
    ):
      if adapter.get(name, want) != want:
        raise ValueError(f"motion adapter {name}: {adapter[name]!r} is not supported ({want!r})")
    heads = adapter.get("motion_num_attention_heads", 8)
    heads = tuple(heads) if isinstance(heads, Sequence) else (int(heads),) * n
    return dataclasses.replace(
      self,
      motion=True,
      motion_heads=heads,
      motion_norm_num_groups=int(adapter.get("motion_norm_num_groups", 32)),
      motion_max_seq_length=int(adapter.get("motion_max_seq_length", 32)),
      motion_mid_block=bool(adapter.get("use_motion_mid_block", True)),
    )


# ---------------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------------


def timestep_features(t: jax.Array, dim: int) -> jax.Array:
  """diffusers' `get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0)`:
  `[cos(t w), sin(t w)]`, `w_i = 10000^(-i / (dim/2))`."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
  args = t.astype(jnp.float32)[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def frame_positions(length: int, dim: int) -> np.ndarray:
  """AnimateDiff's (diffusers' `SinusoidalPositionalEmbedding`) table `(1, length, dim)`: sin on even,
  cos on odd channels of `p * 10000^(-2i/dim)`."""
  position = np.arange(length, dtype=np.float64)[:, None]
  div = np.exp(np.arange(0, dim, 2, dtype=np.float64) * (-math.log(10000.0) / dim))
  table = np.zeros((1, length, dim), np.float64)
  table[0, :, 0::2] = np.sin(position * div)
  table[0, :, 1::2] = np.cos(position * div)
  return table.astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------------


def _conv(features: int, name: str, dtype, size: int = 3, stride: int = 1) -> nn.Conv:
  pad = size // 2  # PyTorch's symmetric padding (Flax "SAME" pads stride-2 convs asymmetrically)
  return nn.Conv(
    features,
    (size, size),
    (stride, stride),
    padding=((pad, pad), (pad, pad)),
    dtype=dtype,
    name=name,
  )


class Attention(nn.Module):
  """diffusers' `Attention`: bias-free q/k/v, `to_out.0` with bias, softmax(q k^T / sqrt(d)) in
  float32."""

  heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, context: jax.Array | None = None) -> jax.Array:
    dim = x.shape[-1]
    context = x if context is None else context
    dense = lambda name, bias=False: nn.Dense(dim, use_bias=bias, dtype=self.dtype, name=name)
    split = lambda y: y.reshape(*y.shape[:-1], self.heads, dim // self.heads)
    q, k, v = split(dense("to_q")(x)), split(dense("to_k")(context)), split(dense("to_v")(context))
    logits = jnp.einsum("...qhd,...khd->...hqk", q.astype(jnp.float32), k.astype(jnp.float32))
    weights = jax.nn.softmax(logits / math.sqrt(dim // self.heads), axis=-1)
    out = jnp.einsum("...hqk,...khd->...qhd", weights, v.astype(jnp.float32))
    return dense("to_out_0", bias=True)(out.reshape(*x.shape[:-1], dim).astype(x.dtype))


class TransformerBlock(nn.Module):
  """`BasicTransformerBlock`: self-attention, cross-attention (or a second self-attention with
  `positions`, AnimateDiff's double self-attention), GEGLU; pre-LayerNorm (eps 1e-5) residuals.
  `positions (1, L, D)` are added to each normed input of the attentions (AnimateDiff)."""

  heads: int
  positions: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, context=None, positions=None):
    ln = lambda name: nn.LayerNorm(epsilon=1e-5, dtype=jnp.float32, name=name)
    pos = (lambda h: h + positions) if self.positions else (lambda h: h)
    x = x + Attention(self.heads, self.dtype, name="attn1")(pos(ln("norm1")(x)))
    x = x + Attention(self.heads, self.dtype, name="attn2")(pos(ln("norm2")(x)), context)
    return x + FeedForward(self.dtype, name="ff")(ln("norm3")(x))


class FeedForward(nn.Module):
  """diffusers' `FeedForward(activation_fn="geglu")`: `net.0.proj` to 2 x 4 dim (value | gate),
  value * GELU(gate) (exact GELU), `net.2` back to dim."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dim = x.shape[-1]
    hidden, gate = jnp.split(_GEGLUProj(dim, self.dtype, name="net_0")(x), 2, axis=-1)
    return nn.Dense(dim, dtype=self.dtype, name="net_2")(hidden * nn.gelu(gate, approximate=False))


class _GEGLUProj(nn.Module):
  """`net.0` of the GEGLU feed-forward: its `proj` Dense to 2 x 4 dim (value | gate)."""

  dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    return nn.Dense(8 * self.dim, dtype=self.dtype, name="proj")(x)


class Transformer2D(nn.Module):
  """`Transformer2DModel` with `use_linear_projection = False`: GN, 1x1 conv, one block, 1x1 conv."""

  heads: int
  groups: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, context):
    n, h, w, c = x.shape
    y = nn.GroupNorm(self.groups, epsilon=1e-6, dtype=jnp.float32, name="norm")(x)
    y = _conv(c, "proj_in", self.dtype, size=1)(y).reshape(n, h * w, c)
    y = TransformerBlock(self.heads, dtype=self.dtype, name="transformer_blocks_0")(y, context)
    return x + _conv(c, "proj_out", self.dtype, size=1)(y.reshape(n, h, w, c))


class MotionModule(nn.Module):
  """AnimateDiff's temporal transformer (`AnimateDiffTransformer3D`) on `(B*F, h, w, C)`: attention
  over the F frames of each video at every pixel."""

  heads: int
  groups: int
  max_frames: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, num_frames: int):
    bf, h, w, c = x.shape
    if num_frames > self.max_frames:
      raise ValueError(
        f"{num_frames} frames exceed the motion module's {self.max_frames} positions"
      )
    video = x.reshape(bf // num_frames, num_frames, h, w, c)
    y = nn.GroupNorm(self.groups, epsilon=1e-6, dtype=jnp.float32, name="norm")(video)
    y = jnp.transpose(y, (0, 2, 3, 1, 4)).reshape(-1, num_frames, c)
    y = nn.Dense(c, dtype=self.dtype, name="proj_in")(y)
    positions = jnp.asarray(frame_positions(num_frames, c))
    y = TransformerBlock(self.heads, positions=True, dtype=self.dtype, name="transformer_blocks_0")(
      y, positions=positions
    )
    y = nn.Dense(c, dtype=self.dtype, name="proj_out")(y)
    y = jnp.transpose(y.reshape(bf // num_frames, h, w, num_frames, c), (0, 3, 1, 2, 4))
    return x + y.reshape(bf, h, w, c)


class ResnetBlock(nn.Module):
  """`ResnetBlock2D` (time_embedding_norm "default", output_scale_factor 1)."""

  features: int
  groups: int
  eps: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, temb):
    norm = lambda name: nn.GroupNorm(self.groups, epsilon=self.eps, dtype=jnp.float32, name=name)
    h = _conv(self.features, "conv1", self.dtype)(nn.silu(norm("norm1")(x)))
    time = nn.Dense(self.features, dtype=self.dtype, name="time_emb_proj")(nn.silu(temb))
    h = h + time[:, None, None]
    h = _conv(self.features, "conv2", self.dtype)(nn.silu(norm("norm2")(h)))
    if x.shape[-1] != self.features:
      x = _conv(self.features, "conv_shortcut", self.dtype, size=1)(x)
    return x + h


class _Sampler(nn.Module):
  """`Downsample2D` (3x3 stride 2, padding 1) or `Upsample2D` (nearest 2x, 3x3 conv), param `conv`."""

  up: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    if self.up:
      x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
      return _conv(x.shape[-1], "conv", self.dtype)(x)
    return _conv(x.shape[-1], "conv", self.dtype, stride=2)(x)


# ---------------------------------------------------------------------------------------------------
# The UNet
# ---------------------------------------------------------------------------------------------------


class UNet(nn.Module):
  """`UNet2DConditionModel` (SD-1.5 layout), optionally with AnimateDiff's motion modules
  (`UNetMotionModel`): `(x (B*F, h, w, C_in), t, text (B or B*F, L, D), num_frames) -> eps`."""

  config: UNetConfig
  dtype: Any = jnp.float32

  def _resnet(self, features, name):
    c = self.config
    return ResnetBlock(features, c.norm_num_groups, c.norm_eps, self.dtype, name=name)

  def _attention(self, block, heads, name):
    return Transformer2D(heads[block], self.config.norm_num_groups, self.dtype, name=name)

  def _motion(self, block, heads, name):
    c = self.config
    return MotionModule(
      heads[block], c.motion_norm_num_groups, c.motion_max_seq_length, self.dtype, name=name
    )

  @nn.compact
  def __call__(self, x, t, context, num_frames: int = 1):
    c = self.config
    n_blocks, channels = len(c.block_out_channels), c.block_out_channels
    if x.shape[-1] != c.in_channels:
      raise ValueError(f"input has {x.shape[-1]} channels, the UNet takes {c.in_channels}")
    if x.shape[0] % num_frames:
      raise ValueError(f"batch {x.shape[0]} is not a multiple of num_frames = {num_frames}")
    factor = 2 ** (n_blocks - 1)
    if x.shape[1] % factor or x.shape[2] % factor:
      raise ValueError(f"latent size {x.shape[1:3]} must be a multiple of {factor}")
    t = jnp.broadcast_to(jnp.asarray(t, jnp.float32).reshape(-1), (x.shape[0] // num_frames,))
    temb = timestep_features(t, channels[0])
    temb = nn.Dense(4 * channels[0], dtype=self.dtype, name="time_embedding_linear_1")(temb)
    temb = nn.Dense(4 * channels[0], dtype=self.dtype, name="time_embedding_linear_2")(
      nn.silu(temb)
    )
    temb = jnp.repeat(temb, num_frames, axis=0)
    if context.shape[0] != x.shape[0]:
      context = jnp.repeat(context, num_frames, axis=0)

    h = _conv(channels[0], "conv_in", self.dtype)(x.astype(self.dtype))
    skips = [h]
    for i in range(n_blocks):
      for j in range(c.layers_per_block):
        h = self._resnet(channels[i], f"down_blocks_{i}_resnets_{j}")(h, temb)
        if i < n_blocks - 1:
          h = self._attention(i, c.heads, f"down_blocks_{i}_attentions_{j}")(h, context)
        if c.motion:
          h = self._motion(i, c.motion_heads, f"down_blocks_{i}_motion_modules_{j}")(h, num_frames)
        skips.append(h)
      if i < n_blocks - 1:
        h = _Sampler(False, self.dtype, name=f"down_blocks_{i}_downsamplers_0")(h)
        skips.append(h)

    h = self._resnet(channels[-1], "mid_block_resnets_0")(h, temb)
    h = self._attention(n_blocks - 1, c.heads, "mid_block_attentions_0")(h, context)
    if c.motion and c.motion_mid_block:
      h = self._motion(n_blocks - 1, c.motion_heads, "mid_block_motion_modules_0")(h, num_frames)
    h = self._resnet(channels[-1], "mid_block_resnets_1")(h, temb)

    up_heads, up_motion_heads = c.heads[::-1], c.motion_heads[::-1]
    for i, features in enumerate(channels[::-1]):
      for j in range(c.layers_per_block + 1):
        h = jnp.concatenate([h, skips.pop()], axis=-1)
        h = self._resnet(features, f"up_blocks_{i}_resnets_{j}")(h, temb)
        if i > 0:
          h = self._attention(i, up_heads, f"up_blocks_{i}_attentions_{j}")(h, context)
        if c.motion:
          h = self._motion(i, up_motion_heads, f"up_blocks_{i}_motion_modules_{j}")(h, num_frames)
      if i < n_blocks - 1:
        h = _Sampler(True, self.dtype, name=f"up_blocks_{i}_upsamplers_0")(h)

    h = nn.GroupNorm(
      c.norm_num_groups, epsilon=c.norm_eps, dtype=jnp.float32, name="conv_norm_out"
    )(h)
    return _conv(c.out_channels, "conv_out", self.dtype)(nn.silu(h)).astype(jnp.float32)
