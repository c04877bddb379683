"""Mixed precision of the shared networks (`core/nn/precision.py`): bfloat16 compute agrees with float32.

Each network runs the same float32 parameters at both compute dtypes; bfloat16 keeps 8 significant
bits (unit roundoff 2^-9 ~ 0.2%), so a few layers of it stay within `TOLERANCE` relative L2 error of
float32. Parameters and outputs stay float32. QDPM trains in bfloat16 through the loop, and its
training losses track float32's step by step. Compilation is most of these tests' CPU time: the
networks are small, their random keys use the cheap-to-compile "rbg" generator, and every function is
jitted on its own (one program for several compiles slower than the parts).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import quant_diffusion as qdpm_config
from core import block_cache, diffusion
from core.nn import dit, gnn, mlp, precision, ssm
from experiments import loop
from methods import quant_diffusion
from methods.base import ConfigError

TOLERANCE = 3e-2  # relative L2 error of a bfloat16 forward pass against float32
KEY = jax.random.key(0, impl="rbg")


def relative_error(approx, exact) -> float:
  approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
  return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def perturbed(params, scale: float = 0.05):
  """Moves zero-initialised layers (AdaLN-Zero, zero heads) off zero so outputs are not trivially 0."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(KEY, len(leaves))
  moved = [
    p + scale * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys, strict=True)
  ]
  return jax.tree.unflatten(tree, moved)


def assert_bf16_matches_f32(make, *args, perturb=False):
  """`make(dtype)` builds a module; both dtypes must give float32 parameters of the same structure,
  float32 outputs, and bf16 outputs within TOLERANCE of the float32 ones. Returns the parameters."""
  f32, bf16 = make(jnp.float32), make(jnp.bfloat16)
  shapes = jax.eval_shape(bf16.init, KEY, *args)
  assert jax.tree.structure(shapes) == jax.tree.structure(jax.eval_shape(f32.init, KEY, *args))
  assert {leaf.dtype for leaf in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}

  init = lambda key: perturbed(f32.init(key, *args)) if perturb else f32.init(key, *args)  # noqa: E731
  params = jax.jit(init)(KEY)
  exact, approx = jax.jit(f32.apply)(params, *args), jax.jit(bf16.apply)(params, *args)
  for a, e in zip(jax.tree.leaves(approx), jax.tree.leaves(exact), strict=True):
    assert a.dtype == jnp.float32
    assert relative_error(a, e) < TOLERANCE
  return params


def test_compute_dtype_maps_names_and_rejects_others():
  assert precision.compute_dtype("float32") == jnp.float32
  assert precision.compute_dtype("bfloat16") == jnp.bfloat16
  with pytest.raises(ValueError, match="'float16'"):
    precision.compute_dtype("float16")
  config = qdpm_config.get_config()
  config.model.dtype = "float16"
  with pytest.raises(ConfigError, match=r"config\.model\.dtype: must be one of"):
    quant_diffusion.validate(config)


def test_mlps():
  x, t = jax.random.normal(KEY, (8, 40)), jnp.linspace(0.05, 1.0, 8)
  assert_bf16_matches_f32(lambda d: mlp.TimeConditionedMLP(64, 3, 16, dtype=d), x, t, perturb=True)
  assert_bf16_matches_f32(lambda d: mlp.MLP((64, 32), 5, dtype=d), x)


def _dit(dtype):
  shape = (4, 8, 8, 2)
  return dit.VideoDiT(
    shape, (1, 4, 4), 32, 2, 2, attention="alternating", positions="latte", dtype=dtype
  )


@pytest.mark.slow
def test_video_dit_and_its_cached_sampler():
  """The forward pass, then BWCache's sampler (cache and reuse branches of its `lax.cond`) on a bf16
  DiT: the residual stream (what the cache stores) and the sampler's state stay float32, and the
  reuse decisions equal float32's."""
  x, t = jax.random.normal(KEY, (2, 4, 8, 8, 2)), jnp.array([0.3, 0.8])
  params = assert_bf16_matches_f32(_dit, x, t, perturb=True)
  model = dit.blockwise(_dit(jnp.bfloat16))
  h, c = jax.eval_shape(model.embed, params, x, t)
  blocks = jax.eval_shape(model.run_blocks, params, h, c)[1]
  assert h.dtype == c.dtype == blocks.dtype == jnp.float32
  policy = block_cache.CachePolicy("bwcache", delta=1e9, reuse_steps=2)
  sampler = diffusion.euler_sampler(diffusion.rf_time_grid(6))
  runs = [
    jax.jit(
      lambda p, x, dtype=dtype: block_cache.cached_sample(
        dit.blockwise(_dit(dtype)), p, x, sampler, policy
      )
    )(params, x)
    for dtype in (jnp.float32, jnp.bfloat16)
  ]
  (exact, exact_trace), (approx, approx_trace) = runs
  assert approx.dtype == jnp.float32
  np.testing.assert_array_equal(approx_trace["computed"], exact_trace["computed"])
  assert not np.all(approx_trace["computed"])
  assert relative_error(approx, exact) < TOLERANCE


