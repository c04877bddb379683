"""BWCache: the video DiT, the moving-shape data, rectified flow, DDPM/DDIM and the caching rules."""

import importlib
import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bwcache as bwcache_config
from core import block_cache, diffusion
from core.data import videos
from core.nn.dit import VideoDiT
from experiments import loop
from methods import bwcache
from methods.bwcache import study as bw_study

bw_phases = importlib.import_module("methods.bwcache.phases")  # `bwcache.phases` is the function

T = 12


def tiny_config():
  config = bwcache_config.get_config()
  config.data.update(frames=4, size=8)
  config.model.update(hidden=24, depth=2, heads=2, mlp_ratio=2)
  config.batch_size = 4
  config.steps = 2
  config.cache.update(num_steps=T, num_videos=2, timing_repeats=1, reuse=2)
  config.loop.update(log_every=1, checkpoint_every=2)
  return config


@pytest.fixture(scope="module")
def model_and_params():
  config = tiny_config()

  @jax.jit  # one compiled program instead of an op-by-op init
  def init():
    params = bwcache.dit(config).init(jax.random.key(0), jnp.zeros((1, 4, 8, 8, 1)), jnp.zeros(1))
    # make the blocks non-trivial (AdaLN-Zero starts every block as the identity)
    return jax.tree.map(
      lambda p: p + 0.05 * jax.random.normal(jax.random.key(p.size), p.shape), params
    )

  params = init()
  x = jax.random.normal(jax.random.key(1), (2, 4, 8, 8, 1))
  return config, bwcache.blockwise(config), params, x


def _sample(model, params, x, policy):
  ts = diffusion.rf_time_grid(T)
  return jax.jit(
    lambda p, x: block_cache.cached_sample(model, p, x, diffusion.euler_sampler(ts), policy)
  )(params, x)


def test_moving_shapes_are_deterministic_bounded_and_moving():
  a = videos.video_batch(3, 7, 4)
  np.testing.assert_array_equal(a, videos.video_batch(3, 7, 4))
  assert a.shape == (4, 8, 16, 16, 1) and a.dtype == np.float32
  assert a.min() == -1.0 and a.max() <= 1.0
  assert np.any(a[:, 0] != a[:, -1])
  stream = videos.video_stream(0, 8, frames=4, size=8)
  np.testing.assert_array_equal(
    np.concatenate([stream.batch(2, p, 2)["video"] for p in range(2)]), stream.batch(2)["video"]
  )


def test_dit_shapes_patching_and_errors():
  for attention in ("full", "alternating"):
    net = VideoDiT((4, 8, 8, 1), (2, 4, 4), hidden=24, depth=2, heads=2, attention=attention)
    x = jax.random.normal(jax.random.key(0), (3, 4, 8, 8, 1))
    params = jax.jit(net.init)(jax.random.key(1), x, jnp.zeros((3,)))
    out = jax.jit(net.apply)(params, x, jnp.full((3,), 0.5))
    chex.assert_shape(out, x.shape)
    chex.assert_type(out, jnp.float32)
    tokens = net.apply(params, x, method=VideoDiT.patchify)
    chex.assert_shape(tokens, (3, 2 * 2 * 2, 2 * 4 * 4))
    np.testing.assert_array_equal(net.apply(params, tokens, method=VideoDiT.unpatchify), x)
  with pytest.raises(ValueError, match="expected x"):
    net.apply(params, jnp.zeros((3, 4, 8, 9, 1)), jnp.zeros((3,)))


def test_rectified_flow_pieces():
  x0, eps = jnp.ones((2, 3)), jnp.zeros((2, 3))
  np.testing.assert_array_equal(diffusion.rf_interpolate(x0, eps, jnp.zeros(2)), x0)
  np.testing.assert_array_equal(diffusion.rf_interpolate(x0, eps, jnp.ones(2)), eps)
  ts = diffusion.rf_time_grid(7)
  assert ts[0] == 1.0 and ts[-1] == 0.0
  # the exact velocity field of a straight path is integrated exactly by Euler
  out = diffusion.sample(
    lambda x, t: diffusion.rf_velocity_target(x0, eps), eps, diffusion.euler_sampler(ts)
  )
  np.testing.assert_allclose(out, x0, atol=1e-6)


