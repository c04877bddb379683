"""LightCtrl's networks, their latent interface and the rendered data each phase reads.

autoencoder  `ConvAutoencoder` (core/nn/small_unet.py); `encode` / `decode` apply its output's scale
             (unit-variance latents, SD's 0.18215).
relighter    `ConditionalUNet`: noisy latent || condition latent (|| light-map latent for "fbc"),
             the lighting prompt as its class (IC-Light fc's widened conv_in and text prompt).
video_prior  `VideoDiT` (core/nn/dit.py) on latent clips, the prompt as its class (AnimateDiff).

`Networks` is what the pipeline (`pipeline.py`) runs: `trained_networks` wraps these three, and
`paper.py` builds the same callables from the paper's converted SD-1.5 networks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core import relighting
from core.data import lambertian
from core.nn.dit import VideoDiT
from core.nn.small_unet import ConditionalUNet, ConvAutoencoder

NULL_PROMPT = len(lambertian.PROMPTS)


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


def latent_size(config) -> int:
  return config.data.size // 2 ** len(config.autoencoder.widths)


def autoencoder(config) -> ConvAutoencoder:
  a = config.autoencoder
  return ConvAutoencoder(latent_channels=a.latent_channels, widths=tuple(a.widths))


def relighter(config) -> ConditionalUNet:
  r = config.relighter
  return ConditionalUNet(
    out_channels=config.autoencoder.latent_channels,
    width=r.width,
    num_classes=len(lambertian.PROMPTS),
  )


def relighter_channels(config) -> int:
  """noisy latent || condition latent (|| light-map latent for "fbc")."""
  copies = 3 if config.relighter.light_condition == "fbc" else 2
  return copies * config.autoencoder.latent_channels


def video_prior(config) -> VideoDiT:
  v, s = config.video_prior, latent_size(config)
  return VideoDiT(
    (config.data.frames, s, s, config.autoencoder.latent_channels),
    tuple(v.patch),
    v.hidden,
    v.depth,
    v.heads,
    v.mlp_ratio,
    v.attention,
    num_classes=len(lambertian.PROMPTS),
    time_scale=1.0,  # the network sees the DDPM step, as SD's UNet does
  )


def alpha_bars(config) -> np.ndarray:
  d = config.diffusion
  return relighting.scaled_linear_alpha_bars(d.train_steps, d.beta_start, d.beta_end)


def video_alpha_bars(config) -> np.ndarray:
  """The video prior's sampler schedule: `diffusion.video_beta_schedule` over the same betas."""
  d = config.diffusion
  return relighting.BETA_SCHEDULES[d.video_beta_schedule](d.train_steps, d.beta_start, d.beta_end)


def encode(config, ae, images: jax.Array) -> jax.Array:
  """Unit-scale latents of images `(..., H, W, 3)`; `ae` is the autoencoder phase's output."""
  lead = images.shape[:-3]
  flat = images.reshape(-1, *images.shape[-3:])
  z = autoencoder(config).apply(ae["params"], flat, method=ConvAutoencoder.encode)
  return (z * ae["scale"]).reshape(*lead, *z.shape[1:])


def decode(config, ae, latents: jax.Array) -> jax.Array:
  lead = latents.shape[:-3]
  flat = latents.reshape(-1, *latents.shape[-3:]) / ae["scale"]
  x = autoencoder(config).apply(ae["params"], flat, method=ConvAutoencoder.decode)
  return x.reshape(*lead, *x.shape[1:])


def grey(maps: jax.Array) -> jax.Array:
  """Light maps `(..., H, W)` as grey RGB images."""
  return jnp.repeat(maps[..., None], 3, axis=-1)


class Networks(NamedTuple):
  """The pipeline's networks, images `(..., H, W, 3)` in [0, 1], latents `(..., H/f, W/f, C)`.

  encode / decode: images <-> diffusion-scale latents (any leading axes).
  relighter_eps: `(z_in (N, h, w, C), t (N,), condition (N, h, w, C'), prompt (N,), conditional)
    -> eps` (IC-Light fc: the condition concatenated to the noisy latent, the prompt's text or the
    null prompt when `conditional` is False).
  video_eps: `(z_in (B, F, h, w, C), t (B,), prompt (B,), conditional) -> eps` (AnimateDiff).
  factor: f, image pixels per latent pixel.
  """

  encode: Callable
  decode: Callable
  relighter_eps: Callable
  video_eps: Callable
  factor: int


def trained_networks(config, state) -> Networks:
  """The three networks trained by `phases.py`: `state` holds `ae`, `relighter` and `vdm`."""
  relight_net, video_net = relighter(config), video_prior(config)

  def relighter_eps(x, t, condition, prompt, conditional):
    labels = jnp.where(conditional, prompt, NULL_PROMPT)
    return relight_net.apply(
      state["relighter"], jnp.concatenate([x, condition], axis=-1), t, labels
    )

  def video_eps(x, t, prompt, conditional):
    return video_net.apply(state["vdm"], x, t, jnp.where(conditional, prompt, NULL_PROMPT))

  return Networks(
    encode=lambda x: encode(config, state["ae"], x),
    decode=lambda z: decode(config, state["ae"], z),
    relighter_eps=relighter_eps,
    video_eps=video_eps,
    factor=config.data.size // latent_size(config),
  )


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def _clip_kwargs(config) -> dict:
  d = config.data
  return dict(
    frames=d.frames,
    size=d.size,
    light_radius=d.light_radius,
    light_height=d.light_height,
    max_objects=d.max_objects,
    normal_noise=d.normal_noise,
  )


def autoencoder_images(config, seed: int, index: int, n: int) -> np.ndarray:
  """`n` images: source and target frames, normal maps and light maps of random-path clips."""
  kwargs = {**_clip_kwargs(config), "frames": 2}
  clips = lambertian.clip_batch(seed, index, max(n // 8, 1), paths="random", **kwargs)
  light = np.repeat(clips["light_map"][..., None], 3, axis=-1)
  images = np.concatenate([clips["source"], clips["target"], clips["normals"], light], axis=1)
  images = images.reshape(-1, *images.shape[-3:])
  return images[np.random.default_rng([seed, index, 1]).permutation(len(images))[:n]]


def relighter_pairs(config, seed: int, index: int, n: int) -> dict[str, np.ndarray]:
  """`n` single frames: source, the target under a uniform random point light, its light map, the
  normal map, prompt."""
  kwargs = {**_clip_kwargs(config), "frames": 1}
  clips = lambertian.clip_batch(seed, index, n, paths="point", **kwargs)
  return {
    "source": clips["source"][:, 0],
    "normals": clips["normals"][:, 0],
    "target": clips["target"][:, 0],
    "light_map": clips["light_map"][:, 0],
    "prompt": clips["prompt"],
  }


def prior_clips(config, seed: int, index: int, n: int) -> dict[str, np.ndarray]:
  clips = lambertian.clip_batch(seed, index, n, paths="random", **_clip_kwargs(config))
  return {"video": clips["target"], "prompt": clips["prompt"]}


def evaluation_clips(config) -> dict[str, np.ndarray]:
  """The fixed evaluation set: the paper's six trajectories with every prompt, assigned round-robin
  (`lambertian.paper_assignment`)."""
  return lambertian.clip_batch(
    config.seed + 1000, 0, config.evaluation.num_clips, paths="paper", **_clip_kwargs(config)
  )
