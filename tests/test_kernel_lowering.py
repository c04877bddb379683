"""Every Pallas kernel lowers for GPU ("cuda": Triton) and TPU ("tpu": Mosaic) from this CPU machine,
at the shapes of its methods' default and paper-scale configs and at odd shapes, through its public
function with the default implementation choice (so the program a GPU/TPU would compile holds the
kernel); each backend's kernel, run by the Pallas interpreter, matches the reference.

What lowering checks and what it cannot (compilation needs the chip) is in `kernels/lowering.py`;
the device tests at the end compile and run each kernel against its reference when a GPU or TPU is
present, and are skipped here with that reason.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import lowering
from kernels.block_cache import pallas as block_cache_pallas
from kernels.block_cache import reference as block_cache_reference
from kernels.block_cache import relative_l1_update
from kernels.ssm_scan import reference as ssm_reference
from kernels.ssm_scan import ssm_scan
from kernels.tree_aggregate import layout as layout_lib
from kernels.tree_aggregate import pallas as tree_pallas
from kernels.tree_aggregate import tree_aggregate, xla
from kernels.tree_aggregate.api import block_rows
from kernels.tree_aggregate.bench import random_tree

spec = jax.ShapeDtypeStruct

# [batch, time, d_state] complex scans of configs/dcd_ssm.py: training (batch_size x train_length) and
# evaluation (eval.batch_size x the longest eval length), default and gpu variants; then odd shapes.
SSM_SHAPES = {
  "dcd_ssm_train": (64, 60, 32),
  "dcd_ssm_eval": (128, 1000, 32),
  "dcd_ssm_gpu_train": (64, 60, 64),
  "dcd_ssm_gpu_eval": (256, 1000, 64),
  "odd": (3, 37, 5),
  "wide_odd": (1, 1000, 130),
}
# [blocks, videos, tokens, hidden] of configs/bwcache.py: default (6 blocks, 16 videos of 8 x 4 x 4
# tokens, hidden 64) and gpu (Latte-XL: 28 blocks, 8 videos of 16 x 16 x 16 tokens, hidden 1152).
BLOCK_CACHE_SHAPES = {
  "bwcache": (6, 16, 128, 64),
  "bwcache_gpu": (28, 8, 4096, 1152),
  "one": (1, 1, 1, 1),
  "odd": (3, 2, 37, 5),
  "odd_tokens": (2, 3, 130, 7),
}
# (trees, nodes, features, per-channel weights) of configs/fgl.py: the default forest (8 trees of the
# 1500-node graph, hidden 64, per-channel weights alpha * lambda), the gpu variant on Cora (2708
# nodes, hidden 256) and PubMed (19717 nodes), the scaling study's largest tree; then odd shapes.
TREE_SHAPES = {
  "fgl": (8, 1500, 64, True),
  "fgl_gpu_cora": (8, 2708, 256, True),
  "fgl_gpu_pubmed": (1, 19717, 256, True),
  "fgl_scaling": (1, 8000, 64, False),
  "odd": (3, 30, 5, True),
  "one_node": (1, 1, 3, False),
}


def _scan_loss(a, b, h0):
  return jnp.sum(jnp.abs(ssm_scan(a, b, h0)))


def _assert_kernel_lowers(fn, platform, *args):
  lowered = lowering.lower(fn, platform, *args)
  assert lowering.kernel_calls(lowered, platform) >= 1, "the kernel is missing from the program"


@pytest.mark.parametrize("platform", lowering.PLATFORMS)
@pytest.mark.parametrize("name", SSM_SHAPES)
def test_ssm_scan_and_its_gradient_lower(name, platform):
  batch, time, dim = SSM_SHAPES[name]
  dtype = jnp.float32 if name == "odd" else jnp.complex64
  a, h0 = spec((batch, time, dim), dtype), spec((batch, dim), dtype)
  fn = _scan_loss if "eval" in name else jax.value_and_grad(_scan_loss, argnums=(0, 1, 2))
  _assert_kernel_lowers(fn, platform, a, a, h0)


@pytest.mark.parametrize("platform", lowering.PLATFORMS)
@pytest.mark.parametrize("name", BLOCK_CACHE_SHAPES)
def test_block_cache_lowers(name, platform):
  x = spec(BLOCK_CACHE_SHAPES[name], jnp.bfloat16 if name == "odd" else jnp.float32)
  _assert_kernel_lowers(relative_l1_update, platform, x, x)


@pytest.mark.parametrize("platform", lowering.PLATFORMS)
@pytest.mark.parametrize("name", TREE_SHAPES)
def test_tree_aggregate_and_its_gradient_lower(name, platform):
  trees, n, f, per_channel = TREE_SHAPES[name]
  aggregate = jax.vmap(
    lambda x, p, w: tree_aggregate(
      x, p, w, 0.5 * w, normalize=name == "odd", implementation="pallas"
    )
  )
  fn = jax.grad(lambda x, p, w: jnp.sum(aggregate(x, p, w)), argnums=(0, 2))
  weight = spec((trees, n, f) if per_channel else (trees, n), jnp.float32)
  _assert_kernel_lowers(
    fn, platform, spec((trees, n, f), jnp.float32), spec((trees, n), jnp.int32), weight
  )


def test_under_a_mesh_context_each_kernel_runs_per_device_on_four():
  """With operands split over a 4-device data axis and the mesh as the trace context (as under
  `jax.set_mesh`), each kernel is wrapped in a shard_map and lowers for both platforms."""
  for platform in lowering.PLATFORMS:
    mesh = lowering.abstract_mesh((4,), ("data",), platform)
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

    def sharded(shape, dtype, split=split):
      return spec(shape, dtype, sharding=split)

    scan = sharded((8, 60, 32), jnp.complex64), sharded((8, 32), jnp.complex64)
    tree = [sharded(s, d) for s, d in (((8, 40, 6), jnp.float32), ((8, 40), jnp.int32))]
    cases = [
      (jax.value_and_grad(_scan_loss, argnums=(0, 1, 2)), (scan[0], scan[0], scan[1])),
      (relative_l1_update, (sharded((4, 2, 16, 8), jnp.float32),) * 2),
      (jax.vmap(lambda x, p: tree_aggregate(x, p, 0.5 * x, implementation="pallas")), tree),
    ]
    for fn, args in cases:
      lowered = lowering.lower(fn, platform, *args, mesh=mesh, trace_in_mesh=True)
      assert "shard_map" in lowered.as_text() or "manual" in lowered.as_text()
      assert lowering.kernel_calls(lowered, platform) >= 1


def test_cpu_programs_keep_the_reference():
  """Lowered for CPU, the default choice is the XLA reference: no kernel and no interpreter loop."""
  a = jnp.ones((2, 9, 3), jnp.complex64)
  text = jax.jit(lambda a: ssm_scan(a, a)).lower(a).as_text()
  assert "tpu_custom_call" not in text and "triton" not in text


# ---------------------------------------------------------------------------------------------------
# Each backend's kernel in the interpreter (the default interpreter runs the TPU schedule for the
# scan and the cache, the GPU one for the tree; `tests/test_ssm_scan.py` covers the scan's GPU one).
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 130, 7)])
def test_gpu_view_of_the_block_cache_matches_the_reference(shape):
  k1, k2 = jax.random.split(jax.random.key(sum(shape)))
  current, previous = jax.random.normal(k1, shape), jax.random.normal(k2, shape)
  layout = block_cache_pallas.gpu_layout(shape, current.dtype, tile_rows=8)
  indicator, stored = block_cache_pallas.fused_update(
    current, previous, layout=layout, target="interpret"
  )
  expected, _ = block_cache_reference.relative_l1_update(current, previous)
  np.testing.assert_allclose(indicator, expected, rtol=1e-5)
  np.testing.assert_array_equal(stored, current)


def _tree_rows(n: int, f: int, seed: int, per_channel: bool):
  """Two random trees of n nodes in BFS rows: the arguments of `pallas_two_pass`."""
  rng = np.random.default_rng(seed)
  block = block_rows(n, "pallas")
  rows = layout_lib.num_rows(n, block)
  trees = [layout_lib.tree_layout(jnp.asarray(random_tree(n, rng)), block) for _ in range(2)]
  channels = f if per_channel else 1
  x = jnp.stack([layout_lib.to_rows(jnp.asarray(rng.normal(size=(n, f))), t, rows) for t in trees])
  weights = [
    jnp.stack(
      [
        layout_lib.to_rows(jnp.asarray(rng.uniform(0.2, 1.1, (n, channels))), t, rows)
        for t in trees
      ]
    )
    for _ in range(2)
  ]
  is_root = jnp.stack([t.parent_row[:n] == rows - 1 for t in trees])
  weights = [w.at[:, :n].set(jnp.where(is_root[..., None], 0.0, w[:, :n])) for w in weights]
  stacked = [jnp.stack([getattr(t, name) for t in trees]) for name in ("parent_row", "level_ptr")]
  levels = jnp.stack([t.num_levels for t in trees])
  return (x.astype(jnp.float32), *(w.astype(jnp.float32) for w in weights), *stacked, levels), block


@pytest.mark.parametrize(
  "n, f, per_channel", [(30, 5, True), pytest.param(257, 4, False, marks=pytest.mark.slow)]
)
def test_tpu_row_kernel_of_the_tree_matches_the_level_sweep(n, f, per_channel):
  args, block = _tree_rows(n, f, seed=n, per_channel=per_channel)
  row = functools.partial(tree_pallas.pallas_two_pass, block=block, interpret=True, kernel="row")
  expected = xla.levels_two_pass(*args, block=block)
  for got, want in zip(row(*args), expected, strict=True):
    np.testing.assert_allclose(got[:, :n], want[:, :n], rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------------------------
# On a GPU or TPU: the compiled kernels against their references.
# ---------------------------------------------------------------------------------------------------

needs_device = pytest.mark.skipif(
  jax.default_backend() == "cpu",
  reason="compiling a kernel (Mosaic's layout passes, Triton's PTX, the VMEM and register fit) needs "
  "the GPU or TPU itself; on CPU the tests above lower every kernel for both and check its "
  "schedules in the interpreter",
)


@needs_device
def test_compiled_ssm_scan_matches_the_sequential_reference():
  rng = np.random.default_rng(0)
  a = jnp.asarray(0.99 * np.exp(1j * rng.uniform(-3, 3, (4, 300, 130))), jnp.complex64)
  b = jnp.asarray(rng.normal(size=(4, 300, 130)), jnp.complex64)
  h0 = jnp.asarray(rng.normal(size=(4, 130)), jnp.complex64)
  got = jax.jit(lambda *x: ssm_scan(*x, implementation="pallas"))(a, b, h0)
  np.testing.assert_allclose(got, ssm_reference.sequential_scan(a, b, h0), atol=1e-4, rtol=1e-4)


@needs_device
def test_compiled_block_cache_matches_the_reference():
  current, previous = jax.random.normal(jax.random.key(0), (2, 6, 3, 130, 7))
  got, stored = jax.jit(relative_l1_update)(current, previous)
  expected, _ = block_cache_reference.relative_l1_update(current, previous)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  np.testing.assert_array_equal(stored, current)


@needs_device
def test_compiled_tree_aggregate_matches_the_level_sweep():
  args, block = _tree_rows(257, 20, seed=1, per_channel=True)
  got = jax.jit(functools.partial(tree_pallas.pallas_two_pass, block=block))(*args)
  for actual, wanted in zip(got, xla.levels_two_pass(*args, block=block), strict=True):
    np.testing.assert_allclose(actual[:, :257], wanted[:, :257], rtol=1e-4, atol=1e-4)
