"""LightCtrl: the renderer, LMI, the frequency filters and GAR, the Euler-ancestral step with x0
replacement, the fusion loop, the metrics, the method's config checks and a run through the loop."""

import functools
import importlib
import itertools
import json
import math
import re

import chex
import fixture_files
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lightctrl as lightctrl_config
from core import relight_metrics, relighting
from core.data import lambertian
from experiments import loop
from methods import lightctrl
from methods.lightctrl import models, pipeline

# ---------------------------------------------------------------------------------------------------
# Renderer
# ---------------------------------------------------------------------------------------------------


def test_clips_are_seeded_shaped_and_in_range():
  a = lambertian.clip_batch(3, 1, 7, frames=4, size=16)
  b = lambertian.clip_batch(3, 1, 7, frames=4, size=16)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  chex.assert_shape([a["source"], a["target"], a["normals"], a["albedo"]], (7, 4, 16, 16, 3))
  chex.assert_shape([a["light_map"], a["source_shading"]], (7, 4, 16, 16))
  chex.assert_shape(a["light_path"], (7, 4, 2))
  for key in ("source", "target", "normals", "light_map"):
    assert a[key].dtype == np.float32 and a[key].min() >= 0 and a[key].max() <= 1, key
  # clip i follows trajectory i % 6 and the light map peaks at the path
  np.testing.assert_allclose(a["light_path"][2], lambertian.trajectory("top_to_bottom", 4, 16))
  np.testing.assert_array_equal(a["prompt"], [0, 1, 2, 0, 1, 2, 1])


@pytest.mark.parametrize("n", [6, 7, 12, 18])
def test_every_evaluation_set_covers_every_trajectory_and_prompt(n):
  assignment = lambertian.paper_assignment(n)
  assert {t for t, _ in assignment} == set(lambertian.TRAJECTORIES)
  assert {p for _, p in assignment} == set(range(len(lambertian.PROMPTS)))
  if n % len(lambertian.TRAJECTORIES) == 0:  # whole blocks: every prompt equally often
    counts = np.bincount([p for _, p in assignment], minlength=len(lambertian.PROMPTS))
    assert len(set(counts)) == 1
  if n >= 18:  # every (trajectory, prompt) pair
    assert len(set(assignment[:18])) == 18
  config = tiny_config()
  config.evaluation.num_clips = lambertian.MIN_PAPER_CLIPS - 1
  with pytest.raises(loop.ConfigError, match="config.evaluation.num_clips:.*cannot cover"):
    lightctrl.validate(config)


def test_paper_trajectories_end_points():
  size, last = 32, 31.0
  tl = lambertian.trajectory("top_left_to_bottom_right", 5, size)
  np.testing.assert_allclose(tl[[0, -1]], [[0, 0], [last, last]])
  bl = lambertian.trajectory("bottom_left_to_top_right", 5, size)
  np.testing.assert_allclose(bl[[0, -1]], [[0, last], [last, 0]])
  circle = lambertian.trajectory("circular", 9, size)
  np.testing.assert_allclose(np.linalg.norm(circle - 16, axis=-1), 16, atol=1e-5)
  semi = lambertian.trajectory("semi_circular", 9, size)
  np.testing.assert_allclose(semi[[0, 4, 8]], [[0, 16], [16, 0], [32, 16]], atol=1e-4)
  maps = lambertian.light_maps(tl, size, 6.0)
  assert maps[2, 15, 15] > 0.99 and maps[2, 0, 31] < 0.01  # the centre is (15.5, 15.5)
  with pytest.raises(ValueError, match="unknown trajectory"):
    lambertian.trajectory("zigzag", 4, size)