def test_linear_schedule_and_ddim_grids():
  alpha_bars = diffusion.linear_alpha_bars()
  chex.assert_shape(alpha_bars, (1000,))
  # the end points of the DDPM linear schedule (Ho et al. 2020): 1 - 1e-4 and about 4.04e-5
  np.testing.assert_allclose([alpha_bars[0], alpha_bars[-1]], [1 - 1e-4, 4.036e-5], rtol=1e-3)
  np.testing.assert_array_equal(
    diffusion.alpha_bar_at(alpha_bars, jnp.array([-1.0, 0.0])), [1.0, alpha_bars[0]]
  )
  grids = {s: np.asarray(diffusion.ddim_time_grid(50, 1000, s)) for s in diffusion.DDIM_SPACINGS}
  for grid in grids.values():
    assert grid.shape == (51,) and grid[-1] == -1 and np.all(np.diff(grid) < 0)
  assert grids["linspace"][0] == 999 and grids["linspace"][-2] == 0
  assert grids["leading"][0] == 980 and grids["leading"][-2] == 0
  assert grids["trailing"][0] == 999 and grids["trailing"][-2] == 19
  with pytest.raises(ValueError, match="spacing"):
    diffusion.ddim_time_grid(5, 1000, "uniform")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ddim_step_shapes_and_dtypes(dtype):
  x = jax.random.normal(jax.random.key(0), (3, 4, 8, 8, 1), dtype)
  eps = jax.random.normal(jax.random.key(1), x.shape, dtype)
  for abar, abar_next in ((jnp.float32(0.3), jnp.float32(0.6)), (jnp.full(3, 0.3), jnp.ones(3))):
    out = diffusion.ddim_step(x, eps, abar, abar_next)
    chex.assert_shape(out, x.shape)
    chex.assert_type(out, dtype)
  # to abar = 1 the step returns the clean estimate
  np.testing.assert_allclose(
    diffusion.ddim_step(x.astype(jnp.float32), eps.astype(jnp.float32), 0.3, 1.0),
    diffusion.ddim_x0(x.astype(jnp.float32), eps.astype(jnp.float32), 0.3),
    rtol=1e-6,
  )


@pytest.mark.parametrize("spacing", diffusion.DDIM_SPACINGS)
def test_ddim_with_the_exact_eps_recovers_a_point_mass(spacing):
  """For data = x0 always, the optimal eps-predictor is `(x_n - sqrt(abar_n) x0) / sqrt(1 - abar_n)`;
  every DDIM step then lands on the same trajectory and the last one returns x0 from any noise."""
  alpha_bars = diffusion.linear_alpha_bars()
  x0 = jax.random.uniform(jax.random.key(0), (1, 3, 4), minval=-1, maxval=1)

  def eps_fn(x, n):
    abar = diffusion.broadcast_time(diffusion.alpha_bar_at(alpha_bars, n), x)
    return (x - jnp.sqrt(abar) * x0) / jnp.sqrt(1.0 - abar)

  sampler = diffusion.ddim_sampler(diffusion.ddim_time_grid(10, 1000, spacing), alpha_bars)
  noise = jax.random.normal(jax.random.key(1), (5, 3, 4))
  out = jax.jit(lambda x: diffusion.sample(eps_fn, x, sampler))(noise)
  np.testing.assert_allclose(out, jnp.broadcast_to(x0, out.shape), atol=1e-4)


def test_ddim_clip_is_inert_inside_the_range_and_bounds_a_bad_eps():
  alpha_bars = diffusion.linear_alpha_bars()
  x0 = jax.random.uniform(jax.random.key(0), (2, 3, 4), minval=-0.9, maxval=0.9)
  eps = jax.random.normal(jax.random.key(1), x0.shape)
  abar, abar_next = diffusion.alpha_bar_at(alpha_bars, 999), diffusion.alpha_bar_at(alpha_bars, 965)
  x = diffusion.ddpm_perturb(x0, eps, abar)
  exact = diffusion.ddim_step(x, eps, abar, abar_next)
  np.testing.assert_allclose(diffusion.ddim_step(x, eps, abar, abar_next, 1.0), exact, atol=1e-4)
  wrong_eps = eps + 0.5  # x0_hat off by 0.5 / sqrt(abar) ~ 80
  free = diffusion.ddim_step(x, wrong_eps, abar, abar_next)
  clipped = diffusion.ddim_step(x, wrong_eps, abar, abar_next, 1.0)
  assert float(jnp.max(jnp.abs(diffusion.ddim_x0(clipped, eps, abar_next)))) < 5.0
  assert float(jnp.max(jnp.abs(free - exact))) > 10 * float(jnp.max(jnp.abs(clipped - exact)))


