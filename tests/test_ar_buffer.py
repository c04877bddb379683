"""The AR buffer: the attention rules as masks, the one-pass joint density against the sequential
conditionals, cached decoding against recomputation, the re-encoding baseline, the GP oracle, a
smoke run through the loop, validation and the study report."""

import importlib
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import ar_buffer as ar_config
from core import neural_process as tnp
from core.data import gp_tasks, sawtooth
from experiments import loop
from methods import ar_buffer
from methods.base import ConfigError

phases_lib = importlib.import_module("methods.ar_buffer.phases")
N, M = 6, 5  # context points, joint targets
# Jitted once per test session: eager flax calls dispatch (and compile) every primitive alone.
joint_log_density = jax.jit(tnp.joint_log_density, static_argnums=(0, 6))
target_log_density = jax.jit(tnp.target_log_density, static_argnums=(0,))
marginal_log_density = jax.jit(tnp.marginal_log_density, static_argnums=(0,))
reencode_log_density = jax.jit(tnp.reencode_log_density, static_argnums=(0,))
cached_joint_log_density = jax.jit(tnp.cached_joint_log_density, static_argnums=(0,))
sample_joint = jax.jit(tnp.sample_joint, static_argnums=(0, 6))
sample_reencode = jax.jit(tnp.sample_reencode, static_argnums=(0,))
sample_reencode_unpadded = jax.jit(tnp.sample_reencode_unpadded, static_argnums=(0,))
decode_step = jax.jit(tnp.decode_step, static_argnums=(0,))


def tiny_model(**kwargs):
  return tnp.BufferTNP(width=16, depth=2, num_heads=2, mlp_hidden=32, max_buffer=M, **kwargs)