@pytest.mark.parametrize("kind", ["sphere", "cylinder"])
def test_normals_match_finite_differences_of_the_height_field(kind):
  size = 48
  obj = {
    "kind": kind,
    "centre": np.array([24.0, 24.0]),
    "velocity": np.zeros(2),
    "radius": 14.0,
    "extent": 12.0,
    "along_x": False,
    "box_height": 5.0,
    "colours": np.full((2, 3), 0.5),
    "checker": 0,
  }
  scene = {"ground": {"colours": np.full((2, 3), 0.5), "checker": 0}, "objects": [obj]}
  height, normal, _ = lambertian.scene_frame(scene, size, 0)
  dz_dx = (height[1:-1, 2:] - height[1:-1, :-2]) / 2
  dz_dy = (height[2:, 1:-1] - height[:-2, 1:-1]) / 2
  fd = np.stack([-dz_dx, -dz_dy, np.ones_like(dz_dx)], axis=-1)
  fd /= np.linalg.norm(fd, axis=-1, keepdims=True)
  exact = normal[1:-1, 1:-1]
  # interior of the object, away from its rim (where the height field is steep or jumps)
  on_object = height > 0
  inside = on_object[1:-1, 1:-1] & (exact[..., 2] > 0.6)
  for shifted in (
    on_object[2:, 1:-1],
    on_object[:-2, 1:-1],
    on_object[1:-1, 2:],
    on_object[1:-1, :-2],
  ):
    inside &= shifted
  assert inside.sum() > 50
  np.testing.assert_allclose(fd[inside], exact[inside], atol=0.05)
  np.testing.assert_allclose(np.linalg.norm(normal, axis=-1), 1.0, atol=1e-6)


def test_shading_is_lambertian_under_the_light():
  height = np.zeros((1, 8, 8))
  normal = np.zeros((1, 8, 8, 3))
  normal[..., 2] = 1.0
  light = np.array([[3.0, 4.0, 10.0]])
  shading = lambertian.lambert_shading(height, normal, light, radius=100.0)
  assert shading[0, 4, 3] == pytest.approx(1.0, abs=1e-3)  # straight below: n . l = 1
  # n . l = h / distance off the light's foot point
  assert shading[0, 4, 7] == pytest.approx(10.0 / math.hypot(4.0, 10.0), rel=1e-3)


# ---------------------------------------------------------------------------------------------------
# LMI, filters, GAR
# ---------------------------------------------------------------------------------------------------


def test_lmi_changes_nothing_outside_the_mask_and_mixes_inside():
  z = jax.random.normal(jax.random.key(0), (2, 3, 8, 8, 4))
  eps = jax.random.normal(jax.random.key(1), z.shape)
  centres = jnp.array([[[1.0, 1.0], [4.0, 4.0], [7.0, 2.0]]] * 2)
  masks = relighting.lmi_masks(centres, 8, sigma=1.2, threshold=0.2)
  assert set(np.unique(np.asarray(masks))) == {0.0, 1.0}
  assert masks[0, 1, 4, 4] == 1 and masks[0, 1, 0, 0] == 0
  out = relighting.inject_light_map(z, masks, eps, omega=0.8)
  m = np.asarray(masks, bool)
  np.testing.assert_array_equal(np.asarray(out)[~m], np.asarray(z)[~m])
  np.testing.assert_allclose(np.asarray(out)[m], (0.8 * eps + 0.2 * z)[m], rtol=1e-6, atol=1e-6)


def _reference_butterworth(shape, n, d_s, d_t):
  """The official triple loop (GVCLab/LightCtrl utils/tools.py), for comparison."""
  t_, h_, w_ = shape
  mask = np.zeros(shape)
  for t, h, w in itertools.product(range(t_), range(h_), range(w_)):
    d2 = ((d_s / d_t) * (2 * t / t_ - 1)) ** 2 + (2 * h / h_ - 1) ** 2 + (2 * w / w_ - 1) ** 2
    mask[t, h, w] = 1 / (1 + (d2 / d_s**2) ** n)
  return mask


def test_butterworth_matches_the_loop_and_its_limits():
  shape = (4, 6, 5)
  for cutoff in (0.25, 0.6, 1.0):
    np.testing.assert_allclose(
      relighting.butterworth_low_pass(shape, cutoff),
      _reference_butterworth(shape, 4, cutoff, cutoff),
      rtol=1e-5,
    )
  h = relighting.butterworth_low_pass((4, 8, 8), 0.25)
  assert h[2, 4, 4] == 1.0  # the centre after fftshift
  assert h[0, 0, 0] < 1e-4  # far from it
  for kind in relighting.FILTERS:
    np.testing.assert_array_equal(relighting.low_pass(kind, (4, 8, 8), 0.0), 0.0)
    assert relighting.low_pass(kind, (4, 8, 8), 0.5)[2, 4, 4] == 1.0
  with pytest.raises(ValueError, match="filter must be"):
    relighting.low_pass("box", (4, 8, 8), 0.5)


