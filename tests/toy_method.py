"""A tiny two-phase method for testing the loop: least squares, then a second phase reading the first.

Config fields `nan_at_step` and `bad_batch_at_step` inject faults.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from configs import common
from core.data import batching
from methods.base import Method, Phase


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(
    {
      "method": "toy",
      "seed": 0,
      "batch_size": 8,
      "steps": 12,
      "learning_rate": 0.1,
      "nan_at_step": -1,
      "bad_batch_at_step": -1,
      "loop": common.loop_config(log_every=2, checkpoint_every=4),
    }
  )


class _Source:
  def __init__(self, config):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5], np.float32)
    self.inner = batching.from_arrays({"x": x, "y": y}, config.batch_size, config.seed)
    self.global_batch_size = config.batch_size
    self.bad_at = config.bad_batch_at_step

  def batch(self, step, process_index=0, process_count=1):
    batch = self.inner.batch(step, process_index, process_count)
    if step == self.bad_at:
      batch["x"] = batch["x"].copy()
      batch["x"][0, 0] = np.nan
    return batch


def _phases(config):
  def step(state, batch, rng):
    del rng
    loss_fn = lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2)
    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    w = state["w"] - config.learning_rate * grad
    loss = jnp.where(state["step"] + 1 == config.nan_at_step, jnp.nan, loss)
    return {"w": w, "step": state["step"] + 1}, {"loss": loss}

  fit = Phase(
    name="fit",
    num_steps=config.steps,
    init=lambda rng, inputs: {"w": jax.random.normal(rng, (3,)), "step": jnp.zeros((), jnp.int32)},
    step=step,
    data=lambda inputs: _Source(config),
    evaluate=lambda state, rng, inputs: {
      "w_error": float(jnp.linalg.norm(state["w"] - jnp.array([1.0, -2.0, 0.5])))
    },
    outputs=lambda state, inputs: state["w"],
  )
  check = Phase(
    name="check",
    num_steps=0,
    init=lambda rng, inputs: {"w": inputs["fit"]},
    evaluate=lambda state, rng, inputs: {
      "w_norm": float(jnp.linalg.norm(state["w"])),
      "w_abs": jnp.abs(state["w"]),  # an array result: results.json only
    },
  )
  return [fit, check]


METHOD = Method(name="toy", phases=_phases)