@pytest.fixture(scope="module")
def setup():
  """A tiny model with perturbed (non-trivial) parameters and 3 GP tasks."""
  model = tiny_model()
  tasks = gp_tasks.sample_tasks(jax.random.key(0), 3, N + M)
  x, y = tasks["x"], tasks["y"]
  data = (x[:, :N], y[:, :N], x[:, N:], y[:, N:])

  @jax.jit  # one program, not one eager dispatch (and compile) per initialiser and leaf
  def perturbed_params(data):
    params = model.init(jax.random.key(1), *tnp.layout(*data[:2], data[2], data[3], data[2]), None)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    return jax.tree.unflatten(
      tree, [p + 0.1 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    )

  return model, perturbed_params(data), data, tasks


def test_structured_mask_follows_the_attention_rules():
  """R1: context sees valid context only; R2: buffer j sees context and buffer i < j; R3: target m
  sees context and buffer i < v_m; nobody sees targets or padding context."""
  valid = jnp.asarray([[True, True, False]])
  mask = np.asarray(tnp.structured_mask(valid, 3, jnp.asarray([[0, 2]])))[0, 0]
  ctx, buf, tgt = slice(0, 3), slice(3, 6), slice(6, 8)
  assert mask.shape == (8, 8)
  np.testing.assert_array_equal(mask[:, ctx], np.tile([True, True, False], (8, 1)))
  assert not mask[ctx, buf].any() and not mask[:, tgt].any()
  np.testing.assert_array_equal(mask[buf, buf], np.tril(np.ones((3, 3), bool), -1))
  np.testing.assert_array_equal(mask[tgt, buf], [[False, False, False], [True, True, False]])


def test_training_visible_is_half_set_mode_half_buffer_prefixes():
  visible = np.asarray(tnp.training_visible(jax.random.key(0), 64, 10, 4))
  assert visible.shape == (64, 10) and visible.dtype == np.int32
  assert (visible[:, :5] == 0).all() and visible[:, 5:].min() >= 1 and visible[:, 5:].max() == 4


@pytest.mark.slow
def test_one_pass_joint_density_equals_the_sum_of_sequential_conditionals(setup):
  """One dense pass of [C, B_1..B_M, T_1..T_M] == M separate passes, target k seeing buffer < k ==
  the KV-cached decode loop == the one pass over the cached context (kernel masks from indices)."""
  model, params, (xc, yc, xt, yt), _ = setup
  one_pass = joint_log_density(model, params, xc, yc, xt, yt, M)
  separate = sum(
    target_log_density(
      model, params, xc, yc, xt, yt, xt[:, k : k + 1], yt[:, k : k + 1], jnp.full((3, 1), k)
    )[:, 0]
    for k in range(M)
  )
  chex.assert_trees_all_close(one_pass, separate, atol=1e-4, rtol=1e-5)
  for implementation in ("xla", "pallas"):
    shared = model.clone(shared_attention_implementation=implementation)
    cached = jnp.stack(
      [
        cached_joint_log_density(shared, params, xc[i], yc[i], xt[i : i + 1], yt[i : i + 1])[0]
        for i in range(3)
      ]
    )
    chex.assert_trees_all_close(cached, one_pass, atol=1e-4, rtol=1e-5)
  context = tnp.encode_context(model, params, xc[:1], yc[:1])
  cache = tnp.init_cache(tnp._backbone(model), 1, M)
  total = 0.0
  for k in range(M):
    prev = max(k - 1, 0)
    predictive, cache = decode_step(
      model, params, context, cache, xt[:1, prev, None], yt[:1, prev], xt[:1, k, None], jnp.int32(k)
    )
    total += predictive.log_density(yt[:1, k])[0]
  assert float(total) == pytest.approx(float(one_pass[0]), abs=1e-4)


def test_buffer_of_one_is_re_encoding(setup):
  """K = 1 (blocks of one target, each appended to the context after it is scored) == the scanned
  TNP-D-AR density (one padded set-mode pass per target)."""
  model, params, (xc, yc, xt, yt), _ = setup
  blocks_of_one = joint_log_density(model, params, xc, yc, xt, yt, 1)
  scanned = reencode_log_density(model, params, xc, yc, xt, yt)
  chex.assert_trees_all_close(blocks_of_one, scanned, atol=1e-4, rtol=1e-5)


def test_cached_sampling_equals_recomputation(setup, buffer_size=2):
  """The sampler's log densities of its own draws (cached context, per-stream buffer caches, and
  per-stream re-encoding every K) == the dense teacher-forced density of those draws."""
  model, params, (xc, yc, xt, _), _ = setup
  noise = tnp.sampling_noise(jax.random.key(3), 4, M)
  draws, log_p = sample_joint(model, params, xc[0], yc[0], xt[0], noise, buffer_size)
  assert draws.shape == (4, M) and log_p.shape == (4,)
  rows = lambda a: jnp.broadcast_to(a[0], (4,) + a.shape[1:])  # noqa: E731
  dense = joint_log_density(model, params, rows(xc), rows(yc), rows(xt), draws, buffer_size)
  chex.assert_trees_all_close(log_p, dense, atol=1e-4, rtol=1e-5)


def test_buffer_sampler_with_k1_draws_what_re_encoding_draws(setup):
  model, params, (xc, yc, xt, _), _ = setup
  noise = tnp.sampling_noise(jax.random.key(4), 3, 3)
  blocks = sample_joint(model, params, xc[0], yc[0], xt[0, :3], noise, 1)
  reencode = sample_reencode(model, params, xc[0], yc[0], xt[0, :3], noise)
  chex.assert_trees_all_close(blocks, reencode, atol=1e-4, rtol=1e-5)


def test_empty_buffer_is_set_mode_and_buffer_never_reaches_context_or_v0_targets(setup):
  """v = 0 targets with a buffer present == the set-mode pass without one, whatever the buffer
  holds (context states never read the buffer, R1); permuting the context changes nothing."""
  model, params, (xc, yc, xt, yt), _ = setup
  set_mode = marginal_log_density(model, params, xc, yc, xt, yt)
  zero = jnp.zeros((3, M), jnp.int32)
  for shift in (0.0, 3.0):
    with_buffer = target_log_density(model, params, xc, yc, xt, yt + shift, xt, yt, zero)
    chex.assert_trees_all_close(with_buffer.sum(-1), set_mode, atol=1e-4, rtol=1e-5)
  perm = np.random.default_rng(0).permutation(N)
  permuted = joint_log_density(model, params, xc[:, perm], yc[:, perm], xt, yt, M)
  chex.assert_trees_all_close(
    permuted, joint_log_density(model, params, xc, yc, xt, yt, M), atol=1e-4, rtol=1e-5
  )


def test_padded_context_is_invisible(setup):
  model, params, (xc, yc, xt, yt), _ = setup
  padded_x = jnp.concatenate([xc, jnp.full((3, 2), 0.3)], 1)
  padded_y = jnp.concatenate([yc, jnp.full((3, 2), 9.0)], 1)
  valid = jnp.broadcast_to(jnp.arange(N + 2) < N, (3, N + 2))
  padded = joint_log_density(model, params, padded_x, padded_y, xt, yt, M, ctx_valid=valid)
  chex.assert_trees_all_close(
    padded, joint_log_density(model, params, xc, yc, xt, yt, M), atol=1e-4, rtol=1e-5
  )


def test_mixture_head_is_a_normalised_density():
  model = tiny_model(num_components=3)
  x, y, role, slot = tnp.layout(
    jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.zeros((1, 0)), jnp.zeros((1, 0)), jnp.zeros((1, 1))
  )
  params = jax.jit(model.init)(jax.random.key(0), x, y, role, slot, None)
  predictive = jax.jit(model.apply)(params, x, y, role, slot, None).at((0, -1))
  assert predictive.mean.shape == (3,) and float(jnp.max(predictive.std)) <= 2.0 + 1e-3 + 1e-6
  grid = jnp.linspace(-15, 15, 6001)
  mass = jnp.sum(jnp.exp(jax.jit(jax.vmap(predictive.log_density))(grid))) * (grid[1] - grid[0])
  assert float(mass) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_gp_oracle_is_the_gaussian_conditional():
  """`conditional_log_density` == log N(y_all) - log N(y_ctx), padding ignored; the joint of
  correlated targets beats their independent marginals on average."""
  task = gp_tasks.sample_task(jax.random.key(5), 12)
  x, y, scale, kid = task["x"], task["y"], task["lengthscale"], task["kernel"]
  cov = gp_tasks.kernel_matrix(x, x, scale, kid) + (0.05**2 + 1e-5) * jnp.eye(12)
  logpdf = jax.scipy.stats.multivariate_normal.logpdf
  expected = logpdf(y, jnp.zeros(12), cov) - logpdf(y[:8], jnp.zeros(8), cov[:8, :8])
  conditional = jax.jit(gp_tasks.conditional_log_density)
  got = conditional(x[:8], y[:8], x[8:], y[8:], scale, kid)
  assert float(got) == pytest.approx(float(expected), abs=2e-3)
  padded = conditional(
    jnp.append(x[:8], 0.0),
    jnp.append(y[:8], 5.0),
    x[8:],
    y[8:],
    scale,
    kid,
    ctx_valid=jnp.arange(9) < 8,
  )
  assert float(padded) == pytest.approx(float(got), abs=1e-4)
  tasks = gp_tasks.sample_tasks(jax.random.key(6), 64, 12, gp_tasks.GPPrior(kernels=("rbf",)))
  split = lambda t: (t["x"][:4], t["y"][:4], t["x"][4:], t["y"][4:], t["lengthscale"], t["kernel"])  # noqa: E731
  joint = jax.jit(jax.vmap(lambda t: gp_tasks.conditional_log_density(*split(t))))(tasks)
  marginal = jax.jit(jax.vmap(lambda t: gp_tasks.marginal_log_density(*split(t))))(tasks)
  assert float(jnp.mean(joint - marginal)) > 0.5


def tiny_config():
  config = ar_config.get_config()
  config.model.update(width=16, depth=1, num_heads=2, mlp_hidden=16, embed_hidden=16, max_buffer=4)
  config.data.update(max_context=6, num_targets=4)
  config.batch_size = 8
  config.steps = 4
  config.eval.update(num_tasks=8, num_context=4, num_targets=4, num_orders=2, buffer_sizes=())
  config.eval.num_plot_samples = 2
  # one context size: the per-N columns and the ratios are the same code at any count of sizes
  config.benchmark.update(context_sizes=(4,), num_samples=2, num_targets=4, repeats=1)
  config.loop.update(log_every=2, checkpoint_every=100)  # checkpoints at the start and the end
  return config


def test_tiny_config_runs_through_the_loop(tmp_path):
  """Every phase of the default config at `tiny_config`'s sizes (the default itself trains for
  minutes)."""
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  for key in ("ll_buffer", "ll_reencode", "ll_marginal", "ll_oracle", "sampling_speedup"):
    assert math.isfinite(results[key]), key
  assert summary.step_traces == {"train": 1, "benchmark": 0}
  assert results["ll_reencode"] == pytest.approx(results["ll_reencode_k1"])
  assert len(results["sampling_time_buffer_s"]) == 1 and results["memory_ratio"] > 0
  assert len(results["sampling_time_reencode_unpadded_s"]) == 1
  assert np.all(np.asarray(results["reencode_tokens_padded"]) == [4 * 8])  # M (N + M)
  assert np.all(np.asarray(results["reencode_tokens_unpadded"]) == [4 * 4 + 10])  # M N + M(M+1)/2
  assert os.path.exists(tmp_path / "joint_samples.png")


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_results(tmp_path):
  config = tiny_config()
  config.benchmark.context_sizes = ()
  whole = loop.run(config, str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted):
    loop.run(config, str(tmp_path / "cut"), should_stop=lambda phase, step: step == 2)
  resumed = loop.run(config, str(tmp_path / "cut")).results
  for key in ("ll_buffer", "ll_reencode", "ll_marginal"):
    assert resumed[key] == pytest.approx(whole[key], rel=1e-5)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("data.min_context", 99, "config.data.min_context: must not exceed"),
    ("model.num_heads", 3, "config.model.num_heads: must divide"),
    ("model.shared_attention", "triton", "config.model.shared_attention: must be one of"),
    ("eval.buffer_sizes", (0,), "config.eval.buffer_sizes: must be positive ints"),
    ("data.kernels", ("periodic",), "config.data.kernels: must be a non-empty subset"),
    ("data.task", "square", "config.data.task: must be one of"),
    ("data.frequency_min", 9.0, "config.data.frequency_min: need 0 <"),
  ],
)
def test_bad_fields_are_named(field, value, message):
  config = ar_config.get_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=message):
    ar_buffer.validate(config)