@pytest.mark.parametrize("axes", sorted(relighting.GAR_AXES))
def test_gar_limits(axes):
  # even sizes: the official grid `2i/n - 1` has its zero at the fftshifted DC only for even n
  z_n = jax.random.normal(jax.random.key(0), (2, 4, 8, 8, 4))
  z_rgb = jax.random.normal(jax.random.key(1), z_n.shape)
  # cutoff 0: H = 0, everything from the RGB latent
  np.testing.assert_allclose(
    relighting.geometry_aware_latent(z_n, z_rgb, 0.0, axes), z_rgb, atol=1e-5
  )
  # H = 1 everywhere: everything from the normal latent
  picked = relighting.filter_axes(axes, z_n.ndim)
  ones = jnp.ones([z_n.shape[a] if a in picked else 1 for a in range(z_n.ndim)])
  np.testing.assert_allclose(relighting.frequency_mix(z_n, z_rgb, ones, picked), z_n, atol=1e-5)
  # a huge cutoff is H ~ 1 as well; an intermediate one keeps the mean of the normal latent
  np.testing.assert_allclose(
    relighting.geometry_aware_latent(z_n, z_rgb, 1e3, axes), z_n, atol=1e-4
  )
  mixed = relighting.geometry_aware_latent(z_n, z_rgb, 0.5, axes)
  chex.assert_shape(mixed, z_n.shape)
  np.testing.assert_allclose(jnp.mean(mixed, axis=picked), jnp.mean(z_n, axis=picked), atol=1e-4)


def test_gar_takes_the_low_band_from_the_normals_and_keeps_the_sources_texture():
  """Direction of GAR (Sec. 3.4): the source's shading (low band) is replaced by the normal latent's,
  the source's texture (high band) survives, and a lower cutoff lambda hands the low band back to the
  source. A swapped mix (low band from the source) fails every assertion."""
  yy, xx = np.mgrid[:8, :8]
  texture = 0.5 * np.where((xx + yy) % 2 == 0, 1.0, -1.0)  # the Nyquist checker
  shading_src = np.cos(2 * np.pi * xx / 8)  # the source light's broad shading, one cycle
  shading_normal = np.cos(2 * np.pi * yy / 8)  # the geometry's, along the other axis
  latent = lambda img, dc: jnp.asarray(np.broadcast_to((img + dc)[..., None], (1, 1, 8, 8, 4)))
  z_rgb = latent(shading_src + texture, 0.3)
  z_normal = latent(shading_normal, -0.5)
  project = lambda z, basis: float(jnp.sum(z[0, 0, ..., 0] * basis) / np.sum(basis * basis))
  mixed = relighting.geometry_aware_latent(z_normal, z_rgb, 1.0, "hw")
  assert float(jnp.mean(mixed)) == pytest.approx(-0.5, abs=1e-4)  # DC: H(0) = 1
  assert project(mixed, shading_normal) > 0.9  # the geometry's low band
  assert abs(project(mixed, shading_src)) < 0.1  # the source's shading is gone
  assert project(mixed, texture) > 0.9  # its texture is kept
  lower = relighting.geometry_aware_latent(z_normal, z_rgb, 0.1, "hw")
  assert project(lower, shading_src) > 0.9 > project(mixed, shading_src) + 0.5
  assert project(lower, shading_normal) < 0.1