@pytest.mark.slow
def test_delta_zero_is_the_uncached_sampler_under_ddim(model_and_params):
  _, _, params, x = model_and_params
  config = tiny_config()
  config.diffusion.kind, config.cache.sampler = "ddpm", "ddim"
  model, sampler = bwcache.blockwise(config), bwcache.sampler(config, T)
  run = jax.jit(
    lambda p, x, policy: block_cache.cached_sample(model, p, x, sampler, policy), static_argnums=2
  )
  never, trace = run(params, x, block_cache.CachePolicy(kind="bwcache", delta=0.0, reuse_steps=3))
  uncached, _ = run(params, x, block_cache.CachePolicy(kind="none"))
  assert bool(np.all(trace["computed"]))
  # DDIM's first step divides by sqrt(abar_999) ~ 0.006, so the random model's samples reach ~100:
  # float rounding of the two compiled programs is compared relative to that scale
  np.testing.assert_allclose(never, uncached, rtol=1e-5, atol=1e-5)
  net = bwcache.dit(config)
  plain = diffusion.sample(lambda x, t: net.apply(params, x, t), x, sampler)
  np.testing.assert_allclose(never, plain, rtol=1e-5, atol=1e-4)
  # caching does skip steps under DDIM too
  _, reused = run(params, x, block_cache.CachePolicy(kind="bwcache", delta=math.inf, reuse_steps=2))
  assert not np.all(reused["computed"])


def test_delta_zero_is_the_uncached_sampler(model_and_params):
  config, model, params, x = model_and_params
  never, trace = _sample(
    model, params, x, block_cache.CachePolicy(kind="bwcache", delta=0.0, reuse_steps=3)
  )
  uncached, _ = _sample(model, params, x, block_cache.CachePolicy(kind="none"))
  assert bool(np.all(trace["computed"]))
  # the same arithmetic in two compiled programs: equal up to float rounding of fused kernels
  np.testing.assert_allclose(never, uncached, rtol=0, atol=1e-6)
  net, ts = bwcache.dit(config), diffusion.rf_time_grid(T)
  plain = diffusion.sample(lambda x, t: net.apply(params, x, t), x, diffusion.euler_sampler(ts))
  np.testing.assert_allclose(never, plain, atol=1e-5)


@pytest.mark.parametrize("reuse", [1, 2, 4])
def test_delta_inf_follows_the_r_schedule(model_and_params, reuse):
  _, model, params, x = model_and_params
  policy = block_cache.CachePolicy(
    kind="bwcache", delta=math.inf, reuse_steps=reuse, protect_tail=False
  )
  _, trace = _sample(model, params, x, policy)
  expected = [j in (0, 1) or (j - 1) % (reuse + 1) == 0 for j in range(T)]
  np.testing.assert_array_equal(trace["computed"], expected)


@pytest.mark.parametrize("delta", [math.inf, 0.5, 0.1])
def test_no_reuse_in_the_protected_tail(model_and_params, delta):
  _, model, params, x = model_and_params
  _, trace = _sample(
    model, params, x, block_cache.CachePolicy(kind="bwcache", delta=delta, reuse_steps=2)
  )
  computed = np.asarray(trace["computed"])
  reused = np.flatnonzero(~computed)
  if reused.size:
    first_trigger = reused[0] - 1
    limit = first_trigger + (T - first_trigger) // 2
    assert computed[limit:].all()
  if delta == math.inf:
    assert reused.size > 0 and reused[0] == 2


def _synthetic_model(depth: int = 2) -> block_cache.BlockwiseModel:
  """Block outputs set by a table of per-step features (`params`, one value per step): every block
  outputs `params[j]` at step j, so the indicator between steps a and b is |v_a - v_b| / |v_b|."""

  def embed(params, x, t):
    return jnp.ones((x.shape[0], 1, 1)), params[t[0].astype(jnp.int32)]

  def run_blocks(params, h0, c):
    outputs = jnp.broadcast_to(c, (depth, *h0.shape))
    return outputs[-1], outputs

  return block_cache.BlockwiseModel(
    embed=embed,
    run_blocks=run_blocks,
    head=lambda params, h, c: jnp.zeros((h.shape[0], 1)),
    modulation=lambda params, h0, c: h0,
    depth=depth,
  )


