"""A tiny method for testing how runs stop: a training phase, an evaluation in chunks, an evaluation
in one long call, and a study of two arms. Each part's length is a config field, so a test can make
the phase it signals long and the others instant.

Run in a subprocess by `tests/test_stopping.py` through `STOP_SCRIPT` (registers the method, then
runs `experiments/train.py` or `experiments/study.py` with the given flags).
"""

import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from configs import common
from methods.base import EvaluationChunks, Method, Phase, Report, with_changes


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(
    {
      "method": "stopper",
      "seed": 0,
      "steps": 4,  # training steps
      "step_seconds": 0.0,  # host sleep per step (a slow training phase)
      "num_chunks": 3,  # chunks of the evaluate-only phase
      "chunk_seconds": 0.0,  # host sleep per chunk (a slow chunked evaluation)
      "blocking_seconds": 0.0,  # one evaluation call this long (the backstop's case); 0 = no phase
      "loop": common.loop_config(log_every=1, checkpoint_every=1000),
    }
  )


def _phases(config):
  def step(state, batch, rng):
    del batch
    noise = jax.random.normal(rng, (4,))
    w = state["w"] - 0.1 * (state["w"] - noise)
    return {"w": w}, {"loss": jnp.sum(w**2)}

  class _Slow:
    """No data, but a host pause before each step: `data` is read once per step."""

    global_batch_size = 4  # divisible by the test suite's 4 CPU devices

    def batch(self, step, process_index=0, process_count=1):
      time.sleep(config.step_seconds)
      return {"t": np.full((4,), step, np.float32)}

  train = Phase(
    name="train",
    num_steps=config.steps,
    init=lambda rng, inputs: {"w": jax.random.normal(rng, (4,))},
    step=step,
    data=lambda inputs: _Slow(),
    evaluate=lambda state, rng, inputs: {"w_sum": float(jnp.sum(state["w"]))},
    outputs=lambda state, inputs: state["w"],
  )

  def chunk(w, rng, index: int) -> dict:
    time.sleep(config.chunk_seconds)
    draw = jax.random.normal(jax.random.fold_in(rng, index), (8,))
    return {f"c{index}_value": float(jnp.dot(draw[:4], w) + draw[4:].sum())}

  def chunked(state, rng, inputs):
    names = [f"part{i}" for i in range(config.num_chunks)]
    return EvaluationChunks(
      names=names,
      run=lambda name: chunk(state["w"], rng, names.index(name)),
      combine=lambda done: {
        "chunk_total": sum(v for name in names for v in done[name].values()),
        **{k: v for name in names for k, v in done[name].items()},
      },
    )

  evaluate = Phase(
    name="evaluate",
    num_steps=0,
    init=lambda rng, inputs: {"w": inputs["train"]},
    evaluate=chunked,
  )
  out = [train, evaluate]
  if config.blocking_seconds:

    def blocking(state, rng, inputs):
      time.sleep(config.blocking_seconds)
      return {"blocked": 1.0}

    out.append(Phase(name="blocking", num_steps=0, init=evaluate.init, evaluate=blocking))
  return out


def _arms(config):
  return [("first", config), ("second", with_changes(config, seed=1))]


def _report(config, results):
  return Report(rows=[{"arm": name, **r} for name, r in results.items()])


METHOD = Method(name="stopper", phases=_phases, study_arms=_arms, report=_report)