def _lmi_contrast(light_x: float, mask_kind: str, detail: bool) -> float:
  """The lit-region contrast (mean inside the light map's LMI mask minus outside) after the fusion
  loop on a small case: identity autoencoder, a video prior that trusts its input (eps = 0), a
  relighter that adds light at the light map, a dark scene (-1) whose source light sits at the top
  while the target light is at `(light_x, 8)`; the latent prior's mean (0) is brighter than the
  unlit scene, as SD's latent mean is. Mean over 8 noise seeds."""
  size, frames = 12, 2
  yy, xx = np.mgrid[:size, :size]
  source = -1.0 + 2.0 * np.exp(-((xx - 6) ** 2 + (yy - 1) ** 2) / 8.0)
  source = jnp.asarray(np.broadcast_to(source[None, None, ..., None], (1, frames, size, size, 1)))
  path = jnp.asarray(np.tile([[light_x, 8.0]], (1, frames, 1)), jnp.float32)
  light = jnp.asarray(lambertian.light_maps(np.asarray(path), size, 2.0))[..., None]
  mask = relighting.lmi_masks(path, size, 2.0, 0.2)
  inject = {"none": 0.0 * mask, "mask": mask, "complement": 1.0 - mask}[mask_kind]
  out = _lmi_fusion(source, light, inject, detail)
  inside = jnp.mean(out * mask) / jnp.mean(mask)
  return float(inside - jnp.mean(out * (1 - mask)) / jnp.mean(1 - mask))


@functools.partial(jax.jit, static_argnums=3)  # every scene and mask: one program per `detail`
def _lmi_fusion(source, light, inject, detail):
  fns = relighting.PipelineFns(
    encode=lambda x: x,
    decode=lambda x: x,
    video_eps=lambda x, t: jnp.zeros_like(x),
    relight=lambda images, lam, key: images + 2.0 * light,
  )
  schedule = relighting.euler_schedule(relighting.scaled_linear_alpha_bars(), 4, 0.5)

  def one(key):
    noise_key, inject_key, loop_key = jax.random.split(key, 3)
    z = relighting.noise_to(source, schedule.sigmas[0], jax.random.normal(noise_key, source.shape))
    z = relighting.inject_light_map(z, inject, jax.random.normal(inject_key, z.shape), 0.8)
    return relighting.lightctrl_sample(fns, schedule, z, source, loop_key, 0.15, detail)

  return jax.vmap(one)(jax.random.split(jax.random.key(0), 8))[..., 0]


@pytest.mark.parametrize("light_x", [9.0, 2.5])
def test_lmi_moves_the_lit_region_towards_the_light_map(light_x):
  """Without the detail residual, LMI at the light map raises the lit region's contrast there and LMI
  at the mask's complement lowers it; the official detail residual `V_s - D(x0_hat)` of step 0
  restores the source inside the mask and reverses LMI's effect (docs/results.md, lightctrl)."""
  without = _lmi_contrast(light_x, "none", detail=False)
  assert _lmi_contrast(light_x, "mask", detail=False) > without + 0.4
  assert _lmi_contrast(light_x, "complement", detail=False) < without - 0.2
  assert _lmi_contrast(light_x, "mask", detail=True) < _lmi_contrast(light_x, "none", detail=True)


# ---------------------------------------------------------------------------------------------------
# Schedules, the ancestral step, the fusion loop
# ---------------------------------------------------------------------------------------------------


def test_euler_schedule_matches_diffusers_strength_rule():
  abar = relighting.scaled_linear_alpha_bars()
  np.testing.assert_allclose(abar[[0, -1]], [1 - 0.00085, 0.00466], rtol=2e-2)
  schedule = relighting.euler_schedule(abar, 25, 0.5)
  chex.assert_shape(schedule.timesteps, (25,))
  chex.assert_shape(schedule.sigmas, (26,))
  assert schedule.sigmas[-1] == 0 and np.all(np.diff(np.asarray(schedule.sigmas)) < 0)
  full = relighting.euler_schedule(abar, 50, 1.0)
  np.testing.assert_allclose(full.timesteps[25:], schedule.timesteps)  # the last 25 of 50
  assert full.timesteps[0] == 999


def test_ancestral_step_with_exact_x0_keeps_the_forward_marginal():
  x0 = jnp.full((20_000,), 0.7)
  sigma, sigma_next = 2.0, 0.8
  z = x0 + sigma * jax.random.normal(jax.random.key(0), x0.shape)
  noise = jax.random.normal(jax.random.key(1), x0.shape)
  z_next = relighting.euler_ancestral_step(z, x0, sigma, sigma_next, noise)
  assert float(jnp.mean(z_next)) == pytest.approx(0.7, abs=0.02)
  assert float(jnp.std(z_next)) == pytest.approx(sigma_next, rel=0.02)
  np.testing.assert_allclose(
    relighting.euler_ancestral_step(z, x0, sigma, 0.0, noise), x0, rtol=1e-6
  )


