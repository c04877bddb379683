"""Stable Diffusion 1.5's KL autoencoder in Flax (NHWC), with a converter from diffusers' state dict.

The first stage of latent diffusion (Rombach et al. 2022, "High-Resolution Image Synthesis with
Latent Diffusion Models", CVPR 2022, Sec. 3.1 and App. G): an encoder maps an image x in [-1, 1] to
a diagonal Gaussian over latents with 2**(levels-1) times smaller sides and `latent_channels`
channels, a decoder maps latents back. Stable Diffusion 1.5 (and Realistic Vision 5.1, which
LightCtrl (ICLR 2026, github.com/GVCLab/LightCtrl) runs on) uses block_out_channels
(128, 256, 512, 512), 2 ResNet layers per block, 4 latent channels and scaling factor 0.18215.

The layout follows diffusers' `AutoencoderKL` (`diffusers/models/autoencoders/autoencoder_kl.py`,
`vae.py` `Encoder`/`Decoder`, `unet_2d_blocks.py` `DownEncoderBlock2D`/`UpDecoderBlock2D`/
`UNetMidBlock2D`, `resnet.py` `ResnetBlock2D`/`Downsample2D`/`Upsample2D`, `attention_processor.py`
`Attention`), module for module, so that every parameter path is the torch key with `.N` written
`_N` (`encoder/down_blocks_0/resnets_1/conv1/kernel` for `encoder.down_blocks.0.resnets.1.conv1.weight`):

  encoder   conv_in 3x3; per level: `layers_per_block` ResNet blocks, then (except at the last level)
            a stride-2 3x3 conv on the input zero-padded by one row/column at the bottom/right
            (diffusers' `Downsample2D` with padding 0); mid block (ResNet, attention, ResNet);
            GroupNorm, SiLU, conv_out 3x3 to 2 * latent_channels (mean || logvar).
  quant_conv / post_quant_conv   1x1 convs on the moments / on the latents.
  decoder   conv_in 3x3; mid block; per level (channels reversed): `layers_per_block + 1` ResNet
            blocks, then (except at the last level) 2x nearest upsampling and a 3x3 conv;
            GroupNorm, SiLU, conv_out 3x3 to 3 channels.
  ResNet    s(x) + conv2(SiLU(GN(conv1(SiLU(GN(x)))))), s a 1x1 `conv_shortcut` where channels change.
  attention one head over all H*W positions, width C, GroupNorm first, q/k/v/out Linears with bias,
            residual added (diffusers' deprecated VAE attention block, softmax in float32).

All GroupNorms have `norm_num_groups` groups and eps 1e-6. `encode` returns the Gaussian's mean and
log-variance (clipped to [-30, 20] as diffusers' `DiagonalGaussianDistribution` does); sampling
(`mean + exp(logvar / 2) * noise`) and the latent scaling (`(z - shift_factor) * scaling_factor` into
the diffusion model, `z / scaling_factor + shift_factor` before `decode`; SD-1.5 has no shift) are
the caller's, as in diffusers' pipelines.

Compute dtype: convolutions and Linears run in `dtype` (float32 by default); GroupNorm statistics and
the softmax run in float32. Parameters are float32.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core.nn import attention as attention_lib
from core.nn.convert import CheckpointError, Rule, apply_rules, linear, param_shapes

__all__ = ["AutoencoderKL", "CheckpointError", "VAEConfig", "convert_vae"]

NORM_EPS = 1e-6
LOGVAR_RANGE = (-30.0, 20.0)  # diffusers' DiagonalGaussianDistribution clamps logvar to it
DOWN_BLOCK = "DownEncoderBlock2D"
UP_BLOCK = "UpDecoderBlock2D"


@dataclasses.dataclass(frozen=True)
class VAEConfig:
  """The fields of diffusers' `AutoencoderKL` config that shape the network (defaults: SD-1.5)."""

  in_channels: int = 3
  out_channels: int = 3
  block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
  layers_per_block: int = 2
  latent_channels: int = 4
  norm_num_groups: int = 32
  scaling_factor: float = 0.18215
  shift_factor: float = 0.0  # diffusers' `shift_factor` (null for SD-1.5 -> 0.0)
  use_quant_conv: bool = True
  use_post_quant_conv: bool = True
  mid_block_add_attention: bool = True

  def __post_init__(self):
    channels = tuple(int(c) for c in self.block_out_channels)
    object.__setattr__(self, "block_out_channels", channels)
    if not channels:
      raise ValueError("VAEConfig.block_out_channels: needs at least one level, got ()")
    for name in ("in_channels", "out_channels", "layers_per_block", "latent_channels"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"VAEConfig.{name}: must be >= 1, got {getattr(self, name)}")
    groups = self.norm_num_groups
    if groups < 1 or any(c < 1 or c % groups for c in channels):
      raise ValueError(
        f"VAEConfig.block_out_channels: every entry must be a positive multiple of "
        f"norm_num_groups={groups}, got {channels}"
      )

  @property
  def downsampling(self) -> int:
    """How many times smaller the latent's sides are than the image's."""
    return 2 ** (len(self.block_out_channels) - 1)

  @classmethod
  def tiny(cls) -> VAEConfig:
    """A small network of the SD-1.5 layout (3 levels, 2 layers per block, 4 latent channels)."""
    return cls(block_out_channels=(8, 8, 16), norm_num_groups=4)

  @classmethod
  def from_diffusers(cls, config: Mapping[str, Any]) -> VAEConfig:
    """From the `config.json` of a diffusers `AutoencoderKL` (e.g. SD-1.5's `vae/config.json`);
    fields that do not change the network (sample_size, force_upcast) are ignored."""
    config = dict(config)
    for field in ("block_out_channels", "layers_per_block"):
      if field not in config:
        raise ValueError(f"vae config.json: has no {field!r}")
    levels = len(config["block_out_channels"])
    for field, kind in (("down_block_types", DOWN_BLOCK), ("up_block_types", UP_BLOCK)):
      types = list(config.get(field, [kind] * levels))
      if types != [kind] * levels:
        raise ValueError(f"vae config.json: {field} must be {levels} x {kind!r}, got {types}")
    act = config.get("act_fn", "silu")
    if act != "silu":
      raise ValueError(f"vae config.json: act_fn must be 'silu', got {act!r}")
    for field in ("latents_mean", "latents_std"):
      if config.get(field) is not None:
        raise ValueError(
          f"vae config.json: {field} must be null for this port, got {config[field]}"
        )
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in config.items() if k in fields and v is not None})