def test_study_arms_and_report():
  config = ar_config.get_config("study")
  arms = ar_buffer.study_arms(config)
  names = [name for name, _ in arms]
  assert names == [f"{t}_seed{s}" for t in ("gp", "sawtooth") for s in (0, 1, 2)]
  assert arms[0][1].benchmark.context_sizes == (64, 256) and arms[0][1].data.task == "gp"
  assert arms[1][1].benchmark.context_sizes == () and arms[3][1].data.task == "sawtooth"
  arm = {
    **{
      f"ll_{k}": v
      for k, v in dict(
        marginal=0.1,
        reencode=0.6,
        buffer=0.58,
        buffer_k4=0.59,
        buffer_sorted=0.5,
        reencode_sorted=0.55,
        oracle=0.9,
        oracle_marginal=0.3,
      ).items()
    },
    "gap_reencode_minus_buffer": 0.02,
    "gain_buffer_over_marginal": 0.48,
    "lengthscale_bin_centers": [0.3, 0.5, 0.7],
    **{
      f"ll_{k}_by_lengthscale": [0.1, 0.2, 0.3]
      for k in ("marginal", "reencode", "buffer", "oracle")
    },
  }
  bench = {
    "context_sizes": [64, 256],
    "sampling_time_buffer_s": [0.1, 0.2],
    "sampling_time_reencode_s": [1.0, 4.0],
    "sampling_time_reencode_unpadded_s": [0.8, 3.8],
    "sampling_speedup_by_context": [10.0, 20.0],
    "sampling_speedup": 20.0,
    "sampling_speedup_unpadded_by_context": [8.0, 19.0],
    "sampling_speedup_unpadded": 19.0,
    "padded_over_unpadded_time_by_context": [1.25, 1.05],
    "reencode_tokens_padded": [1280.0, 4352.0],
    "reencode_tokens_unpadded": [1160.0, 4232.0],
    "peak_bytes_buffer": [1e6, 2e6],
    "peak_bytes_reencode": [1e7, 1e8],
    "peak_bytes_reencode_unpadded": [0.9e7, 0.9e8],
    "memory_ratio_by_context": [10.0, 50.0],
    "memory_ratio_unpadded_by_context": [9.0, 45.0],
    "memory_ratio_linear_model": [20.0, 25.0],
    "ablation_buffer_sizes": [1, 4, 16],
    "sampling_time_by_buffer_size_s": [4.0, 1.0, 0.2],
  }
  saw = {k: v for k, v in arm.items() if "oracle" not in k and "lengthscale" not in k}
  saw["ll_oracle_known_parameters"] = 2.0
  results = {"gp_seed0": {**arm, **bench}, "gp_seed1": arm, "gp_seed2": arm}
  results.update(
    {f"sawtooth_seed{s}": dict(saw, gap_reencode_minus_buffer=0.1 * s) for s in range(3)}
  )
  report = ar_buffer.report(config, results)
  summary = report.summary
  assert summary["gp_buffer_close_to_reencode"] and summary["gp_buffer_well_above_marginal"]
  assert summary["speedup_grows_with_n"] and summary["sampling_speedup_unpadded_n256"] == 19.0
  assert summary["sawtooth_gap_reencode_minus_buffer"].startswith("0.100 ± 0.24")  # t over 3 seeds
  assert len(report.rows) == 8 + 7 and "ar_buffer_study" in report.figures
  assert (
    "re-encode unpadded s" in report.notes and "median of 3 runs of every sampler" in report.notes
  )