def _toy_fns(relight):
  identity = lambda x: x
  return relighting.PipelineFns(
    encode=identity,
    decode=identity,
    video_eps=lambda x, t: 0.1 * x,
    relight=relight,
  )


def test_fusion_with_an_identity_relighter_is_the_ordinary_step():
  schedule = relighting.euler_schedule(relighting.scaled_linear_alpha_bars(), 6, 0.5)
  z = jax.random.normal(jax.random.key(0), (1, 3, 4, 4, 3))
  source = jnp.zeros_like(z)
  run = lambda fns, above: relighting.lightctrl_sample(
    fns, schedule, z, source, jax.random.key(1), above, detail=False
  )
  plain = run(_toy_fns(lambda i, lam, key: jnp.full_like(i, jnp.nan)), 2.0)  # never relit
  assert bool(jnp.all(jnp.isfinite(plain)))
  np.testing.assert_allclose(run(_toy_fns(lambda i, lam, key: i), 0.15), plain, rtol=1e-5)
  # a relighter that returns a constant pulls the result towards it
  pulled = run(_toy_fns(lambda i, lam, key: jnp.full_like(i, 3.0)), 0.15)
  assert float(jnp.mean(jnp.abs(pulled - 3.0))) < float(jnp.mean(jnp.abs(plain - 3.0)))


# ---------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_metrics_of_the_target_itself_and_of_the_source():
  clips = lambertian.clip_batch(0, 0, 6, frames=6, size=16, light_radius=3.0, light_height=8.0)
  jclips = {k: jnp.asarray(v) for k, v in clips.items()}
  colours = jnp.asarray(lambertian.LIGHT_COLOURS[clips["prompt"]])
  oracle = relight_metrics.all_metrics(jclips["target"], jclips, colours, lambertian.AMBIENT)
  np.testing.assert_array_equal(oracle["flicker"], 0.0)
  np.testing.assert_array_equal(oracle["source_leakage"], 0.0)
  np.testing.assert_allclose(oracle["ssim"], 1.0, atol=1e-5)
  assert float(jnp.mean(oracle["light_following"])) > 0.8
  source = relight_metrics.all_metrics(jclips["source"], jclips, colours, lambertian.AMBIENT)
  assert float(jnp.mean(source["source_leakage"])) > 0.2  # the source light is all there is
  assert float(jnp.mean(source["light_following"])) < float(jnp.mean(oracle["light_following"]))


# ---------------------------------------------------------------------------------------------------
# The method
# ---------------------------------------------------------------------------------------------------


def tiny_config():
  config = lightctrl_config.get_config()
  config.data.update(frames=3, size=16, max_objects=1)
  config.autoencoder.update(steps=2, batch_size=8, widths=(8,), latent_channels=2)
  config.relighter.update(steps=2, batch_size=4, width=8)
  config.video_prior.update(steps=2, batch_size=4, hidden=16, depth=1, heads=2, mlp_ratio=2)
  config.pipeline.update(num_steps=2, relight_steps=1)
  config.evaluation.update(num_clips=6, arms=("per_frame", "per_frame_sdedit_0.2", "lightctrl"))
  config.loop.update(log_every=1, checkpoint_every=2)
  return config


def _random_state(config):
  s, c, f = models.latent_size(config), config.autoencoder.latent_channels, config.data.frames
  key = jax.random.key(0)

  @jax.jit  # one compiled program instead of three op-by-op inits
  def init():
    ae = models.autoencoder(config).init(key, jnp.zeros((1, config.data.size, config.data.size, 3)))
    rel = models.relighter(config).init(
      key, jnp.zeros((1, s, s, models.relighter_channels(config))), jnp.zeros(1), jnp.zeros(1, int)
    )
    vdm = models.video_prior(config).init(
      key, jnp.zeros((1, f, s, s, c)), jnp.zeros(1), jnp.zeros(1, int)
    )
    return {"ae": {"params": ae, "scale": jnp.float32(1.0)}, "relighter": rel, "vdm": vdm}

  return init()