# ---------------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------------


def _conv(features: int, kernel: int, dtype, name: str, stride: int = 1, padding: Any = None):
  padding = ((kernel // 2,) * 2,) * 2 if padding is None else padding
  return nn.Conv(features, (kernel, kernel), (stride, stride), padding, dtype=dtype, name=name)


def _norm(config: VAEConfig, name: str) -> nn.Module:
  """torch's GroupNorm: statistics in float32 with the two-pass variance."""
  return nn.GroupNorm(
    config.norm_num_groups, epsilon=NORM_EPS, use_fast_variance=False, dtype=jnp.float32, name=name
  )


def _normed(norm: nn.Module, x: jax.Array) -> jax.Array:
  return norm(x.astype(jnp.float32)).astype(x.dtype)


class ResnetBlock(nn.Module):
  """diffusers' `ResnetBlock2D` without a time embedding (dropout 0, output scale 1)."""

  config: VAEConfig
  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    h = nn.silu(_normed(_norm(self.config, "norm1"), x))
    h = _conv(self.features, 3, self.dtype, "conv1")(h)
    h = nn.silu(_normed(_norm(self.config, "norm2"), h))
    h = _conv(self.features, 3, self.dtype, "conv2")(h)
    if x.shape[-1] != self.features:
      x = _conv(self.features, 1, self.dtype, "conv_shortcut")(x)
    return x + h


class Attention(nn.Module):
  """The VAE mid-block's single-head self-attention over all positions (residual included)."""

  config: VAEConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    n, h, w, c = x.shape
    tokens = _normed(_norm(self.config, "group_norm"), x).reshape(n, h * w, 1, c)
    q, k, v = (
      nn.Dense(c, dtype=self.dtype, name=name)(tokens) for name in ("to_q", "to_k", "to_v")
    )
    out = attention_lib.attention(q, k, v).reshape(n, h * w, c)
    return x + nn.Dense(c, dtype=self.dtype, name="to_out")(out).reshape(n, h, w, c)


class MidBlock(nn.Module):
  """diffusers' `UNetMidBlock2D` as the VAE builds it: ResNet, attention, ResNet."""

  config: VAEConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    x = ResnetBlock(self.config, c, self.dtype, name="resnets_0")(x)
    if self.config.mid_block_add_attention:
      x = Attention(self.config, self.dtype, name="attentions_0")(x)
    return ResnetBlock(self.config, c, self.dtype, name="resnets_1")(x)


class Downsample(nn.Module):
  """diffusers' `Downsample2D(padding=0)`: zero-pad bottom and right by one, 3x3 conv, stride 2."""

  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = jnp.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
    return _conv(self.features, 3, self.dtype, "conv", stride=2, padding="VALID")(x)


class Upsample(nn.Module):
  """diffusers' `Upsample2D`: nearest-neighbour 2x, then a 3x3 conv."""

  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    return _conv(self.features, 3, self.dtype, "conv")(x)


class DownEncoderBlock(nn.Module):
  config: VAEConfig
  features: int
  downsample: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    for j in range(self.config.layers_per_block):
      x = ResnetBlock(self.config, self.features, self.dtype, name=f"resnets_{j}")(x)
    if self.downsample:
      x = Downsample(self.features, self.dtype, name="downsamplers_0")(x)
    return x


class UpDecoderBlock(nn.Module):
  config: VAEConfig
  features: int
  upsample: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    for j in range(self.config.layers_per_block + 1):
      x = ResnetBlock(self.config, self.features, self.dtype, name=f"resnets_{j}")(x)
    if self.upsample:
      x = Upsample(self.features, self.dtype, name="upsamplers_0")(x)
    return x


class Encoder(nn.Module):
  config: VAEConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    config, channels = self.config, self.config.block_out_channels
    x = _conv(channels[0], 3, self.dtype, "conv_in")(x)
    for i, features in enumerate(channels):
      last = i == len(channels) - 1
      x = DownEncoderBlock(config, features, not last, self.dtype, name=f"down_blocks_{i}")(x)
    x = MidBlock(config, self.dtype, name="mid_block")(x)
    x = nn.silu(_normed(_norm(config, "conv_norm_out"), x))
    return _conv(2 * config.latent_channels, 3, self.dtype, "conv_out")(x)


class Decoder(nn.Module):
  config: VAEConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, z):
    config, channels = self.config, self.config.block_out_channels[::-1]
    x = _conv(channels[0], 3, self.dtype, "conv_in")(z)
    x = MidBlock(config, self.dtype, name="mid_block")(x)
    for i, features in enumerate(channels):
      last = i == len(channels) - 1
      x = UpDecoderBlock(config, features, not last, self.dtype, name=f"up_blocks_{i}")(x)
    x = nn.silu(_normed(_norm(config, "conv_norm_out"), x))
    return _conv(config.out_channels, 3, self.dtype, "conv_out")(x)


class AutoencoderKL(nn.Module):
  """`encode(x) -> (mean, logvar)`, `decode(z) -> image`; `__call__(x)` decodes the mean (it
  builds every parameter, so `init` with it gives the full tree)."""

  config: VAEConfig
  dtype: Any = jnp.float32

  def setup(self):
    config = self.config
    self.encoder = Encoder(config, self.dtype)
    self.decoder = Decoder(config, self.dtype)
    if config.use_quant_conv:
      self.quant_conv = _conv(2 * config.latent_channels, 1, self.dtype, None)
    if config.use_post_quant_conv:
      self.post_quant_conv = _conv(config.latent_channels, 1, self.dtype, None)

  def encode(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`x` `[N, H, W, in_channels]` in [-1, 1], H and W multiples of `config.downsampling` ->
    mean and logvar `[N, H/f, W/f, latent_channels]` (float32)."""
    config = self.config
    f = config.downsampling
    if x.ndim != 4 or x.shape[-1] != config.in_channels or x.shape[1] % f or x.shape[2] % f:
      raise ValueError(
        f"AutoencoderKL.encode: x must be [N, H, W, {config.in_channels}] with H and W multiples "
        f"of {f}, got shape {x.shape}"
      )
    moments = self.encoder(x.astype(self.dtype))
    if config.use_quant_conv:
      moments = self.quant_conv(moments)
    mean, logvar = jnp.split(moments.astype(jnp.float32), 2, axis=-1)
    return mean, jnp.clip(logvar, *LOGVAR_RANGE)

  def decode(self, z: jax.Array) -> jax.Array:
    """Unscaled latents `[N, h, w, latent_channels]` -> images `[N, h*f, w*f, out_channels]`
    (float32, about [-1, 1])."""
    if z.ndim != 4 or z.shape[-1] != self.config.latent_channels:
      raise ValueError(
        f"AutoencoderKL.decode: z must be [N, h, w, {self.config.latent_channels}], "
        f"got shape {z.shape}"
      )
    z = z.astype(self.dtype)
    if self.config.use_post_quant_conv:
      z = self.post_quant_conv(z)
    return self.decoder(z).astype(jnp.float32)

  def __call__(self, x: jax.Array) -> jax.Array:
    mean, _ = self.encode(x)
    return self.decode(mean)


# ---------------------------------------------------------------------------------------------------
# Converter
# ---------------------------------------------------------------------------------------------------

# diffusers renamed the VAE attention's Linears; checkpoints saved before then use the old names
OLD_ATTENTION_NAMES = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


def convert_vae(state_dict: Mapping[str, np.ndarray], config: VAEConfig) -> dict:
  """A diffusers `AutoencoderKL` state dict (torch names and layouts, numpy arrays) as
  `{"params": ...}` of `AutoencoderKL(config)` (float32). Conv weights `[out, in, kh, kw]` become
  kernels `[kh, kw, in, out]`, Linear weights `[out, in]` kernels `[in, out]`, GroupNorm `weight`
  `scale`. The attention Linears may be named `to_q/to_k/to_v/to_out.0` or (older checkpoints)
  `query/key/value/proj_attn`, not both. A missing, unexpected or misshapen key raises
  `CheckpointError` naming it."""
  expected = expected_shapes(config)
  old = any(".attentions.0.query." in key for key in state_dict)
  new = any(".attentions.0.to_q." in key for key in state_dict)
  if old and new:
    raise CheckpointError(
      "AutoencoderKL state dict mixes attention names `query/key/value/proj_attn` with "
      "`to_q/to_k/to_v/to_out.0`"
    )
  return apply_rules(state_dict, _rules(config, expected, old), expected, source="AutoencoderKL")


@functools.lru_cache(maxsize=8)
def expected_shapes(config: VAEConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """`{flax path: shape}` of `AutoencoderKL(config)`'s parameters (traced once per config)."""
  size = config.downsampling
  x = jax.ShapeDtypeStruct((1, size, size, config.in_channels), jnp.float32)
  return param_shapes(jax.eval_shape(AutoencoderKL(config).init, jax.random.key(0), x))


def conv(torch_prefix: str, path: tuple[str, ...], expected) -> dict[str, Rule]:
  """`torch.nn.Conv2d` (`weight [out, in, kh, kw]`, `bias`) as a `flax.linen.Conv` at `path`."""
  kh, kw, d_in, d_out = expected[path + ("kernel",)]
  return {
    f"{torch_prefix}.weight": (
      (d_out, d_in, kh, kw),
      lambda w: {path + ("kernel",): np.asarray(w).transpose(2, 3, 1, 0)},
    ),
    f"{torch_prefix}.bias": ((d_out,), lambda b: {path + ("bias",): b}),
  }


def group_norm(torch_prefix: str, path: tuple[str, ...], expected) -> dict[str, Rule]:
  """`torch.nn.GroupNorm` (`weight`, `bias`) as a `flax.linen.GroupNorm` (`scale`, `bias`)."""
  (d,) = expected[path + ("scale",)]
  return {
    f"{torch_prefix}.weight": ((d,), lambda w: {path + ("scale",): w}),
    f"{torch_prefix}.bias": ((d,), lambda b: {path + ("bias",): b}),
  }


def _resnet(prefix: str, path: tuple[str, ...], expected) -> dict[str, Rule]:
  rules = {}
  for name in ("norm1", "norm2"):
    rules |= group_norm(f"{prefix}.{name}", path + (name,), expected)
  for name in ("conv1", "conv2"):
    rules |= conv(f"{prefix}.{name}", path + (name,), expected)
  if path + ("conv_shortcut", "kernel") in expected:
    rules |= conv(f"{prefix}.conv_shortcut", path + ("conv_shortcut",), expected)
  return rules


def _mid_block(prefix: str, path: tuple[str, ...], config, expected, old) -> dict[str, Rule]:
  rules = _resnet(f"{prefix}.resnets.0", path + ("resnets_0",), expected)
  rules |= _resnet(f"{prefix}.resnets.1", path + ("resnets_1",), expected)
  if config.mid_block_add_attention:
    attn, attn_path = f"{prefix}.attentions.0", path + ("attentions_0",)
    rules |= group_norm(f"{attn}.group_norm", attn_path + ("group_norm",), expected)
    for name, flax_name in (
      ("to_q", "to_q"),
      ("to_k", "to_k"),
      ("to_v", "to_v"),
      ("to_out.0", "to_out"),
    ):
      torch_name = OLD_ATTENTION_NAMES[name] if old else name
      rules |= linear(f"{attn}.{torch_name}", attn_path + (flax_name,), expected)
  return rules


def _rules(config: VAEConfig, expected, old_attention: bool) -> dict[str, Rule]:
  levels = len(config.block_out_channels)
  rules = {}
  for part in ("encoder", "decoder"):
    rules |= conv(f"{part}.conv_in", (part, "conv_in"), expected)
    rules |= _mid_block(f"{part}.mid_block", (part, "mid_block"), config, expected, old_attention)
    rules |= group_norm(f"{part}.conv_norm_out", (part, "conv_norm_out"), expected)
    rules |= conv(f"{part}.conv_out", (part, "conv_out"), expected)
  for i in range(levels):
    down, down_path = f"encoder.down_blocks.{i}", ("encoder", f"down_blocks_{i}")
    for j in range(config.layers_per_block):
      rules |= _resnet(f"{down}.resnets.{j}", down_path + (f"resnets_{j}",), expected)
    up, up_path = f"decoder.up_blocks.{i}", ("decoder", f"up_blocks_{i}")
    for j in range(config.layers_per_block + 1):
      rules |= _resnet(f"{up}.resnets.{j}", up_path + (f"resnets_{j}",), expected)
    if i < levels - 1:
      rules |= conv(f"{down}.downsamplers.0.conv", down_path + ("downsamplers_0", "conv"), expected)
      rules |= conv(f"{up}.upsamplers.0.conv", up_path + ("upsamplers_0", "conv"), expected)
  if config.use_quant_conv:
    rules |= conv("quant_conv", ("quant_conv",), expected)
  if config.use_post_quant_conv:
    rules |= conv("post_quant_conv", ("post_quant_conv",), expected)
  return rules
