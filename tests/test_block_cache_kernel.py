"""kernels/block_cache: the fused Pallas indicator/update (interpret mode on CPU) against the reference."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.block_cache import api, pallas, reference

SHAPES = [(1, 1, 1, 1), (3, 2, 37, 5), (6, 4, 128, 64), (2, 3, 130, 7), (4, 1, 257, 16)]


@pytest.mark.parametrize("shape", SHAPES)
def test_pallas_matches_reference(shape):
  k1, k2 = jax.random.split(jax.random.key(sum(shape)))
  current, previous = jax.random.normal(k1, shape), jax.random.normal(k2, shape)
  indicator, stored = api.relative_l1_update(current, previous, implementation="pallas")
  want_indicator, want_stored = reference.relative_l1_update(current, previous)
  chex.assert_shape(indicator, (shape[0],))
  chex.assert_trees_all_close(indicator, want_indicator, rtol=1e-5)
  np.testing.assert_array_equal(stored, current)
  np.testing.assert_array_equal(want_stored, current)


def test_reference_matches_numpy_and_small_tiles():
  rng = np.random.default_rng(0)
  current, previous = rng.normal(size=(2, 3, 9, 4)), rng.normal(size=(2, 3, 9, 4))
  expected = np.abs(current - previous).sum(axis=(1, 2, 3)) / np.abs(previous).sum(axis=(1, 2, 3))
  got, _ = reference.relative_l1_update(jnp.asarray(current), jnp.asarray(previous))
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  tiled, _ = pallas.relative_l1_update(
    jnp.asarray(current), jnp.asarray(previous), tile_rows=8, interpret=True
  )
  np.testing.assert_allclose(tiled, expected, rtol=1e-5)


def test_zero_previous_gives_inf_and_bad_input_is_named():
  indicator, _ = api.relative_l1_update(
    jnp.ones((2, 1, 3, 4)), jnp.zeros((2, 1, 3, 4)), implementation="pallas"
  )
  assert np.all(np.isinf(indicator))
  with pytest.raises(ValueError, match=r"\[blocks, batch, tokens, dim\]"):
    api.relative_l1_update(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4)))
  with pytest.raises(ValueError, match="implementation must be one of"):
    api.relative_l1_update(jnp.ones((1, 1, 1, 1)), jnp.ones((1, 1, 1, 1)), implementation="cuda")


def test_default_implementation_on_cpu_is_the_reference():
  x = jax.random.normal(jax.random.key(1), (2, 2, 5, 3))
  chex.assert_trees_all_close(
    api.relative_l1_update(x, x + 1.0), reference.relative_l1_update(x, x + 1.0)
  )