def test_pipeline_on_random_networks_has_the_video_shape():
  config = tiny_config()
  state = _random_state(config)
  clips = {k: jnp.asarray(v) for k, v in models.evaluation_clips(config).items()}
  schedule = pipeline.schedule_for(config, 0.5)
  out = pipeline.jitted_fusion(config)(
    state, clips, clips["source"], jax.random.key(1), 1.0, 1.0, 0.15, schedule
  )
  chex.assert_shape(out, clips["source"].shape)
  assert bool(jnp.all((out >= 0) & (out <= 1)))


def test_every_variant_validates_and_bad_fields_are_named(tmp_path):
  for variant in ("default", "study", "gpu"):
    lightctrl.validate(lightctrl_config.get_config(None if variant == "default" else variant))
  with pytest.raises(loop.ConfigError, match="config.paper.vae_checkpoint:"):
    lightctrl.validate(lightctrl_config.get_config("paper"))
  bad = {
    "pipeline.gar_axes": ("fchw", "pipeline.gar_axes"),
    "pipeline.strength": (0.0, "pipeline.strength"),
    "evaluation.arms": (("lightctrl", "relight_everything"), "evaluation.arms"),
    "evaluation.headline": ("oracle2", "evaluation.headline"),
    "relighter.light_condition": ("text", "relighter.light_condition"),
    "video_prior.patch": ((1, 3, 3), "video_prior.patch"),
    "data.size": (18, "data.size"),
  }
  for name, (value, field) in bad.items():
    config = tiny_config()
    group, key = name.split(".")
    config[group][key] = value
    with pytest.raises(loop.ConfigError, match=f"config.{field}:"):
      lightctrl.validate(config)


def test_gar_training_conditions():
  phases_module = importlib.import_module("methods.lightctrl.phases")
  config = tiny_config()
  z = jax.random.normal(jax.random.key(1), (4, 8, 8, 2))
  z_normal = jax.random.normal(jax.random.key(2), z.shape)
  config.relighter.gar_rate = 0.0
  np.testing.assert_array_equal(
    phases_module.gar_conditions(config, z, z_normal, jax.random.key(3)), z
  )
  config.relighter.gar_rate = 1.0
  mixed = phases_module.gar_conditions(config, z, z_normal, jax.random.key(3))
  # every frame now has the normal latent's DC term (H = 1 at the centre for even sizes)
  np.testing.assert_allclose(
    jnp.mean(mixed, axis=(1, 2, 3)), jnp.mean(z_normal, axis=(1, 2, 3)), atol=1e-5
  )


@pytest.mark.slow
def test_smoke_run_through_the_loop_and_resume(tmp_path):
  config = tiny_config()
  summary = loop.run(config, str(tmp_path))
  results = summary.results
  for key in ("psnr", "light_following", "source_leakage", "flicker", "autoencoder_psnr"):
    assert math.isfinite(results[key]), key
  assert summary.step_traces == {"autoencoder": 1, "relighter": 1, "video_prior": 1, "relight": 0}
  assert (tmp_path / "relit_frames.png").exists()
  assert sorted(p.stem for p in (tmp_path / "relit_clips").glob("*.gif")) == sorted(
    config.evaluation.arms
  )
  report = lightctrl.report(
    config, {"lightctrl": json.loads((tmp_path / "results.json").read_text())}
  )
  assert [row["arm"] for row in report.rows] == list(config.evaluation.arms)
  # a second run in the same folder resumes every phase and reports the same numbers
  again = loop.run(config, str(tmp_path)).results
  assert again["psnr"] == results["psnr"]


def test_iclight_fc_merge_on_random_weights_of_the_real_layout():
  from core.nn import iclight_convert

  rng = np.random.default_rng(0)
  base = {
    "conv_in.weight": rng.normal(size=(320, 4, 3, 3)).astype(np.float32),
    "conv_in.bias": rng.normal(size=(320,)).astype(np.float32),
    "down_blocks.0.resnets.0.conv1.weight": rng.normal(size=(320, 320, 3, 3)).astype(np.float32),
  }
  offsets = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in base.items()}
  offsets["conv_in.weight"] = rng.normal(size=(320, 8, 3, 3)).astype(np.float32)
  merged = iclight_convert.merge_fc_offsets(base, offsets)
  np.testing.assert_allclose(
    merged["conv_in.weight"][:, :4], base["conv_in.weight"] + offsets["conv_in.weight"][:, :4]
  )
  np.testing.assert_array_equal(merged["conv_in.weight"][:, 4:], offsets["conv_in.weight"][:, 4:])
  np.testing.assert_allclose(merged["conv_in.bias"], base["conv_in.bias"] + offsets["conv_in.bias"])
  assert iclight_convert.conv_kernel_to_flax(merged["conv_in.weight"]).shape == (3, 3, 8, 320)
  with pytest.raises(iclight_convert.CheckpointError, match="conv_in.bias"):
    iclight_convert.merge_fc_offsets(base, {**offsets, "conv_in.bias": np.zeros(4)})
  del offsets["down_blocks.0.resnets.0.conv1.weight"]
  with pytest.raises(iclight_convert.CheckpointError, match="down_blocks.0.resnets.0.conv1"):
    iclight_convert.merge_fc_offsets(base, offsets)


