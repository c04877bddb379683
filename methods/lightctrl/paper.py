"""LightCtrl's arms on the paper's networks: SD-1.5 (Realistic Vision 5.1) VAE, CLIP text encoder and
UNet, IC-Light fc as the relighter and AnimateDiff's motion adapter v1-5-3 as the video prior
("LightCtrl: Training-free Controllable Video Relighting", ICLR 2026; GVCLab/LightCtrl `relight.py`).

`load_networks(config)` reads the `config.paper.*` files and converts them (`core/nn/sd_vae.py`,
`core/nn/sd_unet_convert.py`, `core/nn/iclight_convert.py`), `prompt_embeddings(config)` encodes the
prompts with CLIP's text encoder (`core/nn/clip_text.py`), `load_weights` is both;
`networks(config, weights)` turns them into the `models.Networks` the pipeline runs, so the per-frame,
SDEdit and fusion arms of `pipeline.py` run on them through the same jitted code as on the trained
networks:

  encode / decode  the VAE on images mapped to [-1, 1]: the posterior mean (IC-Light and LightCtrl
                   encode with `latent_dist.mode()`) times `scaling_factor` (0.18215), decode of
                   `z / scaling_factor` mapped back to [0, 1].
  relighter_eps    IC-Light fc: the UNet with 8 input channels on noisy latent || condition latent
                   (the condition fed to both guidance branches, as IC-Light's hooked forward does),
                   cross-attending to the CLIP embedding of the lighting prompt
                   (`paper.prompts[k] + paper.relight_suffix`, LightCtrl's `Relighter` appends
                   ", best quality") or, unconditionally, of `paper.negative_prompt`.
  video_eps        the UNet with the motion modules on the `(B*F, h, w, 4)` frames (`num_frames = F`),
                   cross-attending to the prompt's embedding (`paper.prompts[k]`, LightCtrl passes
                   the relight prompt to the video pipeline too) or the negative prompt's.

Every file is a diffusers / transformers folder's weights; the folder's `config.json` gives the
network's shape (the VAE, UNet, motion adapter and text encoder), IC-Light's file is offsets on the
UNet and has none. The prompts are encoded once, outside the jitted arms. Everything runs in float32.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from core.data import lambertian
from core.nn import clip_text, sd_unet_convert, sd_vae
from core.nn.convert import CheckpointError
from core.nn.sd_unet import UNet, UNetConfig
from methods.base import ConfigError, cached_per_config, require, require_file
from methods.lightctrl.models import Networks

# field, what it holds, whether its folder must hold the network's config.json
FILES = (
  ("paper.vae_checkpoint", "the SD-1.5 VAE: vae/diffusion_pytorch_model.safetensors", True),
  (
    "paper.unet_checkpoint",
    "the Realistic Vision 5.1 UNet in diffusers' layout: unet/diffusion_pytorch_model.safetensors",
    True,
  ),
  (
    "paper.iclight_checkpoint",
    "IC-Light's iclight_sd15_fc.safetensors (offsets on the UNet)",
    False,
  ),
  (
    "paper.motion_checkpoint",
    "AnimateDiff's motion adapter v1-5-3: diffusion_pytorch_model.safetensors",
    True,
  ),
  (
    "paper.text_encoder_checkpoint",
    "SD-1.5's CLIP text encoder: text_encoder/model.safetensors",
    True,
  ),
  ("paper.tokenizer_vocab", "SD-1.5's CLIP tokenizer: tokenizer/vocab.json", False),
  ("paper.tokenizer_merges", "SD-1.5's CLIP tokenizer: tokenizer/merges.txt", False),
)
HOW = "download it on a machine with network access and pass its path"


class ModelConfigs(NamedTuple):
  vae: sd_vae.VAEConfig
  relighter: UNetConfig
  video: UNetConfig
  text: clip_text.CLIPTextConfig


def validate(config) -> None:
  """Each file exists (with its folder's config.json), the networks fit the data and prompts."""
  for field, what, with_json in FILES:
    require_file(config, field, what, HOW)
    if with_json:
      path = os.path.join(os.path.dirname(config.paper[field.split(".")[1]]), "config.json")
      require(os.path.isfile(path), field, f"no config.json beside it (expected {path})")
  p = config.paper
  require(
    len(p.prompts) == len(lambertian.PROMPTS),
    "paper.prompts",
    f"needs one text per lighting prompt {lambertian.PROMPTS}, got {len(p.prompts)}",
  )
  require(
    config.relighter.light_condition == "init",
    "relighter.light_condition",
    "IC-Light fc takes the light map only as the initial latent ('init')",
  )
  configs = model_configs(config)
  factor = configs.vae.downsampling * 2 ** (len(configs.video.block_out_channels) - 1)
  require(
    config.data.size % factor == 0,
    "data.size",
    f"must be a multiple of {factor} (the VAE's factor x the UNet's downsampling)",
  )
  require(
    config.data.frames <= configs.video.motion_max_seq_length,
    "data.frames",
    f"the motion modules know {configs.video.motion_max_seq_length} frame positions",
  )


def model_configs(config) -> ModelConfigs:
  """The networks' shapes from the config.json files beside the weights; a config.json that does
  not describe SD-1.5's layout raises `ConfigError` naming the field of its weights."""
  unet = _from_json(config, "paper.unet_checkpoint", UNetConfig.from_diffusers)
  if unet.in_channels != 4:
    raise ConfigError(
      f"config.paper.unet_checkpoint: the base UNet must take 4 channels (IC-Light widens it), "
      f"its config.json has {unet.in_channels}"
    )
  return ModelConfigs(
    vae=_from_json(config, "paper.vae_checkpoint", sd_vae.VAEConfig.from_diffusers),
    relighter=dataclasses.replace(unet, in_channels=8),
    video=_from_json(config, "paper.motion_checkpoint", unet.with_motion),
    text=_from_json(
      config, "paper.text_encoder_checkpoint", clip_text.CLIPTextConfig.from_transformers
    ),
  )


def _from_json(config, field: str, parse):
  path = os.path.join(os.path.dirname(config.paper[field.split(".")[1]]), "config.json")
  try:
    with open(path) as f:
      return parse(json.load(f))
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise ConfigError(f"config.{field}: {path}: {type(error).__name__}: {error}") from None


def _read(config, field: str) -> dict[str, np.ndarray]:
  try:
    return load_file(config.paper[field.split(".")[1]])
  except Exception as error:  # a truncated or non-safetensors file
    raise ConfigError(f"config.{field}: cannot read it: {type(error).__name__}: {error}") from None


def _convert(field: str, fn, *args):
  try:
    return fn(*args)
  except CheckpointError as error:
    raise ConfigError(f"config.{field}: {error}") from None


@cached_per_config(maxsize=1)
def load_networks(config) -> dict:
  """`{"vae", "relighter", "video": {"params": ...}}`, float32 numpy, converted from the files."""
  configs = model_configs(config)
  unet = _read(config, "paper.unet_checkpoint")
  vae = _read(config, "paper.vae_checkpoint")
  offsets = _read(config, "paper.iclight_checkpoint")
  motion = "paper.motion_checkpoint"
  video = _convert(motion, sd_unet_convert.merge_motion, unet, _read(config, motion))
  return {
    "vae": _convert("paper.vae_checkpoint", sd_vae.convert_vae, vae, configs.vae),
    "relighter": _convert(
      "paper.iclight_checkpoint", sd_unet_convert.iclight_unet, unet, offsets, configs.relighter
    ),
    "video": _convert(motion, sd_unet_convert.convert_unet, video, configs.video),
  }


@cached_per_config(maxsize=1)
def prompt_embeddings(config) -> dict[str, np.ndarray]:
  """CLIP's last hidden states `(77, D)` of the lighting prompts (`relight`, `video`: one per
  `lambertian.PROMPTS`) and of the negative prompt (`null`). Computed eagerly, also when called
  while a caller is being traced (the relight phase's `init`), so they are constants there."""
  p = config.paper
  text_config = model_configs(config).text
  tokenizer = clip_text.CLIPTokenizer.from_files(p.tokenizer_vocab, p.tokenizer_merges)
  params = _convert(
    "paper.text_encoder_checkpoint",
    clip_text.convert_clip_text,
    _read(config, "paper.text_encoder_checkpoint"),
    text_config,
  )
  prompts = list(p.prompts)
  texts = [t + p.relight_suffix for t in prompts] + prompts + [p.negative_prompt]
  with jax.ensure_compile_time_eval():
    states = clip_text.CLIPTextModel(text_config).apply(params, tokenizer.encode(texts))
  states = np.asarray(states, np.float32)
  n = len(prompts)
  return {"relight": states[:n], "video": states[n : 2 * n], "null": states[2 * n]}


def load_weights(config) -> dict:
  """Everything `networks` needs: `load_networks` and `{"text": prompt_embeddings}`."""
  return {**load_networks(config), "text": prompt_embeddings(config)}


def networks(config, weights) -> Networks:
  """The paper's networks as the pipeline's callables (`weights` from `load_weights`)."""
  configs = model_configs(config)
  vae = sd_vae.AutoencoderKL(configs.vae)
  scale, shift = configs.vae.scaling_factor, configs.vae.shift_factor
  relighter, video = UNet(configs.relighter), UNet(configs.video)
  text = weights["text"]

  def context(table, prompt, conditional):
    if conditional:
      return jnp.asarray(table)[prompt]
    return jnp.broadcast_to(text["null"], (prompt.shape[0], *text["null"].shape))

  def encode(images):
    flat = images.reshape(-1, *images.shape[-3:]) * 2.0 - 1.0
    mean, _ = vae.apply(weights["vae"], flat, method=sd_vae.AutoencoderKL.encode)
    return ((mean - shift) * scale).reshape(*images.shape[:-3], *mean.shape[1:])

  def decode(latents):
    flat = latents.reshape(-1, *latents.shape[-3:]) / scale + shift
    x = vae.apply(weights["vae"], flat, method=sd_vae.AutoencoderKL.decode)
    return ((x + 1.0) / 2.0).reshape(*latents.shape[:-3], *x.shape[1:])

  def relighter_eps(x, t, condition, prompt, conditional):
    inputs = jnp.concatenate([x, condition], axis=-1)
    return relighter.apply(
      weights["relighter"], inputs, t, context(text["relight"], prompt, conditional)
    )

  def video_eps(z, t, prompt, conditional):
    b, f = z.shape[:2]
    frames = z.reshape(b * f, *z.shape[2:])
    eps = video.apply(weights["video"], frames, t, context(text["video"], prompt, conditional), f)
    return eps.reshape(z.shape)

  return Networks(encode, decode, relighter_eps, video_eps, factor=configs.vae.downsampling)