def test_unpadded_re_encoding_draws_what_padded_re_encoding_draws(setup):
  model, params, (x_ctx, y_ctx, x_tgt, _), _ = setup
  noise = tnp.sampling_noise(jax.random.key(3), 4, M)
  padded = sample_reencode(model, params, x_ctx[0], y_ctx[0], x_tgt[0], noise)
  unpadded = sample_reencode_unpadded(model, params, x_ctx[0], y_ctx[0], x_tgt[0], noise)
  chex.assert_trees_all_close(unpadded, padded, atol=1e-4)
  assert float(jnp.std(unpadded[0])) > 0  # streams differ: the draws are not all the mean
  tokens = phases_lib.reencode_tokens_per_stream(N, M)
  assert tokens == {"padded": M * (N + M), "unpadded": sum(N + k for k in range(1, M + 1))}


def test_sawtooth_tasks_are_periodic_noisy_teeth():
  prior = sawtooth.SawtoothPrior(frequency_min=1.5, frequency_max=2.5, amplitude_min=0.5)

  @jax.jit  # one program, not one eager dispatch (and compile) per primitive
  def draw():
    tasks = sawtooth.sample_tasks(jax.random.key(0), 64, 40, prior)
    params = [tasks[k] for k in ("frequency", "direction", "phase", "amplitude")]
    period = (1.0 / params[0])[:, None]
    teeth = lambda x: jax.vmap(sawtooth.sawtooth)(x, *params)  # noqa: E731
    f = teeth(tasks["x"])
    one = sawtooth.known_parameter_log_density(
      tasks["x"][0], f[0] + 0.1, *(p[0] for p in params), prior
    )
    return tasks, params, f, teeth(tasks["x"] + period), teeth(tasks["x"] + 0.5 * period), one

  tasks, params, f, shifted, half, one = draw()
  chex.assert_shape([tasks["x"], tasks["y"]], (64, 40))
  chex.assert_shape(tasks["frequency"], (64,))
  assert set(np.unique(np.asarray(params[1]))) == {-1.0, 1.0}
  assert float(params[0].min()) >= 1.5 and float(params[0].max()) <= 2.5
  chex.assert_trees_all_close(shifted, f, atol=1e-4)  # f(x + 1 / omega) = f(x)
  assert float(jnp.mean(jnp.abs(half - f))) > 0.1  # and not with half the period
  assert float(f.min()) >= 0.0 and bool(jnp.all(f <= params[3][:, None] + 1e-6))
  residual = np.asarray(tasks["y"] - f)
  assert np.std(residual) == pytest.approx(prior.noise_std, rel=0.05)
  expected = 40 * (-0.5 * 2.0**2 - math.log(0.05) - 0.5 * math.log(2 * math.pi))
  assert float(one) == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_sawtooth_task_runs_through_the_loop(tmp_path):
  config = tiny_config()
  config.data.task = "sawtooth"
  config.benchmark.context_sizes = ()
  results = loop.run(config, str(tmp_path)).results
  for key in ("ll_buffer", "ll_reencode", "ll_marginal", "ll_oracle_known_parameters"):
    assert math.isfinite(results[key]), key
  assert "ll_oracle" not in results and "ll_buffer_by_lengthscale" not in results
  assert results["ll_oracle_known_parameters"] > results["ll_reencode"]  # the bound bounds
  assert os.path.exists(tmp_path / "joint_samples.png")