def _synthetic_trace(features, **policy):
  """The trace of the BWCache rule on a feature table; the sampler's time is the step index."""
  steps = len(features)
  sampler = diffusion.Sampler(
    times=jnp.arange(steps + 1, dtype=jnp.float32), step=lambda x, out, t, t_next: x + out
  )
  policy = block_cache.CachePolicy(kind="bwcache", **policy)
  _, trace = block_cache.cached_sample(
    _synthetic_model(), jnp.asarray(features, jnp.float32), jnp.zeros((2, 1)), sampler, policy
  )
  return np.asarray(trace["computed"]), np.asarray(trace["indicator"])


def _reused(computed) -> list[int]:
  return np.flatnonzero(~computed).tolist()


CONSTANT = np.ones(T)  # indicator 0 at every comparable step: reuse at every chance


@pytest.mark.parametrize("warmup", [0, 5])
def test_warmup_means_no_reuse_before_step_w(warmup):
  computed, _ = _synthetic_trace(
    CONSTANT, delta=0.5, reuse_steps=2, protect_tail=False, warmup=warmup
  )
  first = max(warmup, 2)  # step 0 has no indicator, step 1 is the earliest trigger
  assert computed[:first].all() and not computed[first]
  expected = [j for j in range(first, T) if (j - first) % 3 != 2]
  assert _reused(computed) == expected


@pytest.mark.parametrize(
  "tail_of, fraction, reused",
  [
    # first trigger at k = 3 (warm-up 4): the last ceil(0.5 * 9) = 5 steps are computed
    ("remaining", 0.5, [4, 6]),
    ("remaining", 0.25, [4, 6, 8]),  # ceil(0.25 * 9) = 3 protected
    ("all", 0.5, [4]),  # the last 6 of all 12 steps
    ("all", 0.25, [4, 6, 8]),  # the last 3
    # re-fixed at every trigger: after k = 5 the tail is ceil(3.5) = 4 steps, after 7 ceil(2.5) = 3,
    # after 9 ceil(1.5) = 2, so step 10 can no longer reuse
    ("each_trigger", 0.5, [4, 6, 8]),
  ],
)
def test_protected_tail_readings(tail_of, fraction, reused):
  policy = dict(tail_of=tail_of, tail_fraction=fraction, warmup=4)
  computed, _ = _synthetic_trace(CONSTANT, delta=0.5, reuse_steps=1, **policy)
  assert _reused(computed) == reused
  tail = block_cache.protected_tail_start(computed, block_cache.CachePolicy(**policy))
  assert computed[tail:].all() and tail > max(reused)


def test_indicator_reference_adjacent_needs_a_computed_predecessor():
  last, last_indicator = _synthetic_trace(CONSTANT, delta=0.5, reuse_steps=1, protect_tail=False)
  adjacent, adjacent_indicator = _synthetic_trace(
    CONSTANT, delta=0.5, reuse_steps=1, protect_tail=False, indicator_reference="adjacent"
  )
  # against the last computed step the step after a reuse may trigger again at once; against the
  # adjacent step it has no indicator, so each reuse is followed by two computed steps
  assert _reused(last) == [2, 4, 6, 8, 10]
  assert _reused(adjacent) == [2, 5, 8, 11]
  assert np.isfinite(last_indicator[[1, 3, 5]]).all()
  assert np.isnan(adjacent_indicator[[0, 2, 3, 5, 6]]).all()
  assert np.isfinite(adjacent_indicator[[1, 4, 7]]).all()


def test_indicator_reference_changes_what_a_drift_is_compared_with():
  # features grow 8% a step: a change of 0.08 against the adjacent step, 0.1664 across a reused one
  drift = 1.08 ** np.arange(T)
  last, indicator = _synthetic_trace(drift, delta=0.1, reuse_steps=1, protect_tail=False)
  np.testing.assert_allclose(indicator[1], 0.08, rtol=1e-5)
  np.testing.assert_allclose(indicator[3], 1.08**2 - 1, rtol=1e-5)
  assert _reused(last) == [2, 5, 8, 11]  # the step after a reuse sees a two-step change: no trigger


@pytest.mark.parametrize(
  "fields, reused",
  [
    ({}, 10),  # the paper's text: the tail is half of the steps left after the first trigger
    ({"indicator_reference": "adjacent"}, 9),
    ({"tail_of": "all", "tail_fraction": 0.25}, 15),
    ({"tail_of": "each_trigger"}, 19),  # 63%: the only tail reading that passes the paper's 59%
    ({"tail_of": "each_trigger", "warmup": 4}, 18),
    ({"protect_tail": False}, 21),
  ],
)
def test_reuse_cap_of_each_reading_at_30_steps_and_r_3(fields, reused):
  """The most a reading can reuse (indicator below delta at every chance) with the paper's Open-Sora
  setting, 30 steps and R = 3 (10%), against its 59.0% reuse at delta 0.25."""
  computed, _ = _synthetic_trace(np.ones(30), delta=0.25, reuse_steps=3, **fields)
  assert int((~computed).sum()) == reused