# ---------------------------------------------------------------------------------------------------
# The paper variant on tiny random weights of the real layouts
# ---------------------------------------------------------------------------------------------------


def _torch_layout(shapes, name, rng):
  """Random weights in torch layout for Flax parameter shapes, keyed by `name(path)`."""
  out = {}
  for path, shape in shapes.items():
    if path[-1] == "kernel" and len(shape) == 4:
      shape = (shape[3], shape[2], shape[0], shape[1])
    elif path[-1] == "kernel":
      shape = shape[::-1]
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    value = (
      rng.normal(size=shape) / np.sqrt(fan_in) if len(shape) > 1 else 0.1 * rng.normal(size=shape)
    )
    if path[-1] == "scale":
      value = value + 1.0
    out[name(path)] = value.astype(np.float32)
  return out


def _dotted(path, prefix=""):
  """`encoder/layers_3/self_attn/q_proj/kernel` -> `encoder.layers.3.self_attn.q_proj.weight`."""
  parts = [re.sub(r"_(\d+)$", r".\1", part) for part in path[:-1]]
  return prefix + ".".join(parts + ["bias" if path[-1] == "bias" else "weight"])


def write_tiny_paper_files(root) -> dict[str, str]:
  """SD-1.5-layout folders at toy widths (random weights): the config.paper fields pointing at them."""
  from safetensors.numpy import save_file

  from core.nn import clip_text, sd_unet, sd_unet_convert
  from core.nn.convert import param_shapes

  rng = np.random.default_rng(0)
  text_config = clip_text.CLIPTextConfig.tiny()
  unet_json = {
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": [32, 64],
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
    "layers_per_block": 1,
    "attention_head_dim": 2,
    "cross_attention_dim": text_config.hidden_size,
    "norm_num_groups": 8,
  }
  adapter_json = {
    "block_out_channels": [32, 64],
    "motion_layers_per_block": 1,
    "motion_num_attention_heads": 2,
    "motion_norm_num_groups": 8,
    "motion_max_seq_length": 8,
    "use_motion_mid_block": False,
  }
  unet_config = sd_unet.UNetConfig.from_diffusers(unet_json).with_motion(adapter_json)
  video = _torch_layout(
    sd_unet_convert.expected_shapes(unet_config), sd_unet_convert.torch_name, rng
  )
  motion = {k: v for k, v in video.items() if ".motion_modules." in k}
  unet = {k: v for k, v in video.items() if k not in motion}
  offsets = {k: 0.01 * rng.normal(size=v.shape).astype(np.float32) for k, v in unet.items()}
  offsets["conv_in.weight"] = 0.1 * rng.normal(size=(32, 8, 3, 3)).astype(np.float32)

  vae_arrays = fixture_files.arrays("sd_vae")
  vae, vae_json = fixture_files.state_dict(vae_arrays), json.loads(str(vae_arrays["config_json"]))
  ids = jnp.zeros((1, text_config.max_position_embeddings), jnp.int32)
  text_shapes = param_shapes(
    jax.eval_shape(clip_text.CLIPTextModel(text_config).init, jax.random.key(0), ids)
  )
  text = _torch_layout(text_shapes, lambda p: _dotted(p, "text_model."), rng)
  text = {k.replace(".embedding.weight", ".weight"): v for k, v in text.items()}

  files = {}
  for name, state, cfg, field in (
    ("unet", unet, unet_json, "unet_checkpoint"),
    ("motion", motion, adapter_json, "motion_checkpoint"),
    ("vae", vae, vae_json, "vae_checkpoint"),
    ("text_encoder", text, dict(vars(text_config)), "text_encoder_checkpoint"),
    ("iclight", offsets, None, "iclight_checkpoint"),
  ):
    folder = root / name
    folder.mkdir()
    save_file(state, str(folder / "weights.safetensors"))
    if cfg is not None:
      (folder / "config.json").write_text(json.dumps(cfg))
    files[field] = str(folder / "weights.safetensors")
  files |= write_tiny_tokenizer(root / "tokenizer")
  return files


