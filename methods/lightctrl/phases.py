"""LightCtrl's phases: three networks trained on rendered scenes, then the training-free pipeline.

autoencoder  the latent autoencoder on frames, target renders, normal maps and light maps;
             its output carries the scale that makes latents unit-variance (SD's 0.18215).
relighter    the image relighter (IC-Light-fc analogue) on single frames: eps of the target latent
             under a random point light given the source latent (and the light map for "fbc") and
             the lighting prompt, DDPM eps loss on SD's schedule, 10% null prompts.
video_prior  the video DiT (AnimateDiff analogue) on clips lit along random smooth trajectories.
relight      training-free (0 steps): every pipeline arm (`pipeline.py`) on evaluation clips.
The `paper` variant has only the relight phase, on the paper's released networks (`paper.py`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax

from core import diffusion, image_metrics, optim, relighting
from core.data.batching import GeneratedBatches
from core.nn.small_unet import ConvAutoencoder
from methods.base import Phase
from methods.lightctrl import pipeline
from methods.lightctrl.models import (
  NULL_PROMPT,
  alpha_bars,
  autoencoder,
  autoencoder_images,
  encode,
  grey,
  latent_size,
  prior_clips,
  relighter,
  relighter_channels,
  relighter_pairs,
  video_prior,
)

# ---------------------------------------------------------------------------------------------------
# Training steps
# ---------------------------------------------------------------------------------------------------


def optimizer(section) -> optax.GradientTransformation:
  schedule = optim.warmup_cosine(section.learning_rate, section.warmup_steps, section.steps)
  return optim.clipped_adam(schedule, section.grad_clip, weight_decay=1e-4)  # optax.adamw's default


def _update(section, state, loss_fn, with_ema: bool):
  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = optimizer(section).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  new = {**state, "params": params, "opt_state": opt_state}
  if with_ema:
    decay = section.ema_decay
    new["ema"] = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state["ema"], params)
  return new, {"loss": loss}


def autoencoder_loss(config, params, images):
  net = autoencoder(config)
  z = net.apply(params, images, method=ConvAutoencoder.encode)
  recon = net.apply(params, z, method=ConvAutoencoder.decode)
  return jnp.mean(jnp.square(recon - images)) + config.autoencoder.latent_penalty * jnp.mean(
    jnp.square(z)
  )


def _drop_prompts(rng, prompts, rate: float):
  return jnp.where(jax.random.uniform(rng, prompts.shape) < rate, NULL_PROMPT, prompts)


def gar_conditions(config, z_source, z_normals, rng):
  """With probability `relighter.gar_rate`, the GAR mix of a frame's normal and source latents at a
  cutoff lambda ~ U(fuse_above, 1) (the cutoffs the pipeline uses) instead of the source latent."""
  pick_rng, cutoff_rng = jax.random.split(rng)
  n = z_source.shape[0]
  cutoffs = jax.random.uniform(cutoff_rng, (n,), minval=config.pipeline.fuse_above, maxval=1.0)
  p = config.pipeline

  def mix(z_n, z_rgb, cutoff):  # one frame as a (1, 1, h, w, C) video, so every axis choice works
    one = lambda z: z[None, None]
    return relighting.geometry_aware_latent(
      one(z_n), one(z_rgb), cutoff, p.gar_axes, p.gar_filter, p.gar_order
    )[0, 0]

  mixed = jax.vmap(mix)(z_normals, z_source, cutoffs)
  use = jax.random.uniform(pick_rng, (n, 1, 1, 1)) < config.relighter.gar_rate
  return jnp.where(use, mixed, z_source)


def relighter_loss(config, params, ae, batch, rng):
  """eps loss of the target latent given the source latent (IC-Light fc's concat condition)."""
  x0 = encode(config, ae, batch["target"])
  z_source = encode(config, ae, batch["source"])
  if config.relighter.gar_rate > 0:
    gar_rng, rng = jax.random.split(rng)
    z_source = gar_conditions(config, z_source, encode(config, ae, batch["normals"]), gar_rng)
  condition = [z_source]
  if config.relighter.light_condition == "fbc":
    condition.append(encode(config, ae, grey(batch["light_map"])))
  condition = jnp.concatenate(condition, axis=-1)
  drop_rng, loss_rng = jax.random.split(rng)
  prompts = _drop_prompts(drop_rng, batch["prompt"], config.relighter.prompt_dropout)
  net = relighter(config)

  def model_fn(x_n, n):
    return net.apply(params, jnp.concatenate([x_n, condition], axis=-1), n, prompts)

  return diffusion.ddpm_eps_loss(model_fn, x0, loss_rng, jnp.asarray(alpha_bars(config)))


def video_prior_loss(config, params, ae, batch, rng):
  x0 = encode(config, ae, batch["video"])
  drop_rng, loss_rng = jax.random.split(rng)
  prompts = _drop_prompts(drop_rng, batch["prompt"], config.video_prior.prompt_dropout)
  net = video_prior(config)
  model_fn = lambda x_n, n: net.apply(params, x_n, n, prompts)
  return diffusion.ddpm_eps_loss(model_fn, x0, loss_rng, jnp.asarray(alpha_bars(config)))


def _init_trainable(section, params, with_ema: bool, **frozen):
  state = {"params": params, "opt_state": optimizer(section).init(params), **frozen}
  if with_ema:
    state["ema"] = params
  return state


# ---------------------------------------------------------------------------------------------------
# The phases
# ---------------------------------------------------------------------------------------------------


def _autoencoder_phase(config) -> Phase:
  section = config.autoencoder

  def init(rng, inputs):
    params = autoencoder(config).init(rng, jnp.zeros((1, config.data.size, config.data.size, 3)))
    return _init_trainable(section, params, with_ema=False)

  def step(state, batch, rng):
    del rng
    return _update(section, state, lambda p: autoencoder_loss(config, p, batch["images"]), False)

  def held_out():
    return jnp.asarray(autoencoder_images(config, config.seed + 7, 0, 64))

  def outputs(state, inputs):
    z = autoencoder(config).apply(state["params"], held_out(), method=ConvAutoencoder.encode)
    return {"params": state["params"], "scale": 1.0 / jnp.std(z)}

  def evaluate(state, rng, inputs):
    images = held_out()
    recon = jax.jit(autoencoder(config).apply)(state["params"], images)
    return {
      "autoencoder_psnr": float(jnp.mean(image_metrics.psnr(recon, images, 1.0))),
      "latent_scale": float(outputs(state, inputs)["scale"]),
    }

  return Phase(
    name="autoencoder",
    num_steps=section.steps,
    init=init,
    step=step,
    data=lambda inputs: GeneratedBatches(
      lambda s: {"images": autoencoder_images(config, config.seed, s, section.batch_size)},
      section.batch_size,
    ),
    evaluate=evaluate,
    outputs=outputs,
  )


def _diffusion_phase(
  config, name: str, section, net, loss_fn, example, make_batch, data_seed: int
) -> Phase:
  """A diffusion network trained on latents of the frozen autoencoder (kept in the state); batches
  of stream `data_seed`."""

  def init(rng, inputs):
    params = net.init(rng, *example)
    return _init_trainable(section, params, with_ema=True, ae=inputs["autoencoder"])

  def step(state, batch, rng):
    return _update(section, state, lambda p: loss_fn(config, p, state["ae"], batch, rng), True)

  def evaluate(state, rng, inputs):
    batch = make_batch(config.seed + 11, 0, section.batch_size)
    keys = jax.random.split(rng, 4)
    losses = jax.jit(jax.vmap(functools.partial(loss_fn, config), (None, None, None, 0)))(
      state["ema"], state["ae"], batch, keys
    )
    return {f"{name}_validation_loss": float(jnp.mean(losses))}

  return Phase(
    name=name,
    num_steps=section.steps,
    init=init,
    step=step,
    data=lambda inputs: GeneratedBatches(
      lambda s: make_batch(data_seed, s, section.batch_size), section.batch_size
    ),
    evaluate=evaluate,
    outputs=lambda state, inputs: state["ema"],
  )


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  if pipeline.uses_paper_networks(config):  # the paper's networks are released, nothing to train
    return [pipeline.relight_phase(config)]
  s, c, f = latent_size(config), config.autoencoder.latent_channels, config.data.frames
  relighter_example = (
    jnp.zeros((1, s, s, relighter_channels(config))),
    jnp.zeros((1,)),
    jnp.zeros((1,), jnp.int32),
  )
  prior_example = (jnp.zeros((1, f, s, s, c)), jnp.zeros((1,)), jnp.zeros((1,), jnp.int32))
  return [
    _autoencoder_phase(config),
    _diffusion_phase(
      config,
      "relighter",
      config.relighter,
      relighter(config),
      relighter_loss,
      relighter_example,
      functools.partial(relighter_pairs, config),
      config.seed + 1,
    ),
    _diffusion_phase(
      config,
      "video_prior",
      config.video_prior,
      video_prior(config),
      video_prior_loss,
      prior_example,
      functools.partial(prior_clips, config),
      config.seed + 2,
    ),
    pipeline.relight_phase(config),
  ]
