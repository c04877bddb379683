"""The shared optimisers: the schedule's warmup cap and Adam(W) after clipping."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core import optim


def test_warmup_cosine_caps_warmup_at_half_the_run():
  schedule = optim.warmup_cosine(1.0, warmup_steps=100, total_steps=40, end_value=0.1)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(20), 1.0)  # peak at half the run, not at step 100
  np.testing.assert_allclose(schedule(40), 0.1, rtol=1e-6)
  assert float(schedule(10)) == pytest.approx(0.5)


def test_zero_steps_gives_a_valid_schedule():
  assert np.isfinite(float(optim.warmup_cosine(1e-3, 10, 0)(0)))


@pytest.mark.parametrize("weight_decay", [None, 0.1])
def test_clipped_adam_equals_the_optax_chain(weight_decay):
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  grads = jax.tree.map(lambda x: 10.0 * jnp.cos(x), params)
  adam = (
    optax.adam(1e-2, b2=0.95)
    if weight_decay is None
    else optax.adamw(1e-2, b2=0.95, weight_decay=weight_decay)
  )
  expected_opt = optax.chain(optax.clip_by_global_norm(1.0), adam)
  opt = optim.clipped_adam(1e-2, grad_clip=1.0, weight_decay=weight_decay, b2=0.95)
  updates, _ = opt.update(grads, opt.init(params), params)
  expected, _ = expected_opt.update(grads, expected_opt.init(params), params)
  chex.assert_trees_all_close(updates, expected)


def test_no_clipping_is_plain_adam():
  params = {"w": jnp.ones(3)}
  grads = {"w": jnp.array([100.0, -3.0, 0.5])}
  opt = optim.clipped_adam(1e-3, grad_clip=None)
  updates, _ = opt.update(grads, opt.init(params), params)
  expected, _ = optax.adam(1e-3).update(grads, optax.adam(1e-3).init(params), params)
  chex.assert_trees_all_close(updates, expected)