def write_tiny_tokenizer(folder) -> dict[str, str]:
  """CLIP's byte-level BPE files with no merges: every byte with and without `</w>`, the specials."""
  from core.data.tokenizers import bytes_to_unicode

  folder.mkdir()
  chars = list(bytes_to_unicode().values())
  vocab = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
  (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
  (folder / "merges.txt").write_text("#version: 0.2\n")
  return {
    "tokenizer_vocab": str(folder / "vocab.json"),
    "tokenizer_merges": str(folder / "merges.txt"),
  }


def tiny_paper_config(files):
  config = lightctrl_config.get_config("paper")
  config.data.update(frames=2, size=16, max_objects=1, light_radius=3.0, light_height=8.0)
  config.pipeline.update(num_steps=2, relight_steps=2)
  config.evaluation.update(num_clips=6, arms=("per_frame", "per_frame_sdedit_0.2", "lightctrl"))
  config.paper.update(files)
  return config


@pytest.mark.slow
def test_paper_variant_runs_the_arms_on_tiny_sd15_networks(tmp_path):
  from methods.lightctrl import paper

  files = write_tiny_paper_files(tmp_path)
  config = tiny_paper_config(files)
  lightctrl.validate(config)
  weights = paper.load_weights(config)
  assert weights["relighter"]["params"]["conv_in"]["kernel"].shape == (3, 3, 8, 32)
  assert "down_blocks_0_motion_modules_0" in weights["video"]["params"]
  assert weights["text"]["relight"].shape == (3, 77, 32)
  videos, clips = pipeline.run_arms(config, weights, jax.random.key(0))
  for arm, video in videos.items():
    chex.assert_shape(video, clips["source"].shape)
    assert np.all(np.isfinite(video)) and video.min() >= 0 and video.max() <= 1, arm
  # the arms differ: the relighter and the video prior both act
  assert np.abs(videos["lightctrl"] - videos["per_frame"]).max() > 1e-3
  # through the loop: one phase, no training, an empty state
  summary = loop.run(config, str(tmp_path / "run"))
  assert summary.step_traces == {"relight": 0}
  for key in ("psnr", "light_following", "flicker", "per_frame/psnr"):
    assert math.isfinite(summary.results[key]), key
  assert (tmp_path / "run" / "relit_frames.png").exists()
  assert (tmp_path / "run" / "relit_clips" / "lightctrl.gif").exists()
  # a missing file is named, and so is a checkpoint that does not fit
  with pytest.raises(loop.ConfigError, match="config.paper.motion_checkpoint:"):
    lightctrl.validate(tiny_paper_config({**files, "motion_checkpoint": ""}))
  with pytest.raises(loop.ConfigError, match="config.paper.iclight_checkpoint: .*conv_in.weight"):
    paper.load_weights(tiny_paper_config({**files, "iclight_checkpoint": files["unet_checkpoint"]}))


def test_clip_gifs_hold_the_figure_clip_of_every_arm():
  config = tiny_config()
  config.evaluation.figure_clip = 1
  shape = (2, config.data.frames, config.data.size, config.data.size, 3)
  videos = {"per_frame": np.full(shape, 0.25), "lightctrl": np.full(shape, 1.5)}
  videos["lightctrl"][1] = 0.75
  clips = pipeline.clip_gifs(config, videos)
  assert set(clips.clips) == {"per_frame", "lightctrl"} and clips.scale * config.data.size >= 128
  chex.assert_shape(clips.clips["lightctrl"], shape[1:])
  np.testing.assert_allclose(clips.clips["lightctrl"], 0.75)