def test_bad_reading_fields_are_rejected():
  for field, value in [
    ("tail_of", "half"),
    ("tail_fraction", 1.5),
    ("warmup", -1),
    ("indicator_reference", "previous"),
  ]:
    with pytest.raises(ValueError, match=field):
      block_cache.validate_policy(block_cache.CachePolicy(**{field: value}), T, 3)


def test_indicator_is_the_mean_relative_change_of_the_chosen_blocks(model_and_params):
  _, model, params, x = model_and_params
  _, all_blocks = _sample(model, params, x, block_cache.CachePolicy(kind="none"))
  _, one_block = _sample(
    model, params, x, block_cache.CachePolicy(kind="none", indicator_blocks=(1,))
  )
  change = np.asarray(all_blocks["block_change"])
  assert np.isnan(change[0]).all() and np.all(change[1:] > 0)
  np.testing.assert_allclose(one_block["block_change"][1:, 0], change[1:, 1], rtol=1e-6)
  np.testing.assert_allclose(all_blocks["indicator"][1:], change[1:].mean(axis=1), rtol=1e-6)


def test_schedule_and_teacache_policies(model_and_params):
  _, model, params, x = model_and_params
  schedule = block_cache.fixed_interval_schedule(T)
  _, trace = _sample(model, params, x, block_cache.CachePolicy(kind="schedule", schedule=schedule))
  np.testing.assert_array_equal(~np.asarray(trace["computed"]), schedule)
  _, tea = _sample(
    model, params, x, block_cache.CachePolicy(kind="teacache", teacache_threshold=1e9)
  )
  assert tea["computed"][0] and not np.any(tea["computed"][1:])
  with pytest.raises(ValueError, match="schedule has 3 entries"):
    _sample(model, params, x, block_cache.CachePolicy(kind="schedule", schedule=(True,) * 3))