@pytest.mark.parametrize(
  "kind", ["aussm", pytest.param("gru", marks=pytest.mark.slow)]
)  # mamba's float32 Delta is aussm's
def test_state_tracker(kind):
  tokens = jax.random.randint(KEY, (4, 24), 0, 6)
  assert_bf16_matches_f32(
    lambda d: ssm.StateTracker(6, 6, 32, 16, 64, 2, kind, "sequential", dtype=d), tokens
  )


def _graph(num_nodes=40, num_edges=160):
  rng = np.random.default_rng(0)
  senders = jnp.asarray(rng.integers(0, num_nodes, num_edges))
  receivers = jnp.asarray(rng.integers(0, num_nodes, num_edges))
  return jnp.asarray(rng.normal(size=(num_nodes, 12)), jnp.float32), senders, receivers


@pytest.mark.parametrize(
  "kind", [*(pytest.param(k, marks=pytest.mark.slow) for k in ("gcn", "gat", "estimator")), "fgl"]
)
def test_graph_networks(kind):
  x, senders, receivers = _graph()
  n = x.shape[0]
  if kind == "estimator":
    assert_bf16_matches_f32(lambda d: gnn.AttentionEstimator(32, 4, dtype=d), x, senders, receivers)
  elif kind == "fgl":
    chain = jnp.concatenate([jnp.array([-1]), jnp.arange(n - 1)])
    half = jnp.full((2, n), 0.5)
    trees = {"parent": jnp.stack([chain, chain]), "weight_up": half, "weight_down": half}
    attention = jnp.full(senders.shape, 0.3)
    make = lambda d: gnn.FGLStudent(32, 4, implementation="sequential", dtype=d)  # noqa: E731
    assert_bf16_matches_f32(make, x, senders, receivers, attention, trees)
  else:
    make = lambda d: gnn.baseline(kind, 32, 4, 2, 4, 0.5, dtype=d)  # noqa: E731
    assert_bf16_matches_f32(make, x, senders, receivers)


def _tiny_qdpm(dtype: str):
  config = qdpm_config.get_config()
  config.model.update(width=64, depth=2, time_features=8, dtype=dtype)
  config.batch_size = 32
  config.steps = 12
  config.data.num_eval_examples = 16
  config.eval.update(num_u_samples=4, chunk=16, num_samples=4, sampler_steps=4, mc_c_samples=8)
  config.loop.update(log_every=4, checkpoint_every=12)
  return config


@pytest.mark.slow
def test_qdpm_trains_in_bfloat16_through_the_loop(tmp_path):
  """A bf16 run of the loop: finite bound, samples on the grid (Prop. 2 holds in bf16), one trace."""
  summary = loop.run(_tiny_qdpm("bfloat16"), str(tmp_path))
  assert summary.step_traces == {"train": 1}
  assert math.isfinite(summary.results["test_bpd"])
  assert summary.results["on_grid_fraction"] == 1.0


def test_qdpm_bfloat16_steps_track_float32():
  """12 training steps on the same digits batches and rngs at each dtype, in one jitted program:
  every bf16 loss is finite and within 5% of float32's, and parameters, Adam state and EMA stay
  float32."""
  configs = {dtype: _tiny_qdpm(dtype) for dtype in ("float32", "bfloat16")}
  config = configs["float32"]
  train = quant_diffusion.load_splits(config)["train"]
  batches = jnp.asarray(train[: config.steps * config.batch_size]).reshape(config.steps, -1, 64)
  state = quant_diffusion.init_state(config, 64, KEY)

  def losses(config):
    def step(state, inputs):
      batch, index = inputs
      rng = jax.random.fold_in(KEY, index)
      state, metrics = quant_diffusion.train_step(config, state, {"x": batch}, rng)
      return state, metrics["loss"]

    return jax.lax.scan(step, state, (batches, jnp.arange(config.steps)))

  _, exact = jax.jit(lambda: losses(configs["float32"]))()
  final, approx = jax.jit(lambda: losses(configs["bfloat16"]))()
  assert {leaf.dtype for leaf in jax.tree.leaves(final)} <= {
    jnp.dtype(jnp.float32),
    jnp.dtype(jnp.int32),
  }
  assert np.all(np.isfinite(approx))
  np.testing.assert_allclose(approx, exact, rtol=0.05)
