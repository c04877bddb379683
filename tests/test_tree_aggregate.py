"""The tree aggregator against the dense O(n^2) path-product reference: every implementation,
random trees (random roots, shuffled node orders), both weight directions, values and gradients,
normalisation, per-channel weights, forests, vmap over padded trees, and argument errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.tree_aggregate import IMPLEMENTATIONS, reference, tree_aggregate
from kernels.tree_aggregate.bench import random_tree
from kernels.tree_aggregate.layout import tree_layout


def _case(n: int, f: int, seed: int, per_channel: bool):
  rng = np.random.default_rng(seed)
  parent = random_tree(n, rng)
  shape = (n, f) if per_channel else (n,)
  return (
    parent,
    rng.normal(size=(n, f)).astype(np.float32),
    rng.uniform(0.2, 1.1, shape).astype(np.float32),
    rng.uniform(0.2, 1.1, shape).astype(np.float32),
    rng.normal(size=(n, f)).astype(np.float32),
  )


def _outputs(aggregate, x, up, down, cotangent):
  """y and the vector-Jacobian product with `cotangent` in x, up and down (down=None: symmetric)."""
  if down is None:
    y, vjp = jax.vjp(lambda x, u: aggregate(x, u, None), x, up)
  else:
    y, vjp = jax.vjp(aggregate, x, up, down)
  return y, vjp(cotangent)


@functools.cache
def _reference(n: int, seed: int, per_channel: bool, directed: bool, normalize: bool):
  parent, x, up, down, cotangent = _case(n, 4, seed, per_channel)
  down = down if directed else None
  aggregate = lambda x, u, d: reference.tree_aggregate_reference(
    x, parent, u, d, normalize=normalize
  )
  return jax.jit(lambda x, u, d: _outputs(aggregate, x, u, d, cotangent))(x, up, down)


def _check(implementation, n, seed, per_channel, directed, normalize):
  parent, x, up, down, cotangent = _case(n, 4, seed, per_channel)
  down = down if directed else None

  def aggregate(x, u, d, p):
    return tree_aggregate(x, p, u, d, normalize=normalize, implementation=implementation)

  got = jax.jit(
    lambda x, u, d, p: _outputs(lambda x, u, d: aggregate(x, u, d, p), x, u, d, cotangent)
  )(x, up, down, jnp.asarray(parent))
  expected = _reference(n, seed, per_channel, directed, normalize)
  for actual, wanted in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    _assert_close(actual, wanted)


def _assert_close(actual, expected, tol=2e-4):
  actual, expected = np.asarray(actual), np.asarray(expected)
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(actual, expected, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize(
  "n", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(30, marks=pytest.mark.slow), 257]
)
def test_directed_weights_values_and_gradients_match_the_dense_reference(implementation, n):
  """w_up != w_down, one weight per edge: y and the gradients in x, w_up, w_down."""
  _check(implementation, n, seed=n, per_channel=False, directed=True, normalize=False)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("n", [pytest.param(30, marks=pytest.mark.slow), 257])
def test_symmetric_per_channel_weights_with_normalisation(implementation, n):
  """weight_down=None (the same weight both ways), one weight per edge and channel, normalize."""
  _check(implementation, n, seed=100 + n, per_channel=True, directed=False, normalize=True)


def test_reference_is_the_path_product():
  """On a path 0 - 1 - 2 rooted at 1: y[2] gets x[0] through w_up[0] * w_down[2], and so on."""
  parent = np.array([1, -1, 1])
  up, down = np.array([2.0, 9.0, 3.0]), np.array([5.0, 9.0, 7.0])
  p = np.asarray(reference.path_product_matrix(parent, up, down))[..., 0]
  expected = np.array([[1, 5, 5 * 3], [2, 1, 3], [2 * 7, 7, 1]], np.float64)
  np.testing.assert_allclose(p, expected)


@pytest.mark.parametrize(
  "implementation",
  [i if i == "xla" else pytest.param(i, marks=pytest.mark.slow) for i in IMPLEMENTATIONS],
)
def test_vmap_over_padded_trees_and_forests(implementation):
  """A batch of trees of sizes 1..13 padded to 13 with extra roots; gradients through the vmap."""
  rng = np.random.default_rng(7)
  sizes, n, f = [1, 2, 5, 13], 13, 3
  parents = np.full((len(sizes), n), -1, np.int32)
  x = np.zeros((len(sizes), n, f), np.float32)
  up = np.zeros((len(sizes), n), np.float32)
  for k, m in enumerate(sizes):
    parents[k, :m] = random_tree(m, rng)
    x[k, :m] = rng.normal(size=(m, f))
    up[k, :m] = rng.uniform(0.2, 1.0, m)
  batched = jax.jit(
    jax.vmap(lambda x, p, w: tree_aggregate(x, p, w, 0.5 * w, implementation=implementation))
  )
  y = batched(x, parents, up)
  grad = jax.grad(lambda x: jnp.sum(batched(x, parents, up) ** 2))(x)
  for k, m in enumerate(sizes):
    dense = functools.partial(
      reference.tree_aggregate_reference,
      parent=parents[k, :m],
      weight_up=up[k, :m],
      weight_down=0.5 * up[k, :m],
    )
    value, vjp = jax.jit(lambda xk, dense=dense: jax.vjp(dense, xk))(x[k, :m])
    _assert_close(y[k, :m], value)
    np.testing.assert_array_equal(np.asarray(y[k, m:]), 0.0)
    _assert_close(grad[k, :m], vjp(2 * value)[0])


@pytest.mark.slow
def test_forest_is_the_sum_of_its_trees():
  """Two trees in one parent array do not interact."""
  rng = np.random.default_rng(3)
  a, b = random_tree(6, rng), random_tree(5, rng)
  parent = np.concatenate([a, np.where(b >= 0, b + 6, -1)])
  x = rng.normal(size=(11, 2)).astype(np.float32)
  w = rng.uniform(0.3, 1.0, 11).astype(np.float32)
  y = tree_aggregate(x, parent, w)
  _assert_close(y[:6], reference.tree_aggregate_reference(x[:6], a, w[:6]))
  _assert_close(y[6:], reference.tree_aggregate_reference(x[6:], b, w[6:]))


def test_layout_sorts_parents_before_children_and_counts_levels():
  rng = np.random.default_rng(5)
  parent = random_tree(100, rng)
  layout = tree_layout(jnp.asarray(parent), block=8)
  order, position = np.asarray(layout.order), np.asarray(layout.position)
  children = np.flatnonzero(parent >= 0)
  assert np.all(position[parent[children]] < position[children])
  np.testing.assert_array_equal(order[position], np.arange(100))
  depth = np.zeros(100, int)
  for v in order:
    depth[v] = 0 if parent[v] < 0 else depth[parent[v]] + 1
  level_ptr = np.asarray(layout.level_ptr)
  assert int(layout.num_levels) == depth.max() + 1
  for d in range(depth.max() + 1):
    assert np.all(depth[order[level_ptr[d] : level_ptr[d + 1]]] == d)


@pytest.mark.parametrize(
  "args, message",
  [
    ((np.zeros(4), np.array([-1, 0, 0, 1]), np.ones(4)), r"x: expected \[n, f\]"),
    ((np.zeros((4, 2)), np.array([-1, 0, 0]), np.ones(4)), r"parent: expected shape \(4,\)"),
    ((np.zeros((4, 2)), np.array([-1.0, 0, 0, 1]), np.ones(4)), "parent: expected an integer"),
    ((np.zeros((4, 2)), np.array([-1, 0, 0, 1]), np.ones(3)), "weight_up: expected shape"),
    ((np.zeros((4, 2)), np.array([-1, 0, 0, 7]), np.ones(4)), r"parent: entries must be -1"),
    (
      (np.zeros((4, 2)), np.array([-1, 2, 1, 0]), np.ones(4)),
      "parent: node 1 never reaches a root",
    ),
    ((np.zeros((4, 2), np.int32), np.array([-1, 0, 0, 1]), np.ones(4)), "x: expected a float"),
  ],
)
def test_bad_arguments_are_named(args, message):
  with pytest.raises(ValueError, match=message):
    tree_aggregate(*args)


def test_bad_weight_down_and_implementation_are_named():
  x, parent = np.zeros((3, 2), np.float32), np.array([-1, 0, 1])
  with pytest.raises(ValueError, match="weight_down: shape"):
    tree_aggregate(x, parent, np.ones(3), np.ones((3, 2)))
  with pytest.raises(ValueError, match="implementation: must be one of"):
    tree_aggregate(x, parent, np.ones(3), implementation="triton")


def test_inside_jit_parent_is_data():
  """With a traced parent only shapes are checked; the same compiled function serves two trees."""
  rng = np.random.default_rng(11)
  fn = jax.jit(functools.partial(tree_aggregate, implementation="xla"))
  x, w = rng.normal(size=(20, 3)).astype(np.float32), rng.uniform(0.2, 1, 20).astype(np.float32)
  for _ in range(2):
    parent = random_tree(20, rng)
    _assert_close(fn(x, parent, w), reference.tree_aggregate_reference(x, parent, w))