def test_smoke_run_through_the_loop(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  for key in (
    "speedup_wall",
    "speedup_flops",
    "psnr_vs_uncached",
    "reuse_rate",
    "validation_flow_loss",
  ):
    assert math.isfinite(results[key]), key
  assert results["reuse_in_protected_tail"] == 0
  assert summary.step_traces == {"train": 1, "cache": 0}
  assert (tmp_path / "arl1_curve.png").exists() and (tmp_path / "block_change_heatmap.png").exists()
  report = bwcache.report(
    tiny_config(), {"bwcache": json.loads((tmp_path / "results.json").read_text())}
  )
  assert report.rows[0]["arm"] == "BWCache" and "psnr_and_reuse_vs_delta" in report.figures


@pytest.mark.slow
def test_ddpm_ddim_smoke_run_through_the_loop(tmp_path):
  config = tiny_config()
  config.diffusion.kind, config.cache.sampler = "ddpm", "ddim"
  results = loop.run(config, str(tmp_path)).results
  for key in ("speedup_wall", "psnr_vs_uncached", "reuse_rate", "validation_eps_loss"):
    assert math.isfinite(results[key]), key
  assert results["reuse_in_protected_tail"] == 0
  report = bwcache.report(config, {"bwcache": results})
  assert "validation_eps_loss" in report.summary


def _frontier_results(config, uniform_psnr, arms):
  """Flat results of a study's cache phase: uniform PSNR per step count (interval +-1 dB) and
  BWCache arms `(delta, R, W) -> (computed steps, PSNR)` (interval +-0.5 dB)."""
  r = {
    k: 1.0
    for k in (
      "psnr_vs_uncached reuse_rate speedup_wall speedup_flops step_reduction_psnr "
      "step_reduction_ssim step_reduction_steps reuse_in_protected_tail indicator_overhead "
      "validation_flow_loss fixed_interval_psnr fixed_interval_reuse_rate teacache_psnr "
      "teacache_reuse_rate teacache_speedup_wall"
    ).split()
  }

  def store(prefix, steps, psnr, half):
    r.update(
      {
        f"{prefix}/computed_steps": steps,
        f"{prefix}/psnr": psnr,
        f"{prefix}/psnr_lo": psnr - half,
        f"{prefix}/psnr_hi": psnr + half,
        f"{prefix}/ssim": 0.99,
        f"{prefix}/ssim_lo": 0.98,
        f"{prefix}/ssim_hi": 1.0,
        f"{prefix}/reuse_rate": 1 - steps / config.cache.num_steps,
        f"{prefix}/wall_ratio": steps / config.cache.num_steps,
        f"{prefix}/speedup_flops": config.cache.num_steps / steps,
      }
    )

  for n, psnr in zip(config.cache.frontier_steps, uniform_psnr, strict=True):
    store(f"uniform/steps_{n}", n, psnr, 1.0)
  for (delta, reuse, warmup), (steps, psnr) in arms.items():
    store(bw_phases.grid_key(delta, reuse, warmup), steps, psnr, 0.5)
  return r


def test_report_compares_each_arm_with_the_uniform_envelope_per_region():
  config = tiny_config()
  config.cache.update(
    frontier_steps=(8, 9, 10, 11), deltas=(0.1, 0.2), reuse_steps=(1,), warmups=(0,)
  )
  # uniform is not monotone: 9 steps is worse than 8; the envelope at <= 9 steps is 8's 40 dB
  uniform = (40.0, 35.0, 45.0, 50.0)
  arms = {(0.1, 1, 0): (8.5, 42.0), (0.2, 1, 0): (10.0, 45.2)}
  results = _frontier_results(config, uniform, arms)
  report = bwcache.report(config, {"bwcache": results})
  rows = {(row["arm"], row["delta"]): row for row in report.rows}
  assert rows[("BWCache", 0.1)]["uniform_envelope_db"] == 40.0
  assert rows[("BWCache", 0.1)]["verdict"] == "above"  # 41.5 > 41
  assert rows[("BWCache", 0.2)]["uniform_envelope_db"] == 45.0
  assert rows[("BWCache", 0.2)]["verdict"] == "overlap"
  assert report.summary["heavy/arms_above"] == 1 and report.summary["heavy/arms_overlap"] == 1
  assert report.summary["heavy/best_bwcache_psnr"] == 45.2
  assert "frontier" in report.figures and "psnr_and_reuse_vs_delta" in report.figures
  # at the full step count the reference itself is the envelope: exact, so a cache is below it
  assert (
    bw_study.verdict(
      {"psnr_lo": 60.0, "psnr_hi": 61.0},
      bw_study.envelope(bw_study.uniform_frontier(config, results), config.cache.num_steps),
    )
    == "below"
  )


def test_seed_interval():
  mean, lo, hi = bw_phases.seed_interval([1.0, 2.0, 3.0])
  # t(0.975, 2) = 4.303, standard error 1 / sqrt(3)
  assert mean == 2.0 and hi - mean == pytest.approx(4.303 / math.sqrt(3), rel=1e-3)
  assert bw_phases.seed_interval([5.0]) == (5.0, 5.0, 5.0)


def test_bad_fields_are_named(tmp_path):
  config = tiny_config()
  config.model.patch = (3, 4, 4)
  with pytest.raises(loop.ConfigError, match="config.model.patch"):
    loop.run(config, str(tmp_path))


@pytest.mark.parametrize(
  "overrides, field",
  [
    ({"cache.sampler": "ddim"}, "cache.sampler"),  # DDIM needs the ddpm parameterisation
    ({"diffusion.kind": "ddpm"}, "cache.sampler"),  # ... and ddpm needs DDIM
    ({"diffusion.kind": "flow"}, "diffusion.kind"),
    (
      {"diffusion.kind": "ddpm", "cache.sampler": "ddim", "cache.num_steps": 2000},
      "cache.num_steps",
    ),
    ({"cache.ddim_spacing": "uniform"}, "cache.ddim_spacing"),
    ({"model.positions": "latte"}, "model.attention"),
    ({"model.checkpoint_format": "latte"}, "model.checkpoint"),
    ({"model.checkpoint_format": "pt"}, "model.checkpoint_format"),
    ({"cache.class_label": 0}, "cache.class_label"),
  ],
)
def test_bad_diffusion_and_checkpoint_fields_are_named(overrides, field):
  config = tiny_config()
  for name, value in overrides.items():
    group, key = name.split(".")
    config[group][key] = value
  with pytest.raises(loop.ConfigError, match=f"config.{field}:"):
    bwcache.validate(config)
